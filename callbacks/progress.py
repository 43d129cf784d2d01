"""`ProgressBar`: tqdm bars for training, validation, test and predict, on the main process only."""

from __future__ import annotations

import functools
import math
import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

from callbacks.base import Callback

if TYPE_CHECKING:
    from callbacks.view import TrainerView
    from trainer.fit.module import TrainModule

_STAGE_DESCRIPTIONS = {"validation": "Validation", "test": "Testing", "predict": "Predicting"}


def _import_tqdm() -> Any:
    """Return the bars' class (``tqdm.auto``'s, without its monitor thread), or raise an ImportError that names the fix."""
    try:
        from tqdm.auto import tqdm
    except ImportError as err:  # pragma: no cover - exercised only without tqdm
        raise ImportError(
            "ProgressBar requires the tqdm package, which is not installed. Install it with "
            "`pip install tqdm`, or pass enable_progress_bar=False to the Trainer."
        ) from err
    return _without_monitor(tqdm)


@functools.cache
def _without_monitor(tqdm_class: type) -> type:
    """`tqdm_class` with its monitor thread off (tqdm's documented ``monitor_interval = 0``), for these bars only.

    The thread redraws bars whose update interval tqdm stretched; these bars are redrawn by the callback. And once a
    process has started a thread, even one asleep or gone, pthread mutexes are locked where they were not before: in
    a single-threaded process about 1 % of a tiny training step's time, from then on (perf, cpu-clock samples).
    """
    return type(tqdm_class.__name__, (tqdm_class,), {"monitor_interval": 0, "__module__": __name__})


def _total(value: Any) -> int | None:
    """Turn a batch count (int, float('inf'), None, or a list of counts per loader) into a tqdm total."""
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        counts = [_total(v) for v in value]
        return None if any(c is None for c in counts) else sum(c for c in counts if c is not None)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return int(value)


def _to_float(value: Any) -> float | None:
    """Convert a logged value (float, int, one-element tensor) to a float; None for anything else."""
    if isinstance(value, (int, float)):
        return float(value)
    numel = getattr(value, "numel", None)
    if numel is not None and numel() == 1:
        return float(value.item())
    return None


def _loss_of(outputs: Any) -> Any:
    """The loss inside a ``training_step`` output (a tensor, or a mapping with a ``"loss"`` key), detached."""
    loss: Any = outputs.get("loss") if isinstance(outputs, dict) else outputs
    if not getattr(loss, "requires_grad", False):
        return loss  # already detached (the Trainer passes detached outputs), or not a tensor
    return loss.detach()


class ProgressBar(Callback):
    """Show training, validation, test and predict progress with tqdm on the global main process.

    The training bar's total is ``trainer.num_training_batches`` (this rank's batches after sharding
    and ``limit_train_batches``, which is the number of batches this process iterates); the evaluation
    bars use ``num_val_batches``/``num_test_batches``/``num_predict_batches``. A count of ``inf`` (a loader
    without a length: a stream) gives a bar without a total, which counts batches (``Epoch 0: 7it``). The postfix shows the
    last training loss and every metric logged with ``prog_bar=True`` (``trainer.progress_bar_metrics``).

    Updates are cheap: the bar is redrawn every ``refresh_rate`` batches but at most once every
    ``min_interval`` seconds (and always on the last batch), and tensors are converted to floats (which
    synchronises with the device) only on those redraws.

    Args:
        refresh_rate: redraw every this many batches; ``0`` disables the bars.
        leave: keep the finished training bar of each epoch on screen.
        file: stream the bars write to; ``None`` means ``sys.stderr`` at the time a bar is created.
        min_interval: seconds between two redraws at least (tqdm's ``mininterval``); ``0`` redraws every
            ``refresh_rate`` batches.

    Raises:
        ValueError: ``refresh_rate`` is not a non-negative integer, or ``min_interval`` is negative.
        ImportError: tqdm is not installed (raised when the first bar is created).

    Example::

        trainer = Trainer(max_epochs=3, callbacks=[ProgressBar(refresh_rate=10)])
    """

    def __init__(self, refresh_rate: int = 1, leave: bool = False, file: TextIO | None = None, min_interval: float = 0.1) -> None:
        if isinstance(refresh_rate, bool) or not isinstance(refresh_rate, int) or refresh_rate < 0:
            raise ValueError(
                f"ProgressBar(refresh_rate={refresh_rate!r}) is invalid; pass a non-negative integer "
                "(redraw every that many batches), or 0 to disable the bars."
            )
        if isinstance(min_interval, bool) or not isinstance(min_interval, (int, float)) or min_interval < 0:
            raise ValueError(f"ProgressBar(min_interval={min_interval!r}) is invalid; pass a number of seconds >= 0, e.g. 0.1.")
        self.refresh_rate = refresh_rate
        self.min_interval = float(min_interval)
        self._last_draw = 0.0
        self.leave = bool(leave)
        self.file = file
        self.train_bar: Any = None
        self.eval_bar: Any = None
        self._pending = 0
        self._check_at = refresh_rate  # the train bar's pending count at which a redraw may next be due
        self._eval_pending = 0
        self._last_output: Any = None  # the last training_step output (the Trainer passes it detached)
        self.position = 0  # tqdm's line offset (Lightning's process_position)

    @property
    def is_enabled(self) -> bool:
        """Whether bars are drawn at all (``refresh_rate > 0``)."""
        return self.refresh_rate > 0

    def _active(self, trainer: TrainerView) -> bool:
        return self.refresh_rate > 0 and trainer.is_global_zero

    def _new_bar(self, desc: str, total: int | None, leave: bool) -> Any:
        tqdm = _import_tqdm()
        self._last_draw = time.monotonic()
        return tqdm(
            total=total,
            desc=desc,
            leave=leave,
            file=self.file if self.file is not None else sys.stderr,
            dynamic_ncols=True,
            smoothing=0,
            unit="it",
            position=self.position or None,
        )

    def postfix(self, trainer: TrainerView) -> dict[str, float]:
        """The values shown after the bar: the last training loss, then ``trainer.progress_bar_metrics``."""
        shown: dict[str, float] = {}
        loss = _to_float(_loss_of(self._last_output)) if self._last_output is not None else None
        if loss is not None:
            shown["loss"] = loss
        for name, value in dict(trainer.progress_bar_metrics).items():
            number = _to_float(value)
            if number is not None:
                shown[name] = number
        trainer.warn_if_nonfinite(shown)  # values read for the bar anyway: a NaN loss does not train on silently
        return shown

    # training
    def on_train_epoch_start(self, trainer: TrainerView, module: TrainModule) -> None:
        if not self._active(trainer):
            return
        self._close_train_bar()
        total = _total(trainer.num_training_batches)
        self.train_bar = self._new_bar(f"Epoch {trainer.current_epoch}", total, self.leave)
        self._pending = 0
        self._check_at = self._next_check(self.train_bar, self._last_draw)

    def on_train_batch_end(self, trainer: TrainerView, module: TrainModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.train_bar is None:
            return
        self._last_output = outputs  # its loss is taken out only on a redraw
        self._pending += 1
        if self._pending >= self._check_at:  # before it no redraw is due: most batches end here
            now = time.monotonic()
            if self._due(self.train_bar, self._pending, now):
                self._refresh_train_bar(trainer)
            self._check_at = self._next_check(self.train_bar, now)

    def on_train_epoch_end(self, trainer: TrainerView, module: TrainModule) -> None:
        if self.train_bar is None:
            return
        self._refresh_train_bar(trainer)
        self._close_train_bar()

    def on_train_end(self, trainer: TrainerView, module: TrainModule) -> None:
        self._close_train_bar()

    def _due(self, bar: Any, pending: int, now: float | None = None) -> bool:
        """Redraw on the last batch, else every `refresh_rate` batches once `min_interval` has passed (at `now`)."""
        if bar.total is not None and bar.n + pending >= bar.total:
            return True
        if pending < self.refresh_rate:
            return False
        now = time.monotonic() if now is None else now
        if now - self._last_draw < self.min_interval:
            return False
        self._last_draw = now
        return True

    def _next_check(self, bar: Any, now: float) -> int:
        """The pending count at which the train bar's redraw may next be due, so the clock is not read every batch.

        ``refresh_rate`` batches after a redraw. Otherwise ``min_interval`` had not passed: at the pace since the last
        redraw, the batches the rest of it takes (at least one more). Never past the epoch's last batch.
        """
        pending = self._pending
        check = self.refresh_rate
        if pending:
            elapsed = now - self._last_draw
            check = pending + max(1, math.ceil((self.min_interval - elapsed) * pending / max(elapsed, 1e-9)))
        if bar.total is not None:
            check = min(check, max(bar.total - bar.n, 1))
        return check

    def _refresh_train_bar(self, trainer: TrainerView) -> None:
        self.train_bar.update(self._pending)
        self._pending = 0
        self.train_bar.set_postfix(self.postfix(trainer), refresh=True)

    def _close_train_bar(self) -> None:
        if self.train_bar is not None:
            self.train_bar.close()
            self.train_bar = None

    # validation, test, predict: one bar per loop
    def _eval_start(self, trainer: TrainerView, stage: str) -> None:
        if not self._active(trainer):
            return
        self._close_eval_bar()
        counts = {"validation": trainer.num_val_batches, "test": trainer.num_test_batches, "predict": trainer.num_predict_batches}
        total = _total(counts[stage])
        desc = _STAGE_DESCRIPTIONS[stage]
        if stage == "validation" and trainer.sanity_checking:
            desc = "Sanity Checking"
            sanity_steps = trainer.num_sanity_val_steps
            if sanity_steps >= 0:  # a stream's unknown count is at most these steps
                total = sanity_steps if total is None else min(total, sanity_steps)
        # A validation bar inside fit sits under the training bar and disappears when done.
        leave = stage != "validation" and self.leave
        self.eval_bar = self._new_bar(desc, total, leave)
        self._eval_pending = 0

    def _eval_batch_end(self) -> None:
        if self.eval_bar is None:
            return
        self._eval_pending += 1
        if self._due(self.eval_bar, self._eval_pending):
            self.eval_bar.update(self._eval_pending)
            self._eval_pending = 0
            self.eval_bar.refresh()

    def _eval_end(self, trainer: TrainerView) -> None:
        if self.eval_bar is None:
            return
        if self._eval_pending:
            self.eval_bar.update(self._eval_pending)
            self._eval_pending = 0
            self.eval_bar.refresh()
        self._close_eval_bar()
        if self.train_bar is not None:  # show the freshly computed validation metrics
            self.train_bar.set_postfix(self.postfix(trainer), refresh=True)

    def _close_eval_bar(self) -> None:
        if self.eval_bar is not None:
            self.eval_bar.close()
            self.eval_bar = None

    def on_validation_start(self, trainer: TrainerView, module: TrainModule) -> None:
        self._eval_start(trainer, "validation")

    def on_validation_batch_end(
        self, trainer: TrainerView, module: TrainModule, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0,
    ) -> None:
        self._eval_batch_end()

    def on_validation_end(self, trainer: TrainerView, module: TrainModule) -> None:
        self._eval_end(trainer)

    def on_test_start(self, trainer: TrainerView, module: TrainModule) -> None:
        self._eval_start(trainer, "test")

    def on_test_batch_end(
        self, trainer: TrainerView, module: TrainModule, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0,
    ) -> None:
        self._eval_batch_end()

    def on_test_end(self, trainer: TrainerView, module: TrainModule) -> None:
        self._eval_end(trainer)

    def on_predict_start(self, trainer: TrainerView, module: TrainModule) -> None:
        self._eval_start(trainer, "predict")

    def on_predict_batch_end(
        self, trainer: TrainerView, module: TrainModule, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0,
    ) -> None:
        self._eval_batch_end()

    def on_predict_end(self, trainer: TrainerView, module: TrainModule) -> None:
        self._eval_end(trainer)

    # cleanup
    def teardown(self, trainer: TrainerView, module: TrainModule, stage: str) -> None:
        self._close_eval_bar()
        self._close_train_bar()
        self._last_output = None

    def on_exception(self, trainer: TrainerView, module: TrainModule, exception: BaseException) -> None:
        self._close_eval_bar()
        self._close_train_bar()


class TQDMProgressBar(ProgressBar):
    """Lightning's ``TQDMProgressBar(refresh_rate, process_position, leave)``: the same bars as `ProgressBar`.

    ``process_position`` moves the bars down that many lines (tqdm's ``position``), for several runs in one terminal.
    """

    def __init__(self, refresh_rate: int = 1, process_position: int = 0, leave: bool = False) -> None:
        super().__init__(refresh_rate=refresh_rate, leave=leave)
        if isinstance(process_position, bool) or not isinstance(process_position, int) or process_position < 0:
            raise ValueError(f"TQDMProgressBar(process_position={process_position!r}) must be an int >= 0")
        self.position = process_position
