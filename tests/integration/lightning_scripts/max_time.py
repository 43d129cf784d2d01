"""max_time stops a fit whose epochs are far longer than the limit, inside the first epoch: the Timer callback that
max_time adds signals the stop, the epoch ends there, and ModelCheckpoint saves at that step."""
import json
import os
import time

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint, Timer
from torch.utils.data import DataLoader, TensorDataset


class Slow(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.epochs_started = []
        self.validations = 0

    def on_train_epoch_start(self):
        self.epochs_started.append(self.current_epoch)

    def training_step(self, batch, batch_idx):
        time.sleep(0.02)
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        self.validations += 1
        self.log("val_loss", self.layer(batch[0]).pow(2).mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def run(max_time, val):
    pl.seed_everything(0, verbose=False)
    module = Slow()
    checkpoint = ModelCheckpoint(dirpath=f"ckpts_{val}")
    trainer = pl.Trainer(max_time=max_time, accelerator="cpu", logger=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, callbacks=[checkpoint])
    loader = DataLoader(TensorDataset(torch.randn(2000, 2)), batch_size=1)  # 2000 steps of 20 ms: 40 s an epoch
    start = time.monotonic()
    trainer.fit(module, loader, DataLoader(TensorDataset(torch.randn(4, 2)), batch_size=2) if val else None)
    timers = [c for c in trainer.callbacks if isinstance(c, Timer)]
    return {"seconds": time.monotonic() - start, "global_step": trainer.global_step, "current_epoch": trainer.current_epoch,
            "epochs_started": module.epochs_started, "should_stop": trainer.should_stop, "timers": len(timers),
            "train_elapsed": timers[0].time_elapsed("train"), "time_remaining": timers[0].time_remaining("train"),
            "validations": module.validations, "files": sorted(os.listdir(f"ckpts_{val}")),
            "best_model_path": os.path.basename(checkpoint.best_model_path), "max_epochs": trainer.max_epochs}


if __name__ == "__main__":
    print(json.dumps({"dict": run({"seconds": 1}, val=False), "string": run("00:00:00:01", val=True)}))
