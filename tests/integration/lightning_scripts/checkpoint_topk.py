"""ModelCheckpoint keeping the top 2 by val_loss, with a filename template, plus save_last."""
import json
import os

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(4, 1)
        self.val_losses = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.layer(x), y))

    def on_validation_epoch_end(self):
        if not self.trainer.sanity_checking:
            self.val_losses.append(float(self.trainer.callback_metrics["val_loss"]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


if __name__ == "__main__":
    pl.seed_everything(3)
    x = torch.randn(64, 4)
    y = x.sum(1, keepdim=True)
    train = DataLoader(TensorDataset(x[:48], y[:48]), batch_size=8)
    val = DataLoader(TensorDataset(x[48:], y[48:]), batch_size=8)
    checkpoint = ModelCheckpoint(dirpath="ckpts", filename="model-{epoch:02d}-{val_loss:.3f}", monitor="val_loss", mode="min",
                                 save_top_k=2, save_last=True)
    model = Model()
    trainer = pl.Trainer(max_epochs=4, accelerator="cpu", callbacks=[checkpoint], logger=False, enable_progress_bar=False)
    trainer.fit(model, train, val)
    print(json.dumps({
        "best_model_path": checkpoint.best_model_path, "best_model_score": float(checkpoint.best_model_score),
        "best_k_models": {os.path.basename(k): float(v) for k, v in checkpoint.best_k_models.items()},
        "last_model_path": checkpoint.last_model_path, "files": sorted(os.listdir("ckpts")), "val_losses": model.val_losses,
    }))
