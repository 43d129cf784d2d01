"""`EarlyStopping`: stop `fit` when a monitored metric stops improving."""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING, Any

from callbacks.base import Callback, in_fit

if TYPE_CHECKING:
    from callbacks.view import TrainerView
    from trainer.fit.module import TrainModule


class EarlyStopping(Callback):
    """Set ``trainer.should_stop`` when `monitor` has not improved for `patience` checks.

    A check runs after each validation (or at the end of each training epoch, see
    `check_on_train_epoch_end`). It also stops at once when the metric is not finite (`check_finite`),
    passes `stopping_threshold`, or passes `divergence_threshold`.

    The parameters are Lightning's, in Lightning's order (``EarlyStopping("val_loss", 0.0, 3)`` works).

    Args:
        monitor: the metric to watch (a key of ``trainer.callback_metrics``).
        min_delta: the smallest change that counts as an improvement.
        patience: how many checks without improvement to allow before stopping.
        verbose: print each check's outcome (an improvement, or why training stops), on every process, prefixed
            with ``[rank: N]`` when there are several.
        mode: ``"min"`` or ``"max"``: whether lower or higher is better.
        strict: raise when `monitor` was never logged (False: warn and skip the check).
        check_finite: stop when the metric becomes NaN or infinite.
        stopping_threshold: stop as soon as the metric is better than this (strictly, as in Lightning).
        divergence_threshold: stop as soon as the metric is worse than this.
        check_on_train_epoch_end: check at the end of the training epoch (True) or after validation (False);
            default: at epoch end when validation runs once per epoch or not at all, else after validation.
        log_rank_zero_only: with `verbose`, print on global rank 0 only.

    Raises:
        ValueError: on an invalid argument.
    """

    monitors_metrics = True  # runs after the module's on_train_epoch_end, to see what it logs (as in Lightning)

    def __init__(
        self,
        monitor: str,
        min_delta: float = 0.0,
        patience: int = 3,
        verbose: bool = False,
        mode: str = "min",
        strict: bool = True,
        check_finite: bool = True,
        stopping_threshold: float | None = None,
        divergence_threshold: float | None = None,
        check_on_train_epoch_end: bool | None = None,
        log_rank_zero_only: bool = False,
    ) -> None:
        if not isinstance(monitor, str) or not monitor:
            raise ValueError(f"EarlyStopping(monitor={monitor!r}) needs the name of a logged metric, e.g. monitor='val_loss'")
        if mode not in ("min", "max"):
            raise ValueError(f"EarlyStopping(mode={mode!r}) is not supported; use mode='min' or mode='max'")
        if not isinstance(patience, int) or patience < 0:
            raise ValueError(f"EarlyStopping(patience={patience!r}) must be an int >= 0")
        if not math.isfinite(min_delta):
            raise ValueError(f"EarlyStopping(min_delta={min_delta!r}) must be a finite number")
        for name, flag in (("verbose", verbose), ("log_rank_zero_only", log_rank_zero_only)):
            if not isinstance(flag, bool):
                raise TypeError(f"EarlyStopping({name}={flag!r}) must be True or False")
        self.monitor = monitor
        self.mode = mode
        self.min_delta = abs(float(min_delta))
        self.patience = patience
        self.check_finite = check_finite
        self.stopping_threshold = stopping_threshold
        self.divergence_threshold = divergence_threshold
        self.check_on_train_epoch_end = check_on_train_epoch_end
        self.strict = strict
        self.verbose = verbose
        self.log_rank_zero_only = log_rank_zero_only
        self.wait_count = 0
        self.stopped_epoch = 0
        self.best_score = math.inf if mode == "min" else -math.inf
        self.stopping_reason: str | None = None

    @property
    def state_key(self) -> str:
        return f"EarlyStopping{{monitor={self.monitor!r}, mode={self.mode!r}}}"

    def state_dict(self) -> dict[str, Any]:
        return {
            "wait_count": self.wait_count,
            "stopped_epoch": self.stopped_epoch,
            "best_score": self.best_score,
            "patience": self.patience,
            "stopping_reason": self.stopping_reason,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.wait_count = int(state_dict["wait_count"])
        self.stopped_epoch = int(state_dict["stopped_epoch"])
        self.best_score = float(state_dict["best_score"])
        self.patience = int(state_dict.get("patience", self.patience))
        self.stopping_reason = state_dict.get("stopping_reason")

    # ----------------------------------------------------------------------------------- hooks
    def _checks_at_epoch_end(self, trainer: TrainerView) -> bool:
        if self.check_on_train_epoch_end is not None:
            return self.check_on_train_epoch_end
        return trainer.validation_schedule.once_per_epoch

    def on_train_epoch_end(self, trainer: TrainerView, module: TrainModule) -> None:
        if self._checks_at_epoch_end(trainer):
            self._run_check(trainer)

    def on_validation_end(self, trainer: TrainerView, module: TrainModule) -> None:
        if not self._checks_at_epoch_end(trainer):
            self._run_check(trainer)

    def _run_check(self, trainer: TrainerView) -> None:
        if not in_fit(trainer):
            return
        metrics = trainer.callback_metrics
        if self.monitor not in metrics:
            message = (
                f"EarlyStopping(monitor={self.monitor!r}) could not find {self.monitor!r} in the logged metrics "
                f"{sorted(metrics)}; log it with self.log({self.monitor!r}, value) or change `monitor`"
            )
            if self.strict:
                raise RuntimeError(message + " (or pass strict=False to skip the check when it is missing)")
            warnings.warn(message, stacklevel=2)
            return
        value = metrics[self.monitor]
        current = float(value.item() if hasattr(value, "item") else value)
        should_stop, reason = self.evaluate(current)
        if should_stop:
            self.stopped_epoch = int(trainer.current_epoch)
            self.stopping_reason = reason
            trainer.should_stop = True
        if reason and self.verbose:
            self._log_info(trainer, reason)

    def _log_info(self, trainer: TrainerView, message: str) -> None:
        """Lightning's ``verbose`` output: every process speaks (rank-prefixed) unless `log_rank_zero_only`."""
        if trainer.world_size > 1:
            if self.log_rank_zero_only and not trainer.is_global_zero:
                return
            message = f"[rank: {trainer.global_rank}] {message}"
        print(message, flush=True)

    # ----------------------------------------------------------------------------------- rule
    def _better(self, a: float, b: float) -> bool:
        return a < b if self.mode == "min" else a > b

    def evaluate(self, current: float) -> tuple[bool, str | None]:
        """Update the counters with `current`; return whether to stop, and why it stops or what improved."""
        if self.check_finite and not math.isfinite(current):
            return True, (
                f"Monitored metric {self.monitor} = {current} is not finite. Previous best value was {self.best_score:.3f}. "
                "Signaling Trainer to stop."
            )
        if self.stopping_threshold is not None and self._better(current, self.stopping_threshold):
            return True, (  # Lightning's words and rule: strictly past the threshold
                f"Stopping threshold reached: {self.monitor} = {current} {'<' if self.mode == 'min' else '>'} "
                f"{self.stopping_threshold}. Signaling Trainer to stop."
            )
        if self.divergence_threshold is not None and self._better(self.divergence_threshold, current):
            return True, (  # Lightning's words; Lightning prints the improvement's sign (`<` in min mode) here
                f"Divergence threshold reached: {self.monitor} = {current} "
                f"{'>' if self.mode == 'min' else '<'} {self.divergence_threshold}. Signaling Trainer to stop."
            )
        step = -self.min_delta if self.mode == "min" else self.min_delta
        if self._better(current, self.best_score + step):
            if math.isfinite(self.best_score):
                improved = (
                    f"Metric {self.monitor} improved by {abs(self.best_score - current):.3f} >= "
                    f"min_delta = {self.min_delta}. New best score: {current:.3f}"
                )
            else:
                improved = f"Metric {self.monitor} improved. New best score: {current:.3f}"
            self.best_score = current
            self.wait_count = 0
            return False, improved
        self.wait_count += 1
        if self.wait_count >= self.patience:
            return True, (
                f"Monitored metric {self.monitor} did not improve in the last {self.wait_count} records. "
                f"Best score: {self.best_score:.3f}. Signaling Trainer to stop."
            )
        return False, None
