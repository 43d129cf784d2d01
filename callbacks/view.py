"""What callbacks and the module may rely on of the `Trainer` running them.

* `TrainerView`: the attributes and methods a callback's hooks (``trainer``) may use: Lightning's names, the run's
  state as one typed object (``trainer.run_state``), and the few seams the built-in callbacks need.
  `ModuleTrainerView` adds what a `TrainModule` (``self.trainer``) calls for ``self.log``, ``manual_backward`` and
  ``opt.step()``. `Trainer` satisfies both (mypy checks that in ``trainer/fit/trainer.py``); anything else on the
  Trainer is its own business and may change.
* `ValidationSchedule`: when validation runs during ``fit`` (``trainer.validation_schedule``), the one rule the
  loop and the metric-monitoring callbacks share.
* `Preempted`: what ``fit`` raises after it wrote a preemption checkpoint (see ``trainer.fit.preemption``).

This module imports nothing of ``trainer`` at run time: callbacks sit below the Trainer.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, overload

if TYPE_CHECKING:
    import torch
    from torch.distributed import ProcessGroup

    from callbacks.batch_size_finder import BatchSizeFinder
    from callbacks.checkpoint import ModelCheckpoint
    from callbacks.lr_finder import LearningRateFinder
    from callbacks.trackers.base import GeneralTracker
    from strategies.base import Strategy
    from strategies.checkpoint_store import CheckpointStore, PendingSave
    from trainer.accelerator.accelerator import Accelerator
    from trainer.fit.agreement import LoopAgreement
    from trainer.fit.combined_loader import CombinedLoader
    from trainer.fit.datamodule import DataModule
    from trainer.fit.lr_finder import LRFinder
    from trainer.fit.module import LRSchedulerConfig, ManualOptimizer, TrainModule
    from trainer.fit.run_state import RunState


@dataclass(frozen=True)
class ValidationSchedule:
    """When ``fit`` validates: built by the Trainer from its ``val_check_interval`` and ``check_val_every_n_epoch``
    and the epoch's ``num_training_batches`` (``inf`` for a loader without a length, a stream).

    Every ``check_val_every_n_epoch``-th epoch, validation runs every ``val_check_interval`` batches (an int) or
    fraction of the epoch (a float); with None, or an interval as long as the epoch, once after its last batch.
    A stream takes an int interval (every that many batches only, as in Lightning) or 1.0 (its end).
    """

    val_check_interval: int | float | None = None
    check_val_every_n_epoch: int = 1
    num_training_batches: int | float = 0

    def due(self, epoch: int, batch_idx: int, last: bool) -> bool:
        """Validate after batch `batch_idx` of `epoch` (`last`: the epoch's last batch)?"""
        if (epoch + 1) % self.check_val_every_n_epoch:
            return False
        interval, total = self.val_check_interval, self.num_training_batches
        if isinstance(interval, float):
            if math.isinf(total):
                return last  # 1.0: the end of the stream (other fractions are refused)
            interval = max(1, int(total * interval))
        if interval is None or interval >= total:
            return last
        return (batch_idx + 1) % interval == 0

    @property
    def once_per_epoch(self) -> bool:
        """True when validation runs exactly at the end of every training epoch (so the epoch's end follows it):
        `ModelCheckpoint` and `EarlyStopping` then act at the epoch's end rather than after each validation."""
        if self.check_val_every_n_epoch != 1:
            return False
        interval = self.val_check_interval
        if interval is None:
            return True
        if isinstance(interval, float):
            return interval == 1.0
        return interval >= self.num_training_batches


class Preempted(SystemExit):
    """Raised (on every process) after the preemption checkpoint is written; its code is ``128 + signal``.

    `OnExceptionCheckpoint` leaves it alone: the run's own checkpoint is already on disk.
    """

    def __init__(self, signum: int, checkpoint: Path) -> None:
        super().__init__(128 + signum)
        self.signum, self.checkpoint = signum, checkpoint


class TrainerView(Protocol):
    """The `Trainer` as callbacks see it: ``trainer`` in every callback hook (a `TrainModule`'s ``self.trainer`` is
    `ModuleTrainerView`, this and a little more). Read-only unless noted; ``should_stop`` is the one a callback sets."""

    # ------------------------------------------------------------------ where the run is: views onto `run_state`
    @property
    def run_state(self) -> RunState:
        """The run's state as one object (`trainer.fit.run_state.RunState`): what the run is doing, where the fit is
        (``run_state.progress``; ``run_state.logging_step``, the step the trackers receive), its limits, optimizers
        and schedulers. The Lightning names of this section read it (``should_stop``, ``max_steps``, ... set it)."""

    @property
    def stage(self) -> str | None:
        """``"fit"``, ``"validate"``, ``"test"``, ``"predict"``; None outside a run."""

    @property
    def sanity_checking(self) -> bool:
        """True during the validation batches ``fit`` runs before training."""

    @property
    def training(self) -> bool:
        """True between ``on_train_start`` and ``on_train_end`` (validation inside ``fit`` included)."""

    @property
    def current_epoch(self) -> int: ...

    @property
    def global_step(self) -> int:
        """Optimizer steps taken so far."""

    should_stop: bool
    """Set it to stop ``fit`` at the next boundary (every process agrees first)."""

    @property
    def max_epochs(self) -> int | None: ...

    @property
    def max_steps(self) -> int | None: ...

    @property
    def estimated_stepping_batches(self) -> int | float: ...

    @property
    def train_dataloader(self) -> torch.utils.data.DataLoader | CombinedLoader | None:
        """The prepared training loader of the running ``fit`` (None outside one)."""

    def train_step_batches(self) -> Iterator[Any]:
        """One pass over the training loader, each batch as ``training_step`` gets it (a `CombinedLoader`'s combined
        batch, without its indices); raises RuntimeError outside a ``fit``."""

    @property
    def num_training_batches(self) -> int | float:
        """Training batches per epoch on this process, after limits (``inf`` for a stream)."""

    @property
    def num_val_batches(self) -> int | float | list[int | float]:
        """Validation batches per loader (a list with several loaders)."""

    @property
    def num_test_batches(self) -> int | float | list[int | float]: ...

    @property
    def num_predict_batches(self) -> int | float | list[int | float]: ...

    @property
    def num_sanity_val_steps(self) -> int: ...

    @property
    def log_every_n_steps(self) -> int: ...

    @property
    def gradient_clip_val(self) -> float | None:
        """``Trainer(gradient_clip_val=...)`` (None: no clipping)."""

    @property
    def gradient_clip_algorithm(self) -> str:
        """``"norm"`` or ``"value"``."""

    @property
    def validation_schedule(self) -> ValidationSchedule: ...

    # ------------------------------------------------------------------ processes
    @property
    def world_size(self) -> int: ...

    @property
    def global_rank(self) -> int: ...

    @property
    def local_rank(self) -> int: ...

    @property
    def is_global_zero(self) -> bool: ...

    @property
    def accelerator(self) -> Accelerator: ...

    @property
    def strategy(self) -> Strategy:
        """For collectives (``broadcast_object``, ...): every process must call them, the same number of times."""

    # ------------------------------------------------------------------ metrics and logging
    @property
    def callback_metrics(self) -> dict[str, Any]:
        """Everything logged, latest values."""

    @property
    def logged_metrics(self) -> dict[str, Any]: ...

    @property
    def progress_bar_metrics(self) -> dict[str, Any]: ...

    @property
    def logger(self) -> GeneralTracker | None: ...

    @property
    def loggers(self) -> list[GeneralTracker]: ...

    @property
    def log_dir(self) -> str: ...

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        """Log values computed outside ``self.log`` (a callback's learning rates, throughput, ...)."""

    def warn_if_nonfinite(self, values: dict[str, float], *, synchronized: bool = False) -> None:
        """Warn once per fit when a training value already read to the host (logged, shown) is NaN or inf, or (where
        values were read, or ``synchronized``) a loss trained on since the fit started was."""

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on the global main process only."""

    @overload
    def run_tuner(self, finder: LearningRateFinder, module: TrainModule) -> LRFinder | None: ...
    @overload
    def run_tuner(self, finder: BatchSizeFinder, module: TrainModule) -> int | None: ...
    def run_tuner(self, finder: LearningRateFinder | BatchSizeFinder, module: TrainModule) -> LRFinder | int | None:
        """Run a `LearningRateFinder`'s or `BatchSizeFinder`'s search now (from its hook); returns what it found."""

    accumulate_grad_batches: int
    """Batches per optimizer step; `GradientAccumulationScheduler` sets it at each epoch's start."""

    # ------------------------------------------------------------------ the run's objects and files
    @property
    def lightning_module(self) -> TrainModule | None: ...

    @property
    def datamodule(self) -> DataModule | None: ...

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]: ...

    @property
    def lr_scheduler_configs(self) -> list[LRSchedulerConfig]: ...

    @property
    def checkpoint_callback(self) -> ModelCheckpoint | None: ...

    @property
    def project_dir(self) -> str: ...

    @property
    def checkpoints(self) -> CheckpointStore:
        """The run's checkpoint store: `after_commit` queues bookkeeping behind the save in flight."""

    def save_checkpoint(
        self, dirpath: str | os.PathLike[str], weights_only: bool = False, storage_options: None = None, *, async_save: bool | None = None,
    ) -> Path | PendingSave:
        """Write a complete checkpoint directory (every process must call it); `async_save` None: the trainer's default.
        Returns the directory, or with `async_save` the handle of its background write."""

    @property
    def agreement(self) -> LoopAgreement:
        """Decisions the processes agree on at scheduled batches, without a collective per batch (`trainer.fit.agreement`)."""


class ModuleTrainerView(TrainerView, Protocol):
    """The `Trainer` as a `TrainModule` sees it (``self.trainer``): what callbacks see, and what ``self.log``,
    ``self.manual_backward`` and ``opt.step()`` of manual optimization call."""

    def log_value(
        self, name: str, value: Any, on_step: bool | None = None, on_epoch: bool | None = None, prog_bar: bool = False,
        logger: bool = True, sync_dist: bool = False, reduce_fx: str | Callable[..., object] = "mean",
        batch_size: int | None = None, add_dataloader_idx: bool = True, enable_graph: bool = False, sync_dist_group: ProcessGroup | None = None,
        metric_attribute: str | None = None, rank_zero_only: bool = False,
    ) -> None:
        """What ``self.log`` records (``TrainModule.log`` has the semantics); it passes the arguments positionally."""

    def manual_backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``self.manual_backward(loss)``: backward between ``on_before_backward`` and ``on_after_backward``."""

    def step_manual_optimizer(self, optimizer: ManualOptimizer, closure: Callable[[], Any] | None = None) -> None:
        """``opt.step(closure)`` in manual optimization: ``on_before_optimizer_step``, the step, one more `global_step`."""
