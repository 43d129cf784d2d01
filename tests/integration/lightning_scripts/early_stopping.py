"""EarlyStopping on a validation loss that stops improving (lr=0): training ends after `patience` epochs."""
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

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self.layer(batch[0]).pow(2).mean(), prog_bar=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


if __name__ == "__main__":
    pl.seed_everything(0)
    loader = DataLoader(TensorDataset(torch.randn(16, 2)), batch_size=4)
    stopper = EarlyStopping(monitor="val_loss", patience=2, mode="min")
    trainer = pl.Trainer(max_epochs=50, accelerator="cpu", callbacks=[stopper], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False)
    trainer.fit(Frozen(), loader, loader)
    print(json.dumps({"stopped_epoch": stopper.stopped_epoch, "current_epoch": trainer.current_epoch,
                      "global_step": trainer.global_step, "should_stop": trainer.should_stop, "wait_count": stopper.wait_count}))
