"""The loaders of a `Trainer`'s run: the prepared train loader of a fit, its validation loaders and their limits,
the evaluation loaders, and the data preparation before them (Lightning's ``prepare_data``/``setup`` order).

A fit's train loader is prepared like an `Accelerator`'s (sharded, its position checkpointed with the run); the
evaluation loaders are sharded without padding (every sample seen once) and are not checkpointed.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from callbacks.base import overrides
from strategies.checkpoint_formats import rng_kept
from trainer.fit import loops
from trainer.fit.combined_loader import CombinedLoader
from trainer.fit.module import TrainModule

if TYPE_CHECKING:
    from trainer.fit.datamodule import DataModule
    from trainer.fit.trainer import Trainer


class RunLoaders:
    """The loaders of `trainer`'s runs (``trainer.loaders``)."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.train: Any = None  # the prepared train loader of the running (or last) fit
        self.sources: tuple[Any, Any] = (None, None)  # the loaders passed to the running fit (None: the module's/datamodule's)
        self.stale = False  # a BatchSizeFinder changed the batch size in on_fit_start: build the loaders again
        self.val_limits: list[int | float] = []  # validation batches per loader of the running fit
        self.moves_batches = False  # the module or DataModule overrides a batch-transfer hook (trainer.fit.transfer)

    def train_step_batches(self) -> Iterator[Any]:
        """One pass over the prepared train loader, each batch as ``training_step`` gets it: a `CombinedLoader` yields
        ``(batch, batch_idx, dataloader_idx)``, the step its combined batch only."""
        if self.train is None:
            raise RuntimeError("there is no training loader outside a fit: call this from a callback hook of a running fit")
        if isinstance(self.train, CombinedLoader):
            return (batch for batch, _, _ in self.train)
        return iter(self.train)

    def build_fit(self, module: TrainModule, train_dataloaders: Any, val_dataloaders: Any, *, reload: bool = False) -> list[Any] | None:
        """Prepare the train loader (``self.train``) and return the validation loaders of a fit.

        `reload` (``reload_dataloaders_every_n_epochs``): ask the module/DataModule for them again and replace the
        train loader in the checkpointed loader states.
        """
        given = loops.loader_from(module, "train", train_dataloaders, required=True, datamodule=self.trainer.datamodule)
        combined = given if isinstance(given, CombinedLoader) else None  # several loaders: each prepared as one would be
        parts = list(combined.flattened) if combined is not None else [given]
        length = loops.num_batches(given)
        if math.isinf(length) and combined is not None:
            raise ValueError(
                "a CombinedLoader of training loaders needs loaders with a length (one has none: an IterableDataset without "
                "__len__); give its data set a __len__, or train on that loader alone"
            )
        if math.isinf(length):  # a stream: a fraction of its epoch is unknown (Lightning's rule), refused before any work
            loops.refuse_fraction("limit_train_batches", self.trainer.args.limit_train_batches)
            loops.refuse_fraction("val_check_interval", self.trainer.val_check_interval)
        for part in parts:
            if loops.num_batches(part) == 0:
                raise ValueError(
                    f"the train dataloader has no batches (dataset of {len(part.dataset)} samples, batch_size={part.batch_size}, "
                    f"drop_last={part.drop_last}); fit would take 0 steps. Pass a non-empty dataset, a smaller batch_size, or drop_last=False"
                )
        if self.trainer.args.overfit_batches:
            parts = [loops.unshuffled(part, "train") for part in parts]
        if reload:
            old = self.train
            for part in old.flattened if isinstance(old, CombinedLoader) else [old]:
                self.trainer.accelerator.prepared.forget(part)
        prepared = [self.trainer.accelerator.prepare_data_loader(part, device_placement=not self.moves_batches, shard=self.trainer.args.use_distributed_sampler)
                    for part in parts]
        if combined is not None:
            combined.flattened = prepared
        self.train = combined if combined is not None else prepared[0]
        self.trainer.num_training_batches = loops.limit_batches(
            loops.num_batches(self.train), self.trainer.args.limit_train_batches, "limit_train_batches"
        )
        if self.trainer.num_training_batches == 0:
            warnings.warn(f"limit_train_batches={self.trainer.args.limit_train_batches!r} leaves no training batch: fit only validates", stacklevel=4)
        val_loaders = self.fit_val_loaders(module, val_dataloaders)
        limit = self.trainer.args.limit_val_batches
        self.val_limits = [loops.limit_batches(loops.num_batches(loader), limit, "limit_val_batches") for loader in val_loaders or []]
        self.trainer.num_val_batches = one_or_list(self.val_limits)
        return val_loaders

    def reload_resumed(self, module: TrainModule, train_dataloaders: Any, val_dataloaders: Any) -> list[Any] | None:
        """A resumed fit with ``reload_dataloaders_every_n_epochs``: ask for the loaders again at the restored epoch (after
        the restore, as Lightning does), keeping the restored position and the restored RNGs (the uninterrupted run drew
        nothing here)."""
        position = self.train.state_dict() if hasattr(self.train, "state_dict") else None
        with rng_kept():
            val_loaders = self.build_fit(module, train_dataloaders, val_dataloaders, reload=True)
        if position is not None and hasattr(self.train, "load_state_dict"):
            self.train.load_state_dict(position)
        return val_loaders

    def fit_val_loaders(self, module: TrainModule, val_dataloaders: Any) -> list[Any] | None:
        """The sharded validation loaders of a fit, or None when there is nothing to validate."""
        val = None
        if overrides(module, "validation_step", TrainModule):
            val = loops.loader_from(module, "val", val_dataloaders, required=False, datamodule=self.trainer.datamodule)
        if val_dataloaders is not None and val is None:
            warnings.warn(f"val_dataloaders were passed but {type(module).__name__} has no validation_step; validation is skipped", stacklevel=6)
        limit = self.trainer.args.limit_val_batches
        if val is not None and all(loops.limit_batches(loops.num_batches(loader), limit, "limit_val_batches") == 0 for loader in val):
            val = None  # decided from the unsharded loaders, so every process agrees (a process may hold no batch)
        if val is not None and self.trainer.args.overfit_batches:
            val = [loops.unshuffled(loader, "val") for loader in val]
        return [self.eval_loader(loader) for loader in val] if val is not None else None

    def eval_loader(self, loader: Any) -> Any:
        """Shard an evaluation loader without padding (every sample seen once), outside the checkpointed loaders."""
        return self.trainer.accelerator.prepare_data_loader(
            loader, device_placement=not self.moves_batches, even_batches=False, register=False, shard=self.trainer.args.use_distributed_sampler
        )

    def prepare_data(self, module: TrainModule, datamodule: DataModule | None) -> None:
        """Lightning's ``prepare_data``: the datamodule's, then the module's (when it defines one), each on local rank 0
        of each machine, or on global rank 0 only where its ``prepare_data_per_node`` is False; the others wait."""
        own = overrides(module, "prepare_data", TrainModule)
        if datamodule is None and not own:
            return

        def preparing(owner: Any) -> bool:
            return self.trainer.local_rank == 0 if getattr(owner, "prepare_data_per_node", True) else self.trainer.global_rank == 0

        if datamodule is not None and preparing(datamodule):
            datamodule.trainer = self.trainer
            datamodule.prepare_data()
        if own and preparing(module):
            module.prepare_data()
        if self.trainer.world_size > 1:
            self.trainer.accelerator.wait_for_everyone()  # the others wait for the data rank 0 of their machine prepared

    def setup_datamodule(self, datamodule: DataModule, stage: str) -> None:
        datamodule.trainer = self.trainer
        datamodule.setup(stage)


def one_or_list(limits: list[int | float]) -> int | float | list[int | float]:
    """``num_val_batches`` and friends: the count of one loader (0 without any), or one count per loader."""
    return limits[0] if len(limits) == 1 else (limits or 0)


def one_data_source(datamodule: DataModule | None, *loaders: Any) -> None:
    if datamodule is not None and any(loader is not None for loader in loaders):
        raise ValueError("pass either dataloaders or datamodule=, not both; the datamodule's *_dataloader() methods give the loaders")
    if datamodule is not None and not all(hasattr(datamodule, m) for m in ("setup", "train_dataloader", "prepare_data")):
        raise TypeError(f"datamodule must be a trainer.DataModule, got {type(datamodule).__name__}; subclass trainer.DataModule")
