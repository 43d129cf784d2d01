"""EarlyStopping asks to stop after epoch 1 (lr=0: the validation loss never improves, patience 1), but min_epochs=5
(or min_steps) holds the stop: training continues until the minimum is met, then stops there."""
import json

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import EarlyStopping
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Frozen(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(2, 1)
        self.validated = []

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self.layer(batch[0]).pow(2).mean())

    def on_validation_epoch_end(self):
        if not self.trainer.sanity_checking:
            self.validated.append([self.current_epoch, self.global_step])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


def run(**limits):
    pl.seed_everything(0, verbose=False)
    loader = DataLoader(TensorDataset(torch.randn(16, 2)), batch_size=4)
    stopper = EarlyStopping(monitor="val_loss", patience=1, mode="min")
    module = Frozen()
    trainer = pl.Trainer(max_epochs=50, accelerator="cpu", callbacks=[stopper], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, **limits)
    trainer.fit(module, loader, loader)
    return {"stopped_epoch": stopper.stopped_epoch, "current_epoch": trainer.current_epoch, "global_step": trainer.global_step,
            "should_stop": trainer.should_stop, "wait_count": stopper.wait_count, "validated": module.validated}


if __name__ == "__main__":
    print(json.dumps({"no_minimum": run(), "min_epochs": run(min_epochs=5), "min_steps": run(min_steps=22),
                      "min_steps_half_epoch": run(min_steps=10, val_check_interval=2)}))
