"""`ThroughputMonitor`: training samples and batches per second, logged through the trackers."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from callbacks.base import Callback

if TYPE_CHECKING:
    from callbacks.view import TrainerView
    from trainer.fit.module import TrainModule


def _default_batch_size(batch: Any) -> int:
    """The batch size found by ``strategies.data.find_batch_size`` (first tensor's leading dimension)."""
    from strategies.data import find_batch_size  # lazy: `import callbacks` imports no torch (strategies does)

    return int(find_batch_size(batch))


class ThroughputMonitor(Callback):
    """Measure training throughput over a sliding window of batches and log it as metrics.

    Logged every ``log_every_n_steps`` training batches (the Trainer's value unless given):

    * ``throughput/batches_per_sec`` and ``throughput/samples_per_sec``: the whole job (this rank's
      rate times ``world_size``: every rank runs the same number of batches of the same size);
    * ``throughput/device/batches_per_sec`` and ``throughput/device/samples_per_sec``: this rank.

    Time spent in validation inside ``fit`` is excluded. Batch sizes are read from the batch on the
    host, so measuring never synchronises with the device; the time of a batch is taken when its
    ``on_train_batch_end`` fires.

    Args:
        batch_size_fn: returns the number of samples in a batch; by default the leading dimension
            of the first tensor found in it (``strategies.data.find_batch_size``).
        window_size: number of recent batches the rates are averaged over.
        log_every_n_steps: log every this many batches; ``None`` uses ``trainer.log_every_n_steps``.

    Raises:
        ValueError: ``window_size`` or ``log_every_n_steps`` is not a positive integer.
        TypeError: ``batch_size_fn`` is not callable.

    Example::

        monitor = ThroughputMonitor(batch_size_fn=lambda batch: batch["input_ids"].shape[0])
        trainer = Trainer(callbacks=[monitor])
    """

    def __init__(
        self,
        batch_size_fn: Callable[[Any], int] | None = None,
        window_size: int = 100,
        log_every_n_steps: int | None = None,
    ) -> None:
        if batch_size_fn is not None and not callable(batch_size_fn):
            raise TypeError(
                f"ThroughputMonitor(batch_size_fn={batch_size_fn!r}) is not callable; pass a function "
                "batch -> number of samples, or None to use the leading dimension of the first tensor."
            )
        for name, value in (("window_size", window_size), ("log_every_n_steps", log_every_n_steps)):
            if value is None and name == "log_every_n_steps":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ThroughputMonitor({name}={value!r}) is invalid; pass a positive integer.")
        self.batch_size_fn = batch_size_fn or _default_batch_size
        self.window_size = window_size
        self.log_every_n_steps = log_every_n_steps
        # (time, samples so far, batches so far) at the end of each recent batch; window_size + 1 points.
        self._window: deque[tuple[float, int, int]] = deque(maxlen=window_size + 1)
        self._samples = 0
        self._batches = 0
        self._paused = 0.0
        self._pause_start: float | None = None
        self.last_metrics: dict[str, float] = {}

    def _now(self) -> float:
        return time.perf_counter() - self._paused

    def on_train_epoch_start(self, trainer: TrainerView, module: TrainModule) -> None:
        # The window restarts each epoch, so the gap between epochs does not count.
        self._window.clear()
        self._window.append((self._now(), self._samples, self._batches))

    def on_train_batch_end(self, trainer: TrainerView, module: TrainModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._samples += int(self.batch_size_fn(batch))
        self._batches += 1
        self._window.append((self._now(), self._samples, self._batches))
        every = self.log_every_n_steps or max(trainer.log_every_n_steps, 1)
        if self._batches % every == 0:
            metrics = self.compute(trainer.world_size)
            if metrics:
                self.last_metrics = metrics
                trainer.log_metrics(metrics, int(trainer.logging_step))

    def compute(self, world_size: int = 1) -> dict[str, float]:
        """The rates over the current window, or an empty dict with fewer than two points."""
        if len(self._window) < 2:
            return {}
        (t0, samples0, batches0), (t1, samples1, batches1) = self._window[0], self._window[-1]
        elapsed = t1 - t0
        if elapsed <= 0:
            return {}
        samples_per_sec = (samples1 - samples0) / elapsed
        batches_per_sec = (batches1 - batches0) / elapsed
        return {
            "throughput/batches_per_sec": batches_per_sec * world_size,
            "throughput/samples_per_sec": samples_per_sec * world_size,
            "throughput/device/batches_per_sec": batches_per_sec,
            "throughput/device/samples_per_sec": samples_per_sec,
        }

    def on_validation_start(self, trainer: TrainerView, module: TrainModule) -> None:
        if trainer.training or trainer.stage == "fit":
            self._pause_start = time.perf_counter()

    def on_validation_end(self, trainer: TrainerView, module: TrainModule) -> None:
        if self._pause_start is not None:
            self._paused += time.perf_counter() - self._pause_start
            self._pause_start = None
