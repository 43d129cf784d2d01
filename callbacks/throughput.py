"""`ThroughputMonitor`: training batches, samples, items (tokens) and FLOPs per second and MFU, logged through the
trackers; `get_available_flops`: a chip's peak FLOP/s (Lightning's table, for the common chips)."""

from __future__ import annotations

import time
import warnings
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from callbacks.base import Callback

if TYPE_CHECKING:
    from callbacks.view import TrainerView
    from trainer.fit.module import TrainModule


# Peak dense FLOP/s per chip and dtype (Lightning 2.6's ``_CUDA_FLOPS``, the chips most used for training).
_CUDA_FLOPS: dict[str, dict[str, float]] = {
    "h200": {"float64": 34e12, "float32": 67e12, "tfloat32": 989e12, "bfloat16": 1979e12, "float16": 1979e12},
    "h100 sxm": {"float64": 33.5e12, "float32": 66.9e12, "tfloat32": 494.7e12, "bfloat16": 989.4e12, "float16": 989.4e12},
    "h100 pcie": {"float64": 25.6e12, "float32": 51.2e12, "tfloat32": 378e12, "bfloat16": 756e12, "float16": 756e12},
    "h100 nvl": {"float64": 67e12, "float32": 133.8e12, "tfloat32": 989.4e12, "bfloat16": 1978.8e12, "float16": 1978.8e12},
    "a100": {"float64": 9.7e12, "float32": 19.5e12, "tfloat32": 156e12, "bfloat16": 312e12, "float16": 312e12},
    "a10g": {"float32": 31.2e12, "tfloat32": 62.5e12, "bfloat16": 125e12, "float16": 125e12},
    "l40": {"float32": 90.5e12, "tfloat32": 90.5e12, "bfloat16": 181e12, "float16": 181e12},
    "l4": {"float32": 30.3e12, "tfloat32": 60e12, "bfloat16": 121e12, "float16": 121e12},
    "t4": {"float32": 8.1e12, "float16": 65e12},
    "v100": {"float64": 7.8e12, "float32": 15.7e12, "float16": 125e12},
}
_TIME_UNITS = {"seconds": 1.0, "minutes": 60.0, "hours": 3600.0, "days": 86400.0}


def _chip(device_name: str) -> str | None:
    name = device_name.lower()
    if "h200" in name:
        return "h200"
    if "h100" in name:
        return "h100 nvl" if "nvl" in name else "h100 pcie" if ("pcie" in name or "hbm2e" in name) else "h100 sxm"
    if "l4" in name:
        return "l40" if ("l40" in name or "tesla" in name) else "l4"
    return next((chip for chip in ("a100", "a10g", "t4", "v100") if chip in name), None)


def get_available_flops(device: Any, dtype: Any) -> int | None:
    """The peak FLOP/s of `device` (a ``torch.device``) computing in `dtype` (Lightning's ``get_available_flops``):
    None, with a warning, for a chip or dtype not in the table, and on CPU. float32 counts as TF32 on Ampere and later
    unless ``torch.get_float32_matmul_precision()`` is ``"highest"``, as Lightning."""
    import torch  # lazy: `import callbacks` imports no torch

    if torch.device(device).type != "cuda":
        return None
    device_name = torch.cuda.get_device_name(device)
    chip = _chip(device_name)
    dtype_name = str(dtype).removeprefix("torch.")
    if dtype_name == "float32" and torch.cuda.get_device_capability(device)[0] >= 8 and torch.get_float32_matmul_precision() != "highest":
        dtype_name = "tfloat32"
    flops = _CUDA_FLOPS.get(chip or "", {}).get(dtype_name)
    if flops is None:
        warnings.warn(f"FLOPs not found for {device_name!r} in {dtype_name}; pass ThroughputMonitor(available_flops=...) "
                      "for the MFU", stacklevel=2)
        return None
    return int(flops)


def _default_batch_size(batch: Any) -> int:
    """The batch size found by ``strategies.data.find_batch_size`` (first tensor's leading dimension)."""
    from strategies.data import find_batch_size  # lazy: `import callbacks` imports no torch (strategies does)

    return int(find_batch_size(batch))


class ThroughputMonitor(Callback):
    """Measure training throughput over a sliding window of batches and log it as metrics (Lightning's names, under
    ``throughput/``).

    Logged every ``log_every_n_steps`` training batches (the Trainer's value unless given):

    * ``throughput/batches_per_sec``, ``throughput/samples_per_sec``: the whole job (this rank's rate times
      ``world_size``: every rank runs the same number of batches of the same size), and ``throughput/device/...``: this rank;
    * with `length_fn`: ``throughput/items_per_sec`` and ``throughput/device/items_per_sec`` (tokens per second);
    * with FLOPs per batch (`flops_per_batch`, else the module's ``flops_per_batch`` attribute, as Lightning):
      ``throughput/flops_per_sec``, ``throughput/device/flops_per_sec`` and, when the peak is known (`available_flops`,
      else `get_available_flops` of the strategy's device and precision), ``throughput/device/mfu`` =
      device FLOP/s / peak, and ``throughput/mfu`` (the same figure for the job: its FLOP/s over its peak);
    * ``throughput/time`` (training time so far, in `time_unit`), ``throughput/batches``, ``throughput/samples``,
      ``throughput/items``: this rank's totals.

    Time spent in validation inside ``fit`` is excluded. Sizes are read from the batch on the host, so measuring never
    synchronises with the device; the time of a batch is taken when its ``on_train_batch_end`` fires (over a window
    of steady steps, the device's pace).

    Args:
        batch_size_fn: returns the number of samples in a batch; by default the leading dimension
            of the first tensor found in it (``strategies.data.find_batch_size``).
        length_fn: returns the number of items (tokens) in a batch, e.g. ``lambda b: b["input_ids"].numel()``.
        window_size: number of recent batches the rates are averaged over.
        log_every_n_steps: log every this many batches; ``None`` uses ``trainer.log_every_n_steps``.
        flops_per_batch: FLOPs of one training batch on one device (forward and backward), e.g. from
            ``trainer.utilities.measure_flops`` on the meta device.
        available_flops: the peak FLOP/s of one device, for the MFU.
        time_unit: unit of ``throughput/time``: ``"seconds"``, ``"minutes"``, ``"hours"`` or ``"days"``.

    Raises:
        ValueError: ``window_size`` or ``log_every_n_steps`` is not a positive integer, ``time_unit`` is unknown,
            or ``flops_per_batch``/``available_flops`` is not positive.
        TypeError: ``batch_size_fn`` or ``length_fn`` is not callable.

    Example::

        monitor = ThroughputMonitor(batch_size_fn=lambda batch: batch["input_ids"].shape[0],
                                    length_fn=lambda batch: batch["input_ids"].numel(), flops_per_batch=flops)
        trainer = Trainer(callbacks=[monitor])
    """

    def __init__(
        self,
        batch_size_fn: Callable[[Any], int] | None = None,
        length_fn: Callable[[Any], int] | None = None,
        window_size: int = 100,
        log_every_n_steps: int | None = None,
        flops_per_batch: float | None = None,
        available_flops: float | None = None,
        time_unit: str = "seconds",
    ) -> None:
        for name, fn in (("batch_size_fn", batch_size_fn), ("length_fn", length_fn)):
            if fn is not None and not callable(fn):
                raise TypeError(
                    f"ThroughputMonitor({name}={fn!r}) is not callable; pass a function batch -> number of "
                    + ("samples, or None to use the leading dimension of the first tensor." if name == "batch_size_fn" else "items (tokens), or None.")
                )
        for name, value in (("window_size", window_size), ("log_every_n_steps", log_every_n_steps)):
            if value is None and name == "log_every_n_steps":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ThroughputMonitor({name}={value!r}) is invalid; pass a positive integer.")
        for name, number in (("flops_per_batch", flops_per_batch), ("available_flops", available_flops)):
            if number is not None and (isinstance(number, bool) or not isinstance(number, (int, float)) or number <= 0):
                raise ValueError(f"ThroughputMonitor({name}={number!r}) is invalid; pass a positive number or None.")
        if time_unit not in _TIME_UNITS:
            raise ValueError(f"ThroughputMonitor(time_unit={time_unit!r}) is unknown; choose one of {', '.join(map(repr, _TIME_UNITS))}.")
        self.batch_size_fn = batch_size_fn or _default_batch_size
        self.length_fn = length_fn
        self.window_size = window_size
        self.log_every_n_steps = log_every_n_steps
        self.flops_per_batch = flops_per_batch
        self.available_flops = available_flops
        self.time_unit = time_unit
        # (time, samples, batches, items, flops so far) at the end of each recent batch; window_size + 1 points.
        self._window: deque[tuple[float, int, int, int, float]] = deque(maxlen=window_size + 1)
        self._samples = 0
        self._batches = 0
        self._items = 0
        self._flops = 0.0
        self._train_time = 0.0
        self._paused = 0.0
        self._pause_start: float | None = None
        self._peak: float | None = available_flops
        self.last_metrics: dict[str, float] = {}

    def _now(self) -> float:
        return time.perf_counter() - self._paused

    def setup(self, trainer: TrainerView, module: TrainModule, stage: str) -> None:
        if self.available_flops is None and stage == "fit":
            strategy = trainer.strategy
            self._peak = get_available_flops(strategy.device, strategy.precision.dtype or "float32")

    def on_train_epoch_start(self, trainer: TrainerView, module: TrainModule) -> None:
        # The window restarts each epoch, so the gap between epochs does not count.
        self._window.clear()
        self._window.append((self._now(), self._samples, self._batches, self._items, self._flops))

    def on_train_batch_end(self, trainer: TrainerView, module: TrainModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        now = self._now()
        self._train_time += now - self._window[-1][0] if self._window else 0.0
        self._samples += int(self.batch_size_fn(batch))
        self._batches += 1
        if self.length_fn is not None:
            self._items += int(self.length_fn(batch))
        flops = self.flops_per_batch if self.flops_per_batch is not None else getattr(module, "flops_per_batch", None)
        if flops is not None:
            self._flops += float(flops)
        self._window.append((now, self._samples, self._batches, self._items, self._flops))
        every = self.log_every_n_steps or max(trainer.log_every_n_steps, 1)
        if self._batches % every == 0:
            metrics = self.compute(trainer.world_size)
            if metrics:
                self.last_metrics = metrics
                trainer.log_metrics(metrics, int(trainer.run_state.logging_step))

    def compute(self, world_size: int = 1) -> dict[str, float]:
        """The rates over the current window, or an empty dict with fewer than two points."""
        if len(self._window) < 2:
            return {}
        (t0, samples0, batches0, items0, flops0), (t1, samples1, batches1, items1, flops1) = self._window[0], self._window[-1]
        elapsed = t1 - t0
        if elapsed <= 0:
            return {}
        metrics = {"throughput/time": self._train_time / _TIME_UNITS[self.time_unit], "throughput/batches": float(self._batches),
                   "throughput/samples": float(self._samples)}
        rates = {"batches": (batches1 - batches0) / elapsed, "samples": (samples1 - samples0) / elapsed}
        if self.length_fn is not None:
            metrics["throughput/items"] = float(self._items)
            rates["items"] = (items1 - items0) / elapsed
        if flops1 > 0:
            rates["flops"] = (flops1 - flops0) / elapsed
        for name, rate in rates.items():
            metrics[f"throughput/{name}_per_sec"] = rate * world_size
            metrics[f"throughput/device/{name}_per_sec"] = rate
        if "flops" in rates and self._peak:
            metrics["throughput/device/mfu"] = metrics["throughput/mfu"] = rates["flops"] / self._peak
        return metrics

    def on_validation_start(self, trainer: TrainerView, module: TrainModule) -> None:
        if trainer.training or trainer.stage == "fit":
            self._pause_start = time.perf_counter()

    def on_validation_end(self, trainer: TrainerView, module: TrainModule) -> None:
        if self._pause_start is not None:
            self._paused += time.perf_counter() - self._pause_start
            self._pause_start = None
