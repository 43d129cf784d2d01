"""The loop knobs: limit_*_batches, val_check_interval, check_val_every_n_epoch, num_sanity_val_steps, max_steps,
and overfit_batches."""
import json

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Counter(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(2, 1)
        self.train_batches, self.val_batches, self.sanity_batches, self.validations = 0, 0, 0, []

    def training_step(self, batch, batch_idx):
        self.train_batches += 1
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        if self.trainer.sanity_checking:
            self.sanity_batches += 1
        else:
            self.val_batches += 1
        self.log("val_loss", self.layer(batch[0]).pow(2).mean())

    def on_validation_epoch_end(self):
        if not self.trainer.sanity_checking:
            self.validations.append((self.current_epoch, self.global_step))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def run(**flags):
    model = Counter()
    train = DataLoader(TensorDataset(torch.randn(32, 2)), batch_size=4)  # 8 batches
    val = DataLoader(TensorDataset(torch.randn(20, 2)), batch_size=4)  # 5 batches
    trainer = pl.Trainer(accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False, **flags)
    trainer.fit(model, train, val)
    return {"global_step": trainer.global_step, "epoch": trainer.current_epoch, "train": model.train_batches, "val": model.val_batches,
            "sanity": model.sanity_batches, "validations": model.validations}


if __name__ == "__main__":
    pl.seed_everything(0)
    print(json.dumps({
        "limits": run(max_epochs=3, limit_train_batches=6, limit_val_batches=2, val_check_interval=3, num_sanity_val_steps=1),
        "every_2": run(max_epochs=4, check_val_every_n_epoch=2, limit_val_batches=0.4, num_sanity_val_steps=0),
        "max_steps": run(max_steps=11, val_check_interval=0.5, num_sanity_val_steps=-1),
        "overfit": run(max_epochs=2, overfit_batches=2, num_sanity_val_steps=0),
    }))
