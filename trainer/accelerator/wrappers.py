"""Thin wrappers `prepare` puts around optimizers, schedulers and model forwards."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from trainer.accelerator.accelerator import Accelerator


class PreparedOptimizer(torch.optim.Optimizer):
    """Steps and zeroes only on gradient-accumulation boundaries (through the accelerator's `Stepper`); records
    fp16 skipped steps.

    It is an `Optimizer` (so schedulers can be built on it) that forwards everything to the wrapped one.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, accelerator: Accelerator, original: torch.optim.Optimizer | None = None) -> None:
        self.optimizer = optimizer
        self.original = optimizer if original is None else original  # what the user passed (an engine may wrap it)
        self.accelerator = accelerator
        self.stepper = accelerator.stepper
        self.step_was_skipped = False

    def steps(self, optimizer: object) -> bool:
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
        stepper = self.stepper
        if stepper.sync_gradients:
            self.step_was_skipped = not (stepper.optimizer_step(self.optimizer) if closure is None else stepper.optimizer_step(self.optimizer, closure))

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self.stepper.sync_gradients:
            self.stepper.zero_grad(self.optimizer, set_to_none)

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

    def __init__(self, scheduler: Any, accelerator: Accelerator, optimizers: list[PreparedOptimizer]) -> None:
        self.scheduler = scheduler
        self.accelerator = accelerator
        self.optimizers = optimizers

    def step(self, *args: Any, **kwargs: Any) -> None:
        acc = self.accelerator
        if not acc.step_scheduler_with_optimizer:
            self.scheduler.step(*args, **kwargs)
            return
        stepper = acc.stepper
        if not stepper.sync_gradients:
            if stepper.accumulation.adjust_scheduler and hasattr(self.scheduler, "_step_count"):
                self.scheduler._step_count += 1
            return
        if any(opt.step_was_skipped for opt in self.optimizers):
            return
        for _ in range(stepper.schedulers_per_step(acc.split_batches, acc.num_processes)):
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

