"""save_last=True, then a script opens ``ckpts/last.ckpt``: load_from_checkpoint, and a new run resumed from it."""
import json
import os

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Model(pl.LightningModule):
    def __init__(self, lr=0.05):
        super().__init__()
        self.save_hyperparameters()
        self.layer = nn.Linear(3, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def loader():
    x = torch.randn(24, 3, generator=torch.Generator().manual_seed(2))
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)


def trainer(epochs):
    return pl.Trainer(max_epochs=epochs, accelerator="cpu", default_root_dir=".", enable_progress_bar=False, logger=False,
                      callbacks=[ModelCheckpoint(dirpath="ckpts", save_last=True)])


if __name__ == "__main__":
    pl.seed_everything(0)
    model = Model()
    trainer(2).fit(model, loader())
    loaded = Model.load_from_checkpoint("ckpts/last.ckpt")
    same = all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))
    resumed = trainer(3)
    resumed.fit(Model(), loader(), ckpt_path="ckpts/last.ckpt")
    print(json.dumps({"exists": os.path.exists("ckpts/last.ckpt"), "loaded_same": same, "lr": loaded.hparams.lr,
                      "resumed_step": resumed.global_step}))
