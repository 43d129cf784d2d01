"""A Lightning 2.6 script that runs the tuners on a seeded problem and prints their results as JSON.

It is written for Lightning; ``tests/unit/test_tuner_lightning.py`` runs it here after the rename alone
(`tests.helpers.lightning_rename`) and compares with ``tests/fixtures/tuner_lightning.json``, what Lightning 2.6.6 printed.
To record that again, run it where Lightning is installed (a side virtual environment, same torch)::

    /path/to/venv-with-lightning/bin/python tests/helpers/tuner_lightning.py > tests/fixtures/tuner_lightning.json

With arguments (``tuners``, ``accumulation``) it runs only those parts.
"""

import json
import os
import sys
import tempfile

import lightning.pytorch as L
import torch
from lightning.pytorch.callbacks import GradientAccumulationScheduler
from lightning.pytorch.tuner import Tuner
from torch.utils.data import DataLoader, TensorDataset


class Regression(L.LightningModule):
    def __init__(self, lr=0.01, batch_size=16):
        super().__init__()
        self.lr = lr
        self.batch_size = batch_size
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(1)
        x = torch.randn(400, 8, generator=g)
        y = x @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(400, 1, generator=g)
        return DataLoader(TensorDataset(x, y), batch_size=self.batch_size, shuffle=False)


class Hungry(Regression):
    """Needs more memory than any machine has once a batch holds more than 10 samples (a real allocator failure)."""

    def training_step(self, batch, batch_idx):
        torch.empty(1024 if len(batch[0]) <= 10 else 2**60, dtype=torch.uint8)
        return super().training_step(batch, batch_idx)


def make_trainer(root, max_epochs=20, **kwargs):
    return L.Trainer(accelerator="cpu", devices=1, max_epochs=max_epochs, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, default_root_dir=root, **kwargs)


def tuners(root):
    out = {}
    if True:
        for mode, threshold in (("exponential", 4.0), ("linear", None)):
            model = Regression()
            finder = Tuner(make_trainer(root)).lr_find(model, mode=mode, early_stop_threshold=threshold, min_lr=1e-6, num_training=60)
            out[f"lr_find_{mode}"] = {"lr": finder.results["lr"], "loss": finder.results["loss"],
                                      "suggestion": finder.suggestion(), "model_lr": model.lr}
        for mode in ("power", "binsearch"):
            model = Regression()
            size = Tuner(make_trainer(root)).scale_batch_size(model, mode=mode, steps_per_trial=2, max_trials=6)
            out[f"scale_batch_size_{mode}"] = {"result": size, "model_batch_size": model.batch_size}
        model = Regression()
        size = Tuner(make_trainer(root)).scale_batch_size(model, mode="power", steps_per_trial=1)
        out["scale_batch_size_until_the_data_ends"] = {"result": size, "model_batch_size": model.batch_size}
        for mode in ("power", "binsearch"):
            model = Hungry()
            size = Tuner(make_trainer(root)).scale_batch_size(model, mode=mode, steps_per_trial=1)
            out[f"scale_batch_size_out_of_memory_{mode}"] = {"result": size, "model_batch_size": model.batch_size}
        out["files_left"] = sorted(os.listdir(root))
    return out


def accumulation(root):
    """Three epochs of 25 batches under GradientAccumulationScheduler({1: 2, 2: 3})."""
    model = Regression(lr=0.05)
    trainer = make_trainer(root, max_epochs=3, callbacks=[GradientAccumulationScheduler({1: 2, 2: 3})])
    trainer.fit(model)
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    return {"global_step": trainer.global_step, "weights": weights.tolist()}


def main():
    parts = sys.argv[1:] or ["tuners", "accumulation"]
    with tempfile.TemporaryDirectory() as root:
        out = {part: globals()[part](root) for part in parts}
    json.dump({"torch_version": torch.__version__, "results": out}, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
