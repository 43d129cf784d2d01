"""fit, then test(ckpt_path="best") and predict(ckpt_path="best"): both use the best epoch's weights."""
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

    def forward(self, x):
        return self.layer(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        # a validation score that is best at epoch 1, so "best" is not the last weights
        self.log("val_loss", nn.functional.mse_loss(self(x), y) + abs(self.current_epoch - 1.0))

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", nn.functional.mse_loss(self(x), y))

    def predict_step(self, batch, batch_idx):
        return self(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    pl.seed_everything(0)
    x = torch.randn(32, 3)
    data = TensorDataset(x, x @ torch.tensor([[1.0], [2.0], [-1.0]]))
    loader = DataLoader(data, batch_size=8)
    checkpoint = ModelCheckpoint(monitor="val_loss", mode="min", save_top_k=1)
    trainer = pl.Trainer(max_epochs=5, accelerator="cpu", callbacks=[checkpoint], default_root_dir=".", enable_progress_bar=False)
    model = Model()
    trainer.fit(model, loader, loader)
    last_output = model(x).detach().clone()
    (tested,) = trainer.test(ckpt_path="best", dataloaders=loader)
    predictions = torch.cat(trainer.predict(ckpt_path="best", dataloaders=DataLoader(TensorDataset(x), batch_size=8)))
    best = Model.load_from_checkpoint(checkpoint.best_model_path)
    expected = best(x).detach()
    print(json.dumps({"differs_from_last": not torch.allclose(expected, last_output),"best_model_path": checkpoint.best_model_path, "best_score": float(checkpoint.best_model_score),
                      "test_loss": tested["test_loss"], "predictions_match_best": bool(torch.allclose(predictions, expected)),
                      "rows": len(predictions)}))
