"""`Timer`: measure time per stage and stop training when a wall-time budget is spent."""

from __future__ import annotations

import re
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from callbacks.base import Callback

if TYPE_CHECKING:
    from callbacks.view import TrainerView
    from trainer.fit.module import TrainModule

STAGES = ("train", "validate", "test", "predict")
_DURATION_FORMAT = re.compile(r"^(\d+):(\d{1,2}):(\d{1,2}):(\d{1,2})$")
_TIMEDELTA_KEYS = ("weeks", "days", "hours", "minutes", "seconds", "milliseconds", "microseconds")


def parse_duration(duration: str | timedelta | dict[str, float] | None) -> timedelta | None:
    """Turn ``"DD:HH:MM:SS"``, a ``timedelta`` or a dict of ``timedelta`` arguments into a ``timedelta``.

    Raises:
        ValueError: the string does not match ``DD:HH:MM:SS``, a dict has unknown keys, or the
            duration is not positive.
        TypeError: the value has another type.
    """
    if duration is None:
        return None
    if isinstance(duration, str):
        match = _DURATION_FORMAT.match(duration.strip())
        if match is None:
            raise ValueError(
                f"Timer(duration={duration!r}) is not in the form 'DD:HH:MM:SS'; "
                "write e.g. '00:12:00:00' for twelve hours."
            )
        days, hours, minutes, seconds = (int(part) for part in match.groups())
        delta = timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
    elif isinstance(duration, timedelta):
        delta = duration
    elif isinstance(duration, dict):
        unknown = sorted(set(duration) - set(_TIMEDELTA_KEYS))
        if unknown:
            raise ValueError(
                f"Timer(duration={duration!r}) has unknown keys {unknown}; use any of {list(_TIMEDELTA_KEYS)}, "
                "e.g. dict(hours=12)."
            )
        delta = timedelta(**duration)
    else:
        raise TypeError(
            f"Timer(duration={duration!r}) has type {type(duration).__name__}; pass a 'DD:HH:MM:SS' string, "
            "a datetime.timedelta, a dict such as dict(hours=12), or None."
        )
    if delta.total_seconds() <= 0:
        raise ValueError(f"Timer(duration={duration!r}) must be positive; give a duration longer than zero.")
    return delta


class Timer(Callback):
    """Track the time spent in each stage and stop training once ``duration`` has elapsed.

    The check runs after every training batch (``interval="step"``) or every epoch (``"epoch"``).
    In a multi-process run rank 0 decides and the Trainer (which makes all ranks agree on
    ``should_stop``) stops every rank at the same step. The elapsed training time is saved in checkpoints and counted again on resume,
    so ``duration`` bounds the whole run across restarts.

    Args:
        duration: the training time budget: ``"DD:HH:MM:SS"``, a ``timedelta``, a dict such as
            ``dict(hours=12)``, or ``None`` to only measure.
        interval: ``"step"`` or ``"epoch"``: when to check the budget.
        verbose: print a line when the budget stops training.

    Raises:
        ValueError: a malformed ``duration`` or an unknown ``interval``.

    Example::

        timer = Timer(duration="00:12:00:00")
        trainer = Trainer(callbacks=[timer])
        trainer.fit(module)
        timer.time_elapsed("train")  # seconds
    """

    def __init__(
        self,
        duration: str | timedelta | dict[str, float] | None = None,
        interval: str = "step",
        verbose: bool = True,
    ) -> None:
        if interval not in ("step", "epoch"):
            raise ValueError(f"Timer(interval={interval!r}) is invalid; choose 'step' or 'epoch'.")
        self.duration = parse_duration(duration)
        self.interval = interval
        self.verbose = bool(verbose)
        self._start_time: dict[str, float | None] = dict.fromkeys(STAGES)
        self._end_time: dict[str, float | None] = dict.fromkeys(STAGES)
        self._offset = 0.0

    def _check_stage(self, stage: str) -> None:
        if stage not in STAGES:
            raise ValueError(f"Unknown stage {stage!r}; choose one of {list(STAGES)}.")

    def start_time(self, stage: str = "train") -> float | None:
        """The ``time.monotonic()`` value at which ``stage`` last started, or None."""
        self._check_stage(stage)
        return self._start_time[stage]

    def end_time(self, stage: str = "train") -> float | None:
        """The ``time.monotonic()`` value at which ``stage`` last ended, or None while running."""
        self._check_stage(stage)
        return self._end_time[stage]

    def time_elapsed(self, stage: str = "train") -> float:
        """Seconds spent in ``stage``; for ``"train"`` this includes the time restored from a checkpoint."""
        self._check_stage(stage)
        offset = self._offset if stage == "train" else 0.0
        start = self._start_time[stage]
        if start is None:
            return offset
        end = self._end_time[stage]
        return offset + ((end if end is not None else time.monotonic()) - start)

    def time_remaining(self, stage: str = "train") -> float | None:
        """Seconds left of ``duration`` (may be negative once exceeded), or None without a duration."""
        if self.duration is None:
            return None
        return self.duration.total_seconds() - self.time_elapsed(stage)

    def _start(self, stage: str) -> None:
        self._start_time[stage] = time.monotonic()
        self._end_time[stage] = None

    def _end(self, stage: str) -> None:
        self._end_time[stage] = time.monotonic()

    def on_train_start(self, trainer: TrainerView, module: TrainModule) -> None:
        self._start("train")

    def on_train_end(self, trainer: TrainerView, module: TrainModule) -> None:
        self._end("train")

    def on_validation_start(self, trainer: TrainerView, module: TrainModule) -> None:
        self._start("validate")

    def on_validation_end(self, trainer: TrainerView, module: TrainModule) -> None:
        self._end("validate")

    def on_test_start(self, trainer: TrainerView, module: TrainModule) -> None:
        self._start("test")

    def on_test_end(self, trainer: TrainerView, module: TrainModule) -> None:
        self._end("test")

    def on_predict_start(self, trainer: TrainerView, module: TrainModule) -> None:
        self._start("predict")

    def on_predict_end(self, trainer: TrainerView, module: TrainModule) -> None:
        self._end("predict")

    def on_train_batch_end(self, trainer: TrainerView, module: TrainModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.interval == "step":
            self._check_time(trainer)

    def on_train_epoch_end(self, trainer: TrainerView, module: TrainModule) -> None:
        if self.interval == "epoch":
            self._check_time(trainer)

    def _check_time(self, trainer: TrainerView) -> None:
        # Rank 0 decides; the Trainer makes every rank agree on ``should_stop`` at the next boundary, so
        # ranks whose clocks differ still stop at the same step, without a collective here.
        if self.duration is None or not trainer.is_global_zero:
            return
        if self.time_elapsed("train") < self.duration.total_seconds():
            return
        trainer.should_stop = True
        if self.verbose:
            elapsed = timedelta(seconds=int(self.time_elapsed("train")))
            print(f"Time limit reached. Elapsed time is {elapsed}. Signaling Trainer to stop.", flush=True)  # Lightning's words

    def state_dict(self) -> dict[str, Any]:
        return {"time_elapsed": {stage: self.time_elapsed(stage) for stage in STAGES}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._offset = float(state_dict.get("time_elapsed", {}).get("train", 0.0))
