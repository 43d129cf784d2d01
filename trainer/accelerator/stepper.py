"""`Stepper`: the one training step both faces drive.

    boundary = stepper.advance(end_of_data)        # Accelerator face: accumulate() counts the batches (Accelerate's
                                                   # GradientState); the Trainer: stepper.at_position(position, last)
    with stepper.sync_context(models):             # no gradient reduction inside an accumulation window
        loss = ...
        stepper.backward(loss)                     # divided by the accumulation steps, scaled (fp16)
    if boundary:
        stepper.unscale(optimizers)                # once per step, before clipping
        stepper.clip_grad_norm_(params, max_norm)
        stepper.optimizer_step(optimizer)          # False when fp16 loss scaling skipped it
        stepper.zero_grad(optimizer)
        schedulers step when stepper.scheduler_due()

`accumulate()`/`backward()`/`clip_grad_norm_()` of the `Accelerator`, its prepared optimizer
(`trainer.accelerator.wrappers.PreparedOptimizer`) and the Trainer's batch (`trainer.fit.batch.TrainBatch`) all call
these methods; none of them decides a boundary, reduces gradients or steps an optimizer itself.

The cheap path is decided here, once, when the step is configured: where the strategy and its precision would only
call ``loss.backward()`` and ``optimizer.step()`` (`Strategy.plain_steps`: no loss scaler, neither method overridden),
the stepper calls torch directly (`strategies.optim.step_optimizer`, without torch's per-call labels), two layers of
calls less per step; any other strategy or precision gets every call. Anchors: Lightning Fabric's
``Strategy.backward``/``optimizer_step`` composed with its ``Precision``, and Accelerate's ``GradientState``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from strategies.abilities import Engine
from strategies.optim import step_optimizer, zero_grad_to_none
from trainer.accelerator.config import GradientAccumulationPlugin

if TYPE_CHECKING:
    from strategies.base import Strategy


class Stepper:
    """Accumulation boundary, gradient sync, backward, unscale, clip, optimizer step, zero_grad, scheduler timing.

    Args:
        strategy: does the distributed and precision work of each call.
        accumulation: batches per optimizer step and how boundaries are counted (`GradientAccumulationPlugin`).
    """

    def __init__(self, strategy: Strategy, accumulation: GradientAccumulationPlugin) -> None:
        self.strategy = strategy
        self.accumulation = accumulation
        self.accumulation_steps = accumulation.num_steps
        self.sync_gradients = True  # this batch ends an accumulation window: reduce gradients, step
        self.batches_in_window = 0  # Accelerate's ``accelerator.step``: batches counted since the window began
        self.step_was_skipped = False  # the last optimizer step was skipped by fp16 loss scaling (inf/nan gradients)
        self.plain = strategy.plain_steps()
        self.plain_backward = self.plain and self.accumulation_steps == 1

    def configure(self, accumulation: GradientAccumulationPlugin) -> None:
        """Count windows by `accumulation` from now on (``accelerator.gradient_accumulation_steps = n``)."""
        self.accumulation = accumulation
        self.accumulation_steps = accumulation.num_steps
        self.plain_backward = self.plain and self.accumulation_steps == 1

    # the accumulation boundary ------------------------------------------------------------------------
    def advance(self, end_of_data: bool) -> bool:
        """Count one batch (Accelerate's rule): the last batch of a loader always ends the window and restarts the
        count (``sync_with_dataloader``); otherwise every N-th batch does. Returns `sync_gradients`."""
        if end_of_data and self.accumulation.sync_with_dataloader:
            self.batches_in_window = 0
            self.sync_gradients = True
        else:
            self.batches_in_window += 1
            self.sync_gradients = self.batches_in_window % self.accumulation_steps == 0
        return self.sync_gradients

    def at_position(self, position: int, last: bool) -> bool:
        """Lightning's rule, for a loop that counts its own window (the Trainer saves the position in checkpoints):
        the batch at `position` in its window ends it when the window is full or the epoch ends (`last`). Returns
        `sync_gradients`."""
        self.sync_gradients = position + 1 >= self.accumulation_steps or last
        return self.sync_gradients

    def sync_context(self, models: Iterable[nn.Module]) -> AbstractContextManager[Any]:
        """Inside an accumulation window the gradients are not reduced (``no_sync`` on each model), unless
        ``sync_each_batch`` asks for a reduction every batch (less memory under DDP/FSDP)."""
        models = list(models)
        if self.sync_gradients or self.accumulation.sync_each_batch or not models:
            return contextlib.nullcontext()
        if len(models) == 1:
            return self.strategy.no_sync(models[0])
        stack = contextlib.ExitStack()
        for model in models:
            stack.enter_context(self.strategy.no_sync(model))
        return stack

    # backward, unscale, clip ---------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Backward of `loss` divided by the accumulation steps, scaled by the fp16 loss scaler."""
        if kwargs:
            self.strategy.backward(loss, accumulation_steps=self.accumulation_steps, boundary=self.sync_gradients, **kwargs)
        elif self.plain_backward:
            loss.backward()
        else:  # a plain call costs less than unpacking an empty dict
            self.strategy.backward(loss, accumulation_steps=self.accumulation_steps, boundary=self.sync_gradients)

    def unscale(self, optimizers: Iterable[torch.optim.Optimizer]) -> None:
        """Divide the gradients by the fp16 loss scale, once per step; nothing to do without a scaler."""
        precision = self.strategy.precision  # (read here: the strategy may rebuild it before training, configure_precision)
        if precision.scaler is None:
            return
        for optimizer in optimizers:
            precision.unscale(optimizer)

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float, optimizers: Iterable[torch.optim.Optimizer]) -> torch.Tensor:
        """Unscale `optimizers`' gradients, then clip the total norm of `parameters`' gradients; returns the norm before."""
        self.unscale(optimizers)
        return self.strategy.clip_grad_norm_(parameters, max_norm, norm_type=norm_type)

    def clip_grad_value_(self, parameters: Any, clip_value: float, optimizers: Iterable[torch.optim.Optimizer]) -> None:
        """Unscale `optimizers`' gradients, then clamp each gradient element to ``[-clip_value, clip_value]``."""
        self.unscale(optimizers)
        self.strategy.clip_grad_value_(parameters, clip_value)

    # the optimizer step ----------------------------------------------------------------------------------
    def optimizer_step(self, optimizer: torch.optim.Optimizer, closure: Callable[[], Any] | None = None) -> bool:
        """Step `optimizer` (the one the strategy set up); False when fp16 loss scaling skipped the step."""
        if closure is None and self.plain:
            step_optimizer(optimizer)
            stepped = True
        elif closure is None:
            stepped = self.strategy.optimizer_step(optimizer)
        else:
            stepped = self.strategy.optimizer_step(optimizer, closure=closure)
        self.step_was_skipped = not stepped
        return stepped

    def zero_grad(self, optimizer: torch.optim.Optimizer, set_to_none: bool = True) -> None:
        """Zero `optimizer`'s gradients (to None: without torch's per-call label where nothing sees it)."""
        if set_to_none:
            zero_grad_to_none(optimizer)
        else:
            optimizer.zero_grad(set_to_none=False)

    def schedulers_per_step(self, split_batches: bool, num_processes: int) -> int:
        """How often an Accelerate-style scheduler advances per optimizer step: once per process (a schedule written
        for one process ends at the same point of the data), once with ``split_batches`` or an engine that steps
        inside its backward (DeepSpeed's steps its schedule once per optimizer step)."""
        return 1 if split_batches or isinstance(self.strategy, Engine) else num_processes


def check_loss(loss: Any, kwargs: dict[str, Any]) -> None:
    """A backward needs a tensor; a scalar one unless ``gradient=`` is passed."""
    if not isinstance(loss, torch.Tensor):
        raise TypeError(f"backward needs the loss tensor, got {type(loss).__name__} {loss!r:.80}")
    if loss.numel() != 1 and "gradient" not in kwargs:
        raise ValueError(
            f"backward needs a scalar loss, got a tensor of shape {tuple(loss.shape)}; reduce it first (e.g. loss.mean() "
            "or loss.sum()), or pass gradient= for a non-scalar backward"
        )
