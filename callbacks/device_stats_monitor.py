"""`DeviceStatsMonitor`: log the device's statistics around every logged training, validation and test batch
(Lightning 2.6's callback).

On a CUDA device the statistics are ``torch.cuda.memory_stats(device)`` (allocated, reserved, active bytes, ...); on
the CPU they are ``psutil``'s memory and CPU use (``cpu_vm_percent``, ``cpu_percent``, ``cpu_swap_percent``), which needs
``psutil``. They go to every tracker through ``trainer.log_metrics`` as ``DeviceStatsMonitor.on_train_batch_start/<stat>``
(and ``..._end``, ``on_validation_batch_*``, ``on_test_batch_*``) at the batches whose values are logged
(every ``log_every_n_steps``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from callbacks.base import Callback

if TYPE_CHECKING:
    from callbacks.view import TrainerView
    from trainer.fit.module import TrainModule


def get_cpu_stats() -> dict[str, float]:
    """``psutil``'s virtual memory, CPU and swap use in percent (Lightning's CPU device stats)."""
    try:
        import psutil
    except ImportError as err:
        raise ModuleNotFoundError(
            "DeviceStatsMonitor cannot log CPU stats as psutil is not installed: pip install psutil, or pass "
            "DeviceStatsMonitor(cpu_stats=False)"
        ) from err
    return {"cpu_vm_percent": psutil.virtual_memory().percent, "cpu_percent": psutil.cpu_percent(),
            "cpu_swap_percent": psutil.swap_memory().percent}


def get_device_stats(device: torch.device) -> dict[str, float]:
    """The statistics of `device`: ``torch.cuda.memory_stats`` for CUDA, ``psutil``'s for the CPU, else none."""
    if device.type == "cuda":
        return {k: float(v) for k, v in torch.cuda.memory_stats(device).items()}
    if device.type == "cpu":
        return get_cpu_stats()
    return {}


class DeviceStatsMonitor(Callback):
    """Log device statistics during training, validation and test.

    Args:
        cpu_stats: None: the CPU's statistics when training on the CPU; True: also on an accelerator; False: never.

    Raises:
        ValueError: at ``fit``'s setup, the Trainer has no tracker to log to.
        ModuleNotFoundError: at ``fit``'s setup, CPU statistics are due and ``psutil`` is not installed.
    """

    def __init__(self, cpu_stats: bool | None = None) -> None:
        if cpu_stats not in (None, True, False):
            raise TypeError(f"DeviceStatsMonitor(cpu_stats={cpu_stats!r}) must be None, True or False")
        self._cpu_stats = cpu_stats

    def setup(self, trainer: TrainerView, module: TrainModule, stage: str) -> None:
        if stage != "fit":
            return
        if not trainer.loggers:
            raise ValueError("Cannot use DeviceStatsMonitor with a Trainer without trackers (logger=False / log_with=None): "
                             "give it a tracker, e.g. log_with='csv', or remove the callback")
        device = trainer.strategy.device
        if (self._cpu_stats is None and device.type == "cpu") or self._cpu_stats:
            get_cpu_stats()  # psutil is there: fail now, not at the first logged batch

    def _log(self, trainer: TrainerView, key: str) -> None:
        if trainer.sanity_checking or (trainer.run_state.logging_step + 1) % max(trainer.log_every_n_steps, 1):
            return
        device = trainer.strategy.device
        if self._cpu_stats is False and device.type == "cpu":
            return
        stats = get_device_stats(device)
        if self._cpu_stats and device.type != "cpu":
            stats.update(get_cpu_stats())
        if stats:
            prefix = f"{type(self).__qualname__}.{key}/"
            trainer.log_metrics({prefix + name: value for name, value in stats.items()}, int(trainer.run_state.logging_step))

    def on_train_batch_start(self, trainer: TrainerView, module: TrainModule, batch: Any, batch_idx: int) -> None:
        self._log(trainer, "on_train_batch_start")

    def on_train_batch_end(self, trainer: TrainerView, module: TrainModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        self._log(trainer, "on_train_batch_end")

    def on_validation_batch_start(self, trainer: TrainerView, module: TrainModule, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._log(trainer, "on_validation_batch_start")

    def on_validation_batch_end(self, trainer: TrainerView, module: TrainModule, outputs: Any, batch: Any, batch_idx: int,
                                dataloader_idx: int = 0) -> None:
        self._log(trainer, "on_validation_batch_end")

    def on_test_batch_start(self, trainer: TrainerView, module: TrainModule, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._log(trainer, "on_test_batch_start")

    def on_test_batch_end(self, trainer: TrainerView, module: TrainModule, outputs: Any, batch: Any, batch_idx: int,
                          dataloader_idx: int = 0) -> None:
        self._log(trainer, "on_test_batch_end")


__all__ = ["DeviceStatsMonitor", "get_cpu_stats", "get_device_stats"]
