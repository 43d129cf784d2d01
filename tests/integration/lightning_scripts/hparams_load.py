"""save_hyperparameters, then load_from_checkpoint (with an override) from the best checkpoint."""
import json

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Model(pl.LightningModule):
    def __init__(self, hidden=8, lr=0.05, activation="relu"):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(3, hidden), nn.ReLU() if activation == "relu" else nn.Tanh(), nn.Linear(hidden, 1))

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


if __name__ == "__main__":
    pl.seed_everything(0)
    x = torch.randn(48, 3)
    loader = DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)
    checkpoint = ModelCheckpoint(monitor="val_loss", save_top_k=1, save_last=True)
    model = Model(hidden=12, activation="tanh")
    trainer = pl.Trainer(max_epochs=3, accelerator="cpu", callbacks=[checkpoint], default_root_dir=".", enable_progress_bar=False)
    trainer.fit(model, loader, loader)
    last = Model.load_from_checkpoint(checkpoint.last_model_path)
    same_weights = all(torch.equal(a, b) for a, b in zip(last.state_dict().values(), model.state_dict().values()))
    best = Model.load_from_checkpoint(checkpoint.best_model_path, lr=0.5)
    probe = torch.randn(4, 3)
    print(json.dumps({"hparams": dict(model.hparams), "loaded_hparams": dict(last.hparams), "override": dict(best.hparams),
                      "same_weights": same_weights, "training": last.training,
                      "hidden": best.net[0].out_features, "tanh": isinstance(best.net[1], nn.Tanh),
                      "same_output": bool(torch.allclose(last(probe), model.cpu()(probe)))}))
