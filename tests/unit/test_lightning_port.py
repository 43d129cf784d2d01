"""A Lightning 2.x script after the import rename only: the pieces of a port working together.

The Lightning original would import ``lightning.pytorch as L`` and use ``L.LightningModule``,
``L.LightningDataModule``, ``L.Trainer``, ``lightning.pytorch.callbacks`` and ``lightning.pytorch.loggers``.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback
from callbacks.checkpoint import ModelCheckpoint
from callbacks.early_stopping import EarlyStopping
from callbacks.lr_monitor import LearningRateMonitor
from callbacks.trackers import CSVLogger
from trainer import DataModule as LightningDataModule
from trainer import Trainer, seed_everything
from trainer import TrainModule as LightningModule


class Data(LightningDataModule):
    def setup(self, stage: str) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(32, 4, generator=g)
        self.y = self.x.sum(1, keepdim=True)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(self.x, self.y), batch_size=8)

    def val_dataloader(self) -> list[DataLoader]:
        return [DataLoader(TensorDataset(self.x[:16], self.y[:16]), batch_size=8),
                DataLoader(TensorDataset(self.x[16:], self.y[16:]), batch_size=8)]

    def test_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(self.x, self.y), batch_size=16)

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        x, y = batch
        return x.float(), y.float()


class Regressor(LightningModule):
    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, on_step=True, on_epoch=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y), add_dataloader_idx=False)
        self.log("val_mse", torch.nn.functional.mse_loss(self.net(x), y), on_step=True)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("test_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def on_train_epoch_end(self) -> None:
        self.log("epoch_marker", float(self.current_epoch))

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=self.hparams.lr)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, 0.5), "interval": "epoch"}}


class SeesTheModulesEpochValue(Callback):
    _monitors_metrics = True  # Lightning: a Checkpoint/EarlyStopping subclass; here the flag they carry

    def __init__(self) -> None:
        self.markers: list[float] = []

    def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
        self.markers.append(float(trainer.callback_metrics["epoch_marker"]))


def test_a_lightning_script_runs_after_the_rename(tmp_path: Path) -> None:
    seed_everything(0)
    checkpoint = ModelCheckpoint(monitor="val_loss", save_top_k=1, save_last=True)
    sees = SeesTheModulesEpochValue()
    logger = CSVLogger(tmp_path / "logs", name="port")
    trainer = Trainer(default_root_dir=tmp_path, accelerator="cpu", max_epochs=3, logger=logger, log_every_n_steps=2,
                      callbacks=[checkpoint, EarlyStopping(monitor="val_loss", patience=5), LearningRateMonitor(), sees],
                      enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Regressor(), datamodule=Data())
    assert trainer.global_step == 12 and sees.markers == [0.0, 1.0, 2.0]
    assert Path(checkpoint.last_model_path).name == "last-epoch=2-step=12"
    assert checkpoint.best_model_path != checkpoint.last_model_path
    rows = list(csv.DictReader((Path(logger.log_dir) / "metrics.csv").read_text().splitlines()))
    steps = [int(row["step"]) for row in rows if row["train_loss_step"]]
    assert steps == [1, 3, 5, 7, 9, 11]  # Lightning's steps with log_every_n_steps=2
    assert [row["epoch"] for row in rows if row["lr-SGD"]] == ["", "", ""]  # the monitor's rows carry no epoch
    val_steps = [(row["step"], row["epoch"]) for row in rows if row.get("val_mse_step/dataloader_idx_1")]
    assert val_steps == [(str(i), "") for i in range(6)]  # per loader: its evaluation batches of this fit so far
    assert {"val_loss", "val_mse_epoch/dataloader_idx_0", "val_mse_epoch/dataloader_idx_1"} <= set(trainer.callback_metrics)
    (result,) = trainer.test(ckpt_path="best", datamodule=Data())
    assert set(result) == {"test_loss"}
