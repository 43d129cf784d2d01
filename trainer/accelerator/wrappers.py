"""Thin wrappers `prepare` puts around optimizers, schedulers and model forwards."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import torch

# whether a torch.profiler (or emit_nvtx / emit_itt) records; a torch without the check counts as always recording
_profiler_enabled = getattr(torch.autograd, "_profiler_enabled", lambda: True)
_TORCH_ZERO_GRAD = torch.optim.Optimizer.zero_grad
# the code of the wrapper torch puts around each optimizer class's `step` (Optimizer.profile_hook_step), and what it
# runs around the step: hooks registered for every optimizer, and a no-op the profiler's Python tracer hooks into
# (a torch without them: no step is recognised as wrapped only by torch, so `step_optimizer` calls ``step()``)
_TORCH_STEP_WRAPPER_CODE = (torch.optim.Optimizer.profile_hook_step(lambda: None).__code__
                            if hasattr(torch.optim.Optimizer, "profile_hook_step") else object())
_torch_optimizer = importlib.import_module("torch.optim.optimizer")
_GLOBAL_STEP_HOOKS = (getattr(_torch_optimizer, "_global_optimizer_pre_hooks", {None: None}),
                      getattr(_torch_optimizer, "_global_optimizer_post_hooks", {None: None}))
_TORCH_STEP_CODE_HOOK = getattr(torch.optim.Optimizer, "_optimizer_step_code", None)


def zero_grad_to_none(optimizer: Any) -> None:
    """``optimizer.zero_grad(set_to_none=True)``, without torch's per-call overhead where nothing can see the difference.

    Torch's method sets each parameter's gradient to None inside a ``record_function`` label and a compiler
    guard, which cost about 9 µs per call (on a 2-core CPU machine; as much as a tiny model's forward) and are seen
    only by a ``torch.profiler`` trace. So for an optimizer whose class keeps torch's method (every ``torch.optim``
    optimizer) this sets the gradients to None itself, as that method does, unless a profiler is recording: then,
    and for any optimizer defining its own ``zero_grad`` (DeepSpeed's, a user's), the method runs.
    """
    if type(optimizer).zero_grad is not _TORCH_ZERO_GRAD or "zero_grad" in vars(optimizer) or _profiler_enabled():
        optimizer.zero_grad(set_to_none=True)
        return
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is not None:
                p.grad = None


def step_optimizer(optimizer: Any) -> None:
    """``optimizer.step()``, without torch's per-call overhead where nothing can see the difference.

    Torch wraps every optimizer class's ``step`` in a function that opens a ``record_function`` label, runs the step
    hooks registered on the optimizer or for all optimizers, steps, and calls a no-op the profiler's Python tracer
    hooks into. With no hook registered, that wrapper costs about 9 µs per call (on a 2-core CPU machine; 21 µs for an
    SGD step of a 3-layer MLP against 12 µs for the step itself), and only a ``torch.profiler`` trace sees it. So when
    no profiler is recording and no step hook is registered, this calls the step the wrapper wraps, which changes the
    weights exactly as ``optimizer.step()`` does. Anything else (a step defined or patched past torch's wrapper, a
    subclass's own ``_optimizer_step_code``) goes through ``optimizer.step()``; a learning-rate scheduler's
    instance wrapper, which only notes that the optimizer stepped, is honoured by noting it here.
    """
    cls = type(optimizer)
    wrapper = cls.step
    own = vars(optimizer).get("step")  # an instance's own step: torch's LRScheduler puts one there
    scheduler_wrapper = own is not None and getattr(own, "_wrapped_by_lr_sched", False) and getattr(own, "__wrapped__", None) is wrapper
    if (getattr(wrapper, "__code__", None) is not _TORCH_STEP_WRAPPER_CODE  # a step defined or patched past torch's wrapper
            or cls._optimizer_step_code is not _TORCH_STEP_CODE_HOOK or (own is not None and not scheduler_wrapper)
            or _profiler_enabled() or _GLOBAL_STEP_HOOKS[0] or _GLOBAL_STEP_HOOKS[1]
            or getattr(optimizer, "_optimizer_step_pre_hooks", True) or getattr(optimizer, "_optimizer_step_post_hooks", True)):
        optimizer.step()
        return
    if scheduler_wrapper:  # all it does before calling the class's step
        optimizer._opt_called = True
    wrapper.__wrapped__(optimizer)


class PreparedOptimizer(torch.optim.Optimizer):
    """Steps and zeroes only on gradient-accumulation boundaries; records fp16 skipped steps.

    It is an `Optimizer` (so schedulers can be built on it) that forwards everything to the wrapped one.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, accelerator: Any, original: torch.optim.Optimizer | None = None) -> None:
        self.optimizer = optimizer
        self.original = optimizer if original is None else original  # what the user passed (an engine may wrap it)
        self.accelerator = accelerator
        self.step_was_skipped = False

    def steps(self, optimizer: Any) -> bool:
        """Whether `optimizer` (as a scheduler holds it) is this one, the one it wraps, or the one the user passed."""
        return optimizer is self or optimizer is self.optimizer or optimizer is self.original

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.optimizer.state

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    @param_groups.setter
    def param_groups(self, value: list[dict[str, Any]]) -> None:
        self.optimizer.param_groups = value

    @property
    def defaults(self) -> dict[str, Any]:  # type: ignore[override]
        return self.optimizer.defaults

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        self.optimizer.add_param_group(param_group)

    def step(self, closure: Callable[[], Any] | None = None) -> None:  # type: ignore[override]
        accelerator = self.accelerator
        if not accelerator.sync_gradients:
            return
        if closure is None and accelerator._plain_steps:  # what the strategy would do, without its two layers of calls
            step_optimizer(self.optimizer)
            self.step_was_skipped = False
            return
        strategy = accelerator.strategy
        stepped = strategy.optimizer_step(self.optimizer) if closure is None else strategy.optimizer_step(self.optimizer, closure=closure)
        self.step_was_skipped = not stepped

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self.accelerator.sync_gradients:
            if set_to_none:
                zero_grad_to_none(self.optimizer)
            else:
                self.optimizer.zero_grad(set_to_none=False)

    def state_dict(self) -> dict[str, Any]:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state_dict)

    def train(self) -> None:
        if hasattr(self.optimizer, "train"):
            self.optimizer.train()

    def eval(self) -> None:
        if hasattr(self.optimizer, "eval"):
            self.optimizer.eval()

    def __getstate__(self) -> dict[str, Any]:
        return self.__dict__

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return f"PreparedOptimizer({self.optimizer!r})"


class PreparedScheduler:
    """Steps the wrapped scheduler only when its optimizers really stepped (Accelerate's semantics).

    Without ``split_batches`` each optimizer step advances the schedule ``num_processes`` times, as in
    Accelerate, so a schedule written for one process ends at the same point of the data.
    """

    def __init__(self, scheduler: Any, accelerator: Any, optimizers: list[PreparedOptimizer]) -> None:
        self.scheduler = scheduler
        self.accelerator = accelerator
        self.optimizers = optimizers

    def step(self, *args: Any, **kwargs: Any) -> None:
        acc = self.accelerator
        if not acc.step_scheduler_with_optimizer:
            self.scheduler.step(*args, **kwargs)
            return
        if not acc.sync_gradients:
            if acc.gradient_plugin.adjust_scheduler and hasattr(self.scheduler, "_step_count"):
                self.scheduler._step_count += 1
            return
        if any(opt.step_was_skipped for opt in self.optimizers):
            return
        # an engine strategy (DeepSpeed) steps the schedule once per optimizer step, as Accelerate's engine does
        for _ in range(1 if acc.split_batches or acc.strategy.steps_in_backward else acc.num_processes):
            total = getattr(self.scheduler, "total_steps", None)
            if total is None or self.scheduler._step_count <= total:
                self.scheduler.step(*args, **kwargs)

    def get_last_lr(self) -> list[float]:
        lrs: list[float] = self.scheduler.get_last_lr()
        return lrs

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = self.scheduler.state_dict()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict)

    def __getattr__(self, name: str) -> Any:
        if name == "scheduler":
            raise AttributeError(name)
        return getattr(self.scheduler, name)

