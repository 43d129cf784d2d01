"""A LightningDataModule: prepare_data writes the data once, setup(stage) reads it, teardown is called."""
import json
import os

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

CALLS = []


class NumbersData(pl.LightningDataModule):
    def __init__(self, batch_size=8):
        super().__init__()
        self.save_hyperparameters()

    def prepare_data(self):
        CALLS.append("prepare_data")
        if not os.path.exists("numbers.pt"):
            g = torch.Generator().manual_seed(1)
            x = torch.randn(80, 4, generator=g)
            torch.save({"x": x, "y": x @ torch.tensor([1.0, -2.0, 0.5, 3.0])}, "numbers.pt")

    def setup(self, stage):
        CALLS.append(f"setup:{stage}")
        data = torch.load("numbers.pt")
        self.train, self.val = TensorDataset(data["x"][:64], data["y"][:64]), TensorDataset(data["x"][64:], data["y"][64:])

    def train_dataloader(self):
        return DataLoader(self.train, batch_size=self.hparams.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val, batch_size=self.hparams.batch_size)

    def test_dataloader(self):
        return DataLoader(self.val, batch_size=self.hparams.batch_size)

    def teardown(self, stage):
        CALLS.append(f"teardown:{stage}")


class Regressor(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.layer(x).squeeze(1), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_mse", nn.functional.mse_loss(self.layer(x).squeeze(1), y))

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_mse", nn.functional.mse_loss(self.layer(x).squeeze(1), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    pl.seed_everything(7)
    dm = NumbersData(batch_size=16)
    model = Regressor()
    trainer = pl.Trainer(max_epochs=20, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(model, datamodule=dm)
    (result,) = trainer.test(model, datamodule=dm)
    print(json.dumps({"calls": CALLS, "global_step": trainer.global_step, "test_mse": result["test_mse"],
                      "batch_size": dm.hparams.batch_size}))
