"""2-process DDP on CPU (devices=2, strategy="ddp"): the script relaunches itself on 2 processes."""
import json

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Model(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = nn.Linear(3, 1)
        self.train_samples = 0

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.train_samples += len(x)
        loss = nn.functional.mse_loss(self.layer(x), y)
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.layer(x), y), sync_dist=True)

    def predict_step(self, batch, batch_idx):
        return self.layer(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    pl.seed_everything(0)
    x = torch.randn(64, 3)
    data = TensorDataset(x, x.sum(1, keepdim=True))
    model = Model()
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", devices=2, strategy="ddp", default_root_dir=".", enable_progress_bar=False)
    trainer.fit(model, DataLoader(data, batch_size=8, shuffle=True), DataLoader(data, batch_size=8))
    predictions = torch.cat(trainer.predict(model, DataLoader(TensorDataset(x), batch_size=8)))
    weights = model.all_gather(model.layer.weight.detach())  # one row per process
    if trainer.is_global_zero:
        print(json.dumps({"world_size": trainer.world_size, "global_step": trainer.global_step, "train_samples": model.train_samples,
                          "predictions": len(predictions), "same_weights_on_ranks": bool(torch.equal(weights[0], weights[1])),
                          "predictions_in_order": bool(torch.allclose(predictions, model.layer(x).detach())),
                          "best_model_path": trainer.checkpoint_callback.best_model_path}))
