"""EarlyStopping(verbose=True) prints each improvement and the stop; the validation loss follows a fixed schedule (of
values a float32 holds exactly, so that they print the same at any precision)."""
import json

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import EarlyStopping
from torch.utils.data import DataLoader, TensorDataset

SCHEDULE = [1.0, 0.5, 0.625, 0.375, 0.359375, 0.75, 0.875, 0.125, 0.125]


class Scheduled(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", SCHEDULE[self.current_epoch])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def run(**early_stopping):
    pl.seed_everything(0, verbose=False)
    loader = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4)
    stopper = EarlyStopping(monitor="val_loss", verbose=True, **early_stopping)
    trainer = pl.Trainer(max_epochs=len(SCHEDULE), accelerator="cpu", callbacks=[stopper], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(Scheduled(), loader, loader)
    return {"stopped_epoch": stopper.stopped_epoch, "current_epoch": trainer.current_epoch, "best_score": float(stopper.best_score),
            "wait_count": stopper.wait_count}


if __name__ == "__main__":
    print(json.dumps({"patience": run(min_delta=0.02, patience=2), "threshold": run(stopping_threshold=0.4),
                      "divergence": run(mode="max", divergence_threshold=0.55),
                      "divergence_min": run(divergence_threshold=0.7)}))
