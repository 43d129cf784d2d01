"""A LightningModule with validation, test and predict steps, trained on its own *_dataloader methods."""
import json

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Classifier(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(96, 8, generator=g)
        self.y = (self.x.sum(1) > 0).long()

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.cross_entropy(self(x), y))

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_acc", (self(x).argmax(1) == y).float().mean())

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        return self(batch[0]).argmax(1)

    def train_dataloader(self):
        return DataLoader(TensorDataset(self.x[:64], self.y[:64]), batch_size=16, shuffle=True)

    def val_dataloader(self):
        return DataLoader(TensorDataset(self.x[64:], self.y[64:]), batch_size=16)

    def test_dataloader(self):
        return self.val_dataloader()

    def predict_dataloader(self):
        return DataLoader(TensorDataset(self.x[64:]), batch_size=10)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.05)


if __name__ == "__main__":
    pl.seed_everything(0)
    model = Classifier()
    trainer = pl.Trainer(max_epochs=3, accelerator="cpu", default_root_dir=".", enable_progress_bar=False)
    trainer.fit(model)
    fit_metrics = sorted(trainer.callback_metrics)
    (test,) = trainer.test(model)
    predictions = trainer.predict(model)
    print(json.dumps({"global_step": trainer.global_step, "epoch": trainer.current_epoch, "test": test,
                      "predicted": sum(len(p) for p in predictions), "batches": len(predictions),
                      "fit_metrics": fit_metrics}))
