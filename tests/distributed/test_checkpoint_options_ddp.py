"""ModelCheckpoint's Lightning options on 2 real processes (gloo): ``train_time_interval`` agreed inside the loop's
stop agreement (any process's clock makes the save due, every process saves at the same batch, no extra collective),
and weights-only checkpoints written collectively."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from callbacks.checkpoint import ModelCheckpoint
from tests.helpers.multiprocess import run_distributed
from trainer import Trainer, TrainModule


class Net(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _loader() -> DataLoader:
    x = torch.arange(32, dtype=torch.float32).reshape(16, 2) / 32
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=1)  # 8 batches per process


def _fit(tmp: str, callback: ModelCheckpoint, interval: int) -> Trainer:
    trainer = Trainer(max_epochs=1, devices=2, accelerator="cpu", strategy="ddp", callbacks=[callback], log_with=None,
                      enable_progress_bar=False, enable_model_summary=False, project_dir=tmp, stop_check_interval=interval)
    trainer.fit(Net(), _loader())
    return trainer


def _timed(tmp: str) -> dict[str, Any]:
    rank = int(os.environ["RANK"])
    # process 1's clock finds the time over at every batch, process 0's never: any process's clock makes a save due
    interval = timedelta(0) if rank == 1 else timedelta(hours=1)
    timed = _fit(tmp, ModelCheckpoint(dirpath=Path(tmp) / "timed", train_time_interval=interval, save_top_k=-1), interval=1)
    untimed = _fit(tmp, ModelCheckpoint(dirpath=Path(tmp) / "untimed", every_n_epochs=0, save_top_k=-1), interval=1)
    weights = _fit(tmp, ModelCheckpoint(dirpath=Path(tmp) / "weights", save_weights_only=True), interval=1)
    names = sorted(p.name for p in (Path(tmp) / "timed").iterdir() if not p.name.startswith(".")) if rank == 0 else []
    return {"names": names, "agreements": (timed.agreement.agreements, untimed.agreement.agreements),
            "last": timed.checkpoint_callback.best_model_path if timed.checkpoint_callback else "",
            "weights": sorted(p.name for p in Path(weights.checkpoint_callback.best_model_path).iterdir())}


def test_time_interval_saves_are_agreed_without_a_collective_of_their_own(tmp_path: Path) -> None:
    ranks = run_distributed(_timed, str(tmp_path), nprocs=2, timeout=240)
    # requested at batch k's end, agreed in that batch's agreement, saved at batch k+1 on both processes; the
    # request that batch k+1 makes is the one just taken, so the next save comes two batches later
    assert ranks[0]["names"] == ["epoch=0-step=2", "epoch=0-step=4", "epoch=0-step=6", "epoch=0-step=8"]
    assert ranks[0]["last"] == ranks[1]["last"]
    assert ranks[0]["agreements"] == ranks[1]["agreements"] and ranks[0]["agreements"][0] == ranks[0]["agreements"][1]
    assert ranks[0]["weights"] == ["hparams.json", "manifest.json", "model.safetensors"] == ranks[1]["weights"]
