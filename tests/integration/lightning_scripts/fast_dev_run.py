"""fast_dev_run: one batch of each stage, nothing written."""
import json
import os

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(2, 1)
        self.calls = {"train": 0, "val": 0, "test": 0, "predict": 0}

    def training_step(self, batch, batch_idx):
        self.calls["train"] += 1
        loss = self.layer(batch[0]).pow(2).mean()
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self.calls["val"] += 1
        self.log("val_loss", self.layer(batch[0]).pow(2).mean())

    def test_step(self, batch, batch_idx):
        self.calls["test"] += 1

    def predict_step(self, batch, batch_idx):
        self.calls["predict"] += 1
        return self.layer(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


if __name__ == "__main__":
    loader = DataLoader(TensorDataset(torch.randn(32, 2)), batch_size=4)
    model = Model()
    trainer = pl.Trainer(fast_dev_run=True, accelerator="cpu", default_root_dir="run", max_epochs=10,
                         callbacks=[ModelCheckpoint(monitor="val_loss"), EarlyStopping(monitor="val_loss")])
    trainer.fit(model, loader, loader)
    trainer.test(model, loader)
    predictions = trainer.predict(model, loader)
    print(json.dumps({"calls": model.calls, "global_step": trainer.global_step, "predictions": len(predictions),
                      "written": sorted(os.listdir("run")) if os.path.exists("run") else []}))
