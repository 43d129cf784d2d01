"""What a fit knows of the losses it trains on: non-finite ones warned about once, skipped batches counted.

Without an ``on_nonfinite`` policy the loop reads no loss on the host: `LossHealth.watch` adds each loss trained on to a
total on its device, and `LossHealth.check` reads that total only where the loop reads values anyway (a logged value
going to the trackers, one the progress bar shows) or synchronizes anyway (after a validation, at an epoch's end).
With ``on_nonfinite="skip"`` the batches skipped are counted (``trainer.nonfinite_skipped``).
"""

from __future__ import annotations

import copy
import math
import warnings

import torch


class LossHealth:
    """The loss watch of one fit (`reset` at its start); a search saves and restores it as one unit (`snapshot`).

    `policy` is the Trainer's ``on_nonfinite`` (None, ``"skip"`` or ``"stop"``): what the loop does about a non-finite
    loss; a search inside the run turns it off while it runs (its loss diverges on purpose) and the restore puts it back.
    """

    def __init__(self, policy: str | None = None) -> None:
        self.policy = policy
        self.reset()

    def reset(self) -> None:
        self.warned_skip = False  # training_step returned None: warned once per fit
        self.warned_nonfinite = False  # a non-finite training value was read: warned once per fit
        self.skipped = 0  # batches skipped for a non-finite loss (on_nonfinite="skip")
        # on the device: the sum of the losses trained on, non-finite once one of them was
        self.loss_total: torch.Tensor | None = None

    def snapshot(self) -> LossHealth:
        return copy.copy(self)

    def restore(self, saved: LossHealth) -> None:
        self.__dict__.update(saved.__dict__)

    def watch(self, loss: torch.Tensor) -> None:
        """Add a (scalar) loss trained on to the device-side total, without a host read: one NaN or inf loss leaves the
        total non-finite for `check` to read. One small kernel a step (an isfinite flag would take two)."""
        if self.loss_total is None:
            self.loss_total = torch.zeros((), dtype=torch.float32, device=loss.device)
        self.loss_total.add_(loss.detach())

    def check(self, values: dict[str, float], *, synchronized: bool, step: int, epoch: int) -> None:
        """Warn once when one of `values` (already read to the host) is NaN or inf; where values were read or the loop
        synchronized (`synchronized`), read the device-side total too. Costs no synchronization of its own."""
        if self.warned_nonfinite:
            return
        bad = next(((name, value) for name, value in values.items() if isinstance(value, float) and not math.isfinite(value)), None)
        if bad is not None:
            what = f"{bad[0]} is {bad[1]} at step {step}"
        elif (values or synchronized) and self.loss_total is not None and not math.isfinite(float(self.loss_total)):
            what = f"the loss training_step returned was NaN or inf at step {step} or before"  # (read here, not every step)
        else:
            return
        self.warned_nonfinite = True
        warnings.warn(
            f"{what} (epoch {epoch}): training produces non-finite "
            "values and the weights may already be NaN. Trainer(on_nonfinite='stop') raises at the first non-finite loss "
            "(naming the first non-finite parameter), 'skip' skips such batches; lower the learning rate or clip gradients "
            "(gradient_clip_val=...). This warning is shown once per fit",
            RuntimeWarning,
            stacklevel=3,
        )
