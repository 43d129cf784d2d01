"""``lightning.pytorch.core`` under the rename: ``LightningModule`` is `TrainModule`, ``LightningDataModule`` is
`DataModule`."""

from __future__ import annotations

from trainer.fit.datamodule import DataModule
from trainer.fit.module import TrainModule

__all__ = ["DataModule", "TrainModule"]
