"""Classify scikit-learn's bundled 8x8 digits with the Trainer: train, validate, checkpoint, stop early, test.

    python examples/digits.py                 # about a minute on a laptop CPU
    python examples/digits.py --fast          # a few seconds (what the tests run)
    trainer launch --num_processes 2 examples/digits.py --fast   # the same on 2 processes

The data ships with scikit-learn (no download). Checkpoints go to ``<project_dir>/checkpoints``, metrics to
``<project_dir>/logs`` (CSV).
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from callbacks.checkpoint import ModelCheckpoint
from callbacks.early_stopping import EarlyStopping
from trainer import Trainer, TrainModule
from trainer.utils import set_seed


class DigitsClassifier(TrainModule):
    """A small MLP over the 64 pixels, with a torchmetrics accuracy per stage."""

    def __init__(self, hidden: int = 128, lr: float = 2e-3, weight_decay: float = 1e-4) -> None:
        super().__init__()
        self.save_hyperparameters()
        import torchmetrics

        self.net = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Dropout(0.1), nn.Linear(hidden, 10))
        self.val_acc = torchmetrics.Accuracy(task="multiclass", num_classes=10)
        self.test_acc = torchmetrics.Accuracy(task="multiclass", num_classes=10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss, on_epoch=True, prog_bar=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        logits = self(x)
        self.log("val_loss", nn.functional.cross_entropy(logits, y), prog_bar=True, sync_dist=True)
        self.val_acc(logits, y)
        self.log("val_acc", self.val_acc, prog_bar=True)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.test_acc(self(x), y)
        self.log("test_acc", self.test_acc)

    def configure_optimizers(self) -> Any:
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=self.hparams.lr * 5, total_steps=self.trainer.estimated_stepping_batches)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def digits_loaders(batch_size: int) -> tuple[DataLoader, DataLoader, DataLoader]:
    """Train/validation/test loaders over the 1797 digits (70/15/15 split, pixels scaled to [0, 1])."""
    from sklearn.datasets import load_digits

    data = load_digits()
    x = torch.tensor(data.data, dtype=torch.float32) / 16.0
    y = torch.tensor(data.target, dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    x, y = x[order], y[order]
    n_train, n_val = int(0.7 * len(x)), int(0.15 * len(x))
    splits = [(0, n_train), (n_train, n_train + n_val), (n_train + n_val, len(x))]
    sets = [TensorDataset(x[a:b], y[a:b]) for a, b in splits]
    return (
        DataLoader(sets[0], batch_size=batch_size, shuffle=True),
        DataLoader(sets[1], batch_size=256),
        DataLoader(sets[2], batch_size=256),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="3 epochs, no progress bar (for tests)")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--project-dir", default="digits_run")
    parser.add_argument("--precision", default=None, help="'32', 'bf16-mixed', '16-mixed'")
    args = parser.parse_args()

    set_seed(0)
    train, val, test = digits_loaders(batch_size=64)
    checkpoint = ModelCheckpoint(monitor="val_acc", mode="max", save_last=True)
    trainer = Trainer(
        max_epochs=3 if args.fast else args.epochs,
        precision=args.precision,
        project_dir=args.project_dir,
        callbacks=[checkpoint, EarlyStopping(monitor="val_loss", patience=4)],
        enable_progress_bar=not args.fast,
        enable_model_summary=not args.fast,
        log_every_n_steps=10,
    )
    module = DigitsClassifier()
    trainer.fit(module, train, val)
    epochs, steps = trainer.current_epoch, trainer.global_step
    results = trainer.test(module, test, ckpt_path="best")[0]
    trainer.print(
        f"\ntrained {epochs} epochs ({steps} steps) on {trainer.world_size} process(es)\n"
        f"best val_acc {checkpoint.best_model_score:.4f}; test_acc of that checkpoint {results['test_acc']:.4f}\n"
        f"checkpoints: {checkpoint.best_model_path} (best), {checkpoint.last_model_path} (last)\n"
        f"metrics: {trainer.log_dir}/metrics.csv"
    )

if __name__ == "__main__":
    main()
