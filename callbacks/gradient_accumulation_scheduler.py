"""`GradientAccumulationScheduler`: batches per optimizer step by epoch (Lightning 2.6's callback).

``Trainer(accumulate_grad_batches={0: 4, 2: 2})`` adds one. At each training epoch's start (a resumed epoch's too)
it sets ``trainer.accumulate_grad_batches``, which the accelerator's `Stepper` counts windows by; the epoch's last
batch always ends a window, so a window never spans two epochs.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from callbacks.base import Callback
from strategies.abilities import Engine

if TYPE_CHECKING:
    from callbacks.view import TrainerView
    from trainer.fit.module import TrainModule


def check_scheduling(scheduling: Any, where: str = "scheduling") -> dict[int, int]:
    """A copy of `scheduling` checked: ``{epoch: batches per step}`` with int epochs >= 0 and int factors >= 1, epoch 0
    at 1 when absent (Lightning's rule).

    Raises:
        TypeError: not a non-empty dict.
        ValueError: a key or value out of range, naming it.
    """
    if not isinstance(scheduling, dict) or not scheduling:
        raise TypeError(f"{where}={scheduling!r} must be a non-empty dict {{epoch: batches per optimizer step}}, e.g. {{0: 4, 2: 2}}")
    bad_keys = [key for key in scheduling if isinstance(key, bool) or not isinstance(key, int) or key < 0]
    if bad_keys:
        raise ValueError(f"{where} has epochs {bad_keys!r}; its keys are epochs, ints >= 0 (0 is the first epoch)")
    bad_values = {key: value for key, value in scheduling.items() if isinstance(value, bool) or not isinstance(value, int) or value < 1}
    if bad_values:
        raise ValueError(f"{where} has accumulation factors {bad_values!r}; each value must be an int >= 1 (batches per optimizer step)")
    checked = dict(sorted(scheduling.items()))
    if 0 not in checked:
        checked = {0: 1, **checked}
    return checked


class GradientAccumulationScheduler(Callback):
    """Change the batches per optimizer step at given epochs.

    Args:
        scheduling: ``{epoch: factor}``; epochs count from 0, and a factor holds from its epoch until the next key
            (before the first key: 1). ``{4: 2}`` accumulates 2 batches from the fifth epoch on.

    Raises:
        TypeError: `scheduling` is not a non-empty dict.
        ValueError: an epoch is not an int >= 0 or a factor not an int >= 1.
    """

    def __init__(self, scheduling: dict[int, int]) -> None:
        self.scheduling = check_scheduling(scheduling)
        self.epochs = sorted(self.scheduling)
        self._last_set: int | None = None  # the factor this scheduler last gave the Trainer

    def going_to_accumulate_grad_batches(self) -> bool:
        return any(value > 1 for value in self.scheduling.values())

    def get_accumulate_grad_batches(self, epoch: int) -> int:
        """The factor of `epoch`: the value of the last key <= `epoch`."""
        for key in reversed(self.epochs):
            if epoch >= key:
                return self.scheduling[key]
        return 1

    def on_train_start(self, trainer: TrainerView, pl_module: TrainModule) -> None:
        if not pl_module.automatic_optimization:
            raise RuntimeError(
                "GradientAccumulationScheduler (or Trainer(accumulate_grad_batches={...})) does not apply to manual "
                "optimization; remove it, or accumulate in training_step"
            )
        own_step = getattr(type(pl_module), "optimizer_step", None)
        if self.going_to_accumulate_grad_batches() and getattr(own_step, "__qualname__", "") != "TrainModule.optimizer_step":
            warnings.warn(
                "When using `Trainer(accumulate_grad_batches != 1)` and overriding `TrainModule.optimizer_step`, the hook "
                "will not be called on every batch (rather, it is called on every optimization step).",
                stacklevel=2,
            )
        if isinstance(trainer.strategy, Engine):
            raise RuntimeError(
                f"strategy {trainer.strategy.name!r} fixes the accumulation in its engine's config, so it cannot change between "
                "epochs; remove the schedule (set a constant accumulate_grad_batches)"
            )
        if trainer.accumulate_grad_batches != (self._last_set or 1):  # (what this scheduler set in an earlier fit is its own)
            raise ValueError(
                f"Trainer(accumulate_grad_batches={trainer.accumulate_grad_batches}) and a GradientAccumulationScheduler "
                "both set the accumulation; remove one (Trainer(accumulate_grad_batches={epoch: n}) builds the scheduler itself)"
            )

    def on_train_epoch_start(self, trainer: TrainerView, pl_module: TrainModule) -> None:
        self._last_set = trainer.accumulate_grad_batches = self.get_accumulate_grad_batches(trainer.current_epoch)
