"""self.log in its forms (on_step/on_epoch, prog_bar, log_dict, a torchmetrics object) written by CSVLogger."""
import csv
import json
import os

import lightning.pytorch as pl
import torch
import torchmetrics
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Classifier(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(6, 3)
        self.train_acc = torchmetrics.Accuracy(task="multiclass", num_classes=3)
        self.val_acc = torchmetrics.Accuracy(task="multiclass", num_classes=3)

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        loss = nn.functional.cross_entropy(logits, y)
        self.train_acc(logits, y)
        self.log("train_loss", loss, on_step=True, on_epoch=True, prog_bar=True)
        self.log("train_acc", self.train_acc, on_step=False, on_epoch=True)
        self.log_dict({"a": 1.0, "b": float(batch_idx)}, on_step=True, on_epoch=False)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        self.val_acc.update(logits, y)
        self.log("val_loss", nn.functional.cross_entropy(logits, y), sync_dist=True)
        self.log("val_acc", self.val_acc)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    pl.seed_everything(0)
    x, y = torch.randn(40, 6), torch.randint(0, 3, (40,))
    logger = CSVLogger(save_dir="logs", name="metrics_run")
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", logger=logger, log_every_n_steps=2, enable_checkpointing=False,
                         enable_progress_bar=False)
    trainer.fit(Classifier(), DataLoader(TensorDataset(x[:32], y[:32]), batch_size=4), DataLoader(TensorDataset(x[32:], y[32:]), batch_size=4))
    with open(os.path.join(logger.log_dir, "metrics.csv")) as f:
        rows = list(csv.DictReader(f))
    print(json.dumps({"log_dir": logger.log_dir, "columns": sorted(rows[0]), "rows": rows,
                      "callback_metrics": {k: float(v) for k, v in trainer.callback_metrics.items()},
                      "progress_bar": sorted(trainer.progress_bar_metrics), "logged": sorted(trainer.logged_metrics)}))
