"""A LightningCLI project: the module, the datamodule and a callback here; the config (cli_config.yaml) picks two
callbacks, the optimizer and the scheduler by class path. Run as ``python cli_main.py fit|test --config cli_config.yaml``;
the last output line is the JSON of what the run did."""
import json

import torch
from lightning.pytorch import Callback, LightningDataModule, LightningModule
from lightning.pytorch.cli import LightningCLI
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class RegressionData(LightningDataModule):
    def __init__(self, batch_size: int = 8, num_samples: int = 64):
        super().__init__()
        self.batch_size, self.num_samples = batch_size, num_samples

    def setup(self, stage):
        g = torch.Generator().manual_seed(3)
        x = torch.randn(self.num_samples + 16, 4, generator=g)
        y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0])
        self.train = TensorDataset(x[: self.num_samples], y[: self.num_samples])
        self.val = TensorDataset(x[self.num_samples :], y[self.num_samples :])

    def train_dataloader(self):
        return DataLoader(self.train, batch_size=self.batch_size)

    def val_dataloader(self):
        return DataLoader(self.val, batch_size=self.batch_size)

    def test_dataloader(self):
        return DataLoader(self.val, batch_size=self.batch_size)


class Regressor(LightningModule):
    def __init__(self, hidden: int = 8, in_features: int = 4):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(in_features, hidden), nn.Tanh(), nn.Linear(hidden, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x).squeeze(1), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x).squeeze(1), y))

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", nn.functional.mse_loss(self.net(x).squeeze(1), y))


class CountBatches(Callback):
    def __init__(self, label: str = "batches"):
        self.label, self.train_batches = label, 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.train_batches += 1


class RegressionCLI(LightningCLI):
    def add_arguments_to_parser(self, parser):
        parser.link_arguments("data.num_samples", "model.hidden", compute_fn=lambda n: n // 8)


if __name__ == "__main__":
    cli = RegressionCLI(Regressor, RegressionData)
    trainer = cli.trainer
    counters = [c for c in trainer.callbacks if isinstance(c, CountBatches)]
    print(json.dumps({
        "subcommand": cli.subcommand,
        "global_step": trainer.global_step,
        "metrics": {k: round(float(v), 6) for k, v in trainer.callback_metrics.items()},
        "lr": trainer.optimizers[0].param_groups[0]["lr"] if trainer.optimizers else None,
        "hidden": cli.model.hparams.hidden,
        "callbacks": sorted(type(c).__name__ for c in trainer.callbacks if type(c).__name__ in ("CountBatches", "EarlyStopping", "ModelCheckpoint")),
        "counted": counters[0].train_batches if counters else None,
        "seed": cli.config[cli.subcommand]["seed_everything"],
    }))
