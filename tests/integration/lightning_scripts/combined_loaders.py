"""Several training loaders: a dict (max_size_cycle, Lightning's default), CombinedLoader in min_size and max_size modes,
and a dict of validation loaders."""
import json

import torch
from lightning.pytorch import LightningModule, Trainer, seed_everything
from lightning.pytorch.utilities import CombinedLoader
from torch.utils.data import DataLoader, TensorDataset


def data(n, offset):
    x = torch.arange(offset, offset + n, dtype=torch.float32).unsqueeze(1)
    return TensorDataset(x, 2 * x)


class Model(LightningModule):
    def __init__(self, train, val=None):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.train_loaders, self.val_loaders = train, val
        self.seen, self.val_seen = [], []

    def train_dataloader(self):
        return self.train_loaders()

    def val_dataloader(self):
        return self.val_loaders() if self.val_loaders else []

    def training_step(self, batch, batch_idx):
        parts = batch.items() if isinstance(batch, dict) else enumerate(batch)
        self.seen.append([batch_idx, {str(k): None if v is None else v[0][:, 0].tolist() for k, v in parts}])
        pairs = [pair for pair in (batch.values() if isinstance(batch, dict) else batch) if pair is not None]  # max_size: None
        losses = [torch.nn.functional.mse_loss(self.layer(x), y) for x, y in pairs]
        return sum(losses)

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        self.val_seen.append([dataloader_idx, batch_idx, batch[0][:, 0].tolist()])
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.001)


def run(train, val=None, **args):
    seed_everything(0, verbose=False)
    model = Model(train, val)
    trainer = Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      accelerator="cpu", num_sanity_val_steps=0, **args)
    trainer.fit(model)
    return {"global_step": trainer.global_step, "num_training_batches": trainer.num_training_batches, "seen": model.seen,
            "val_seen": model.val_seen, "metrics": sorted(trainer.callback_metrics), "weight": model.layer.weight.item()}


if __name__ == "__main__":
    def loaders():
        return {"a": DataLoader(data(4, 0), batch_size=2), "b": DataLoader(data(6, 100), batch_size=2)}

    out = {
        "dict": run(loaders, lambda: {"x": DataLoader(data(2, 10), batch_size=2), "y": DataLoader(data(4, 20), batch_size=2)}),
        "list": run(lambda: list(loaders().values())),
        "min_size": run(lambda: CombinedLoader(loaders(), "min_size")),
        "max_size": run(lambda: CombinedLoader(loaders(), "max_size")),
        "limited": run(lambda: CombinedLoader(loaders(), "max_size_cycle"), limit_train_batches=2),
    }
    print(json.dumps(out))
