"""Learning-rate schedulers: a step-interval scheduler with frequency 2 and an epoch one, watched by LearningRateMonitor."""
import csv
import json
import os

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import LearningRateMonitor
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Model(pl.LightningModule):
    def __init__(self, interval, frequency):
        super().__init__()
        self.layer = nn.Linear(3, 1)
        self.interval, self.frequency = interval, frequency

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=1.0)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        return {"optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "interval": self.interval, "frequency": self.frequency, "name": "my_lr"}}


if __name__ == "__main__":
    pl.seed_everything(0)
    loader = DataLoader(TensorDataset(torch.randn(24, 3), torch.randn(24, 1)), batch_size=4)  # 6 batches
    results = {}
    for interval, frequency in (("step", 2), ("epoch", 1), ("epoch", 2)):
        monitor = LearningRateMonitor(logging_interval=interval)
        model = Model(interval, frequency)
        trainer = pl.Trainer(max_epochs=4, accelerator="cpu", callbacks=[monitor], default_root_dir=f"run_{interval}_{frequency}",
                             log_every_n_steps=1, enable_checkpointing=False, enable_progress_bar=False)
        trainer.fit(model, loader)
        with open(os.path.join(trainer.logger.log_dir, "metrics.csv")) as f:
            rows = list(csv.DictReader(f))
        results[f"{interval}/{frequency}"] = {"lr": trainer.optimizers[0].param_groups[0]["lr"], "global_step": trainer.global_step,
                                               "logged": [(int(r["step"]), float(r["my_lr"])) for r in rows if r.get("my_lr")]}
    print(json.dumps(results))
