"""Lightning's batch-transfer hooks: ``on_before_batch_transfer`` -> ``transfer_batch_to_device`` ->
``on_after_batch_transfer``, on every batch of every loader, when the module or the DataModule overrides one.

Otherwise the prepared loaders move batches to the device themselves and none of this runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from callbacks.base import overrides
from trainer.fit.datamodule import DataModule
from trainer.fit.module import TrainModule

if TYPE_CHECKING:
    from trainer.fit.trainer import Trainer

_TRANSFER_HOOKS = ("on_before_batch_transfer", "transfer_batch_to_device", "on_after_batch_transfer")


def _transfer_hook(trainer: Trainer, name: str) -> Any:
    """The DataModule's batch-transfer hook `name` when its class overrides it, else the module's (as Lightning)."""
    if overrides(trainer.datamodule, name, DataModule):
        return getattr(trainer.datamodule, name)
    return getattr(trainer.attached_module, name)


def moves_batches_itself(trainer: Trainer) -> bool:
    """True when the module or the DataModule overrides a batch-transfer hook: the loaders then leave batches where
    they are, and `transfer_batch` moves them."""
    return any(
        overrides(trainer.attached_module, name, TrainModule) or overrides(trainer.datamodule, name, DataModule)
        for name in _TRANSFER_HOOKS
    )


def transfer_batch(trainer: Trainer, batch: Any, dataloader_idx: int) -> Any:
    """Lightning's ``on_before_batch_transfer`` -> ``transfer_batch_to_device`` -> ``on_after_batch_transfer``."""
    batch = _transfer_hook(trainer, "on_before_batch_transfer")(batch, dataloader_idx)
    batch = _transfer_hook(trainer, "transfer_batch_to_device")(batch, trainer.accelerator.device, dataloader_idx)
    return _transfer_hook(trainer, "on_after_batch_transfer")(batch, dataloader_idx)
