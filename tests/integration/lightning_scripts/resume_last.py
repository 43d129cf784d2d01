"""Resume from "last": 2 epochs, then a new Trainer continues to 4 with ckpt_path="last"; the weights equal a
straight 4-epoch run."""
import json

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(3, 1)
        self.epochs_started = []

    def on_train_epoch_start(self):
        self.epochs_started.append(self.current_epoch)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=0.01)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)]


def loader():
    g = torch.Generator().manual_seed(5)
    x = torch.randn(40, 3, generator=g)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8, shuffle=True)


def trainer(root, epochs):
    return pl.Trainer(max_epochs=epochs, accelerator="cpu", default_root_dir=root, enable_progress_bar=False,
                      callbacks=[ModelCheckpoint(dirpath=f"{root}/ckpts", save_last=True)])


if __name__ == "__main__":
    pl.seed_everything(1)
    straight = Model()
    trainer("straight", 4).fit(straight, loader())

    pl.seed_everything(1)
    first = Model()
    trainer("resumed", 2).fit(first, loader())
    pl.seed_everything(123)  # a different seed: the checkpoint restores the RNG and data order
    second = Model()
    resumed = trainer("resumed", 4)
    resumed.fit(second, loader(), ckpt_path="last")
    same = all(torch.equal(a, b) for a, b in zip(straight.state_dict().values(), second.state_dict().values()))
    print(json.dumps({"global_step": resumed.global_step, "epochs_started": second.epochs_started, "same_weights": same,
                      "lr": resumed.optimizers[0].param_groups[0]["lr"]}))
