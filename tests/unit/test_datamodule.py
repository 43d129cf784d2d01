"""`DataModule`: Lightning's hooks in Lightning's order, its loaders used by every stage, its state in checkpoints."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from trainer import DataModule, Trainer, TrainModule

QUIET = dict(log_with=None, enable_progress_bar=False, enable_model_summary=False)


class Numbers(DataModule):
    def __init__(self, size: int = 16, batch_size: int = 4) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.calls: list[str] = []
        self.served = 0

    def prepare_data(self) -> None:
        self.calls.append("prepare_data")

    def setup(self, stage: str) -> None:
        self.calls.append(f"setup:{stage}")
        self.data = TensorDataset(torch.randn(self.hparams.size, 2), torch.randn(self.hparams.size, 1))

    def teardown(self, stage: str) -> None:
        self.calls.append(f"teardown:{stage}")

    def train_dataloader(self) -> Any:
        return DataLoader(self.data, batch_size=self.hparams.batch_size)

    def val_dataloader(self) -> Any:
        return DataLoader(self.data, batch_size=8)

    def test_dataloader(self) -> Any:
        return DataLoader(self.data, batch_size=8)

    def state_dict(self) -> dict[str, Any]:
        return {"served": self.served}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.served = state_dict["served"]


class Net(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(2, 1)
        self.batches: dict[str, int] = {"train": 0, "val": 0, "test": 0}

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        self.batches["train"] += 1
        self.trainer.datamodule.served += 1
        x, y = batch
        return torch.nn.functional.mse_loss(self.lin(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.batches["val"] += 1

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.batches["test"] += 1

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_fit_and_test_with_a_datamodule(tmp_path: Path) -> None:
    dm, module = Numbers(), Net()
    trainer = Trainer(project_dir=tmp_path, max_epochs=2, num_sanity_val_steps=0, **QUIET)
    trainer.fit(module, datamodule=dm)
    trainer.test(module, datamodule=dm)
    assert dm.calls == ["prepare_data", "setup:fit", "teardown:fit", "prepare_data", "setup:test", "teardown:test"]
    assert module.batches == {"train": 8, "val": 4, "test": 2} and dm.hparams == {"size": 16, "batch_size": 4}
    assert dm.trainer is trainer


def test_prepare_data_per_node_false_still_prepares_on_global_rank_zero(tmp_path: Path) -> None:
    """Lightning's attribute, True by default on both; False means global rank 0 only, which one process is (the
    two-machine case is tests/distributed/test_prepare_data_per_node.py)."""
    dm, module = Numbers(), Net()
    assert dm.prepare_data_per_node is True and module.prepare_data_per_node is True
    dm.prepare_data_per_node = False
    Trainer(project_dir=tmp_path, max_epochs=1, num_sanity_val_steps=0, **QUIET).fit(module, datamodule=dm)
    assert dm.calls[:2] == ["prepare_data", "setup:fit"]


def test_datamodule_state_is_saved_and_restored(tmp_path: Path) -> None:
    Trainer(project_dir=tmp_path, max_epochs=1, **QUIET).fit(Net(), datamodule=Numbers())
    resumed = Numbers()
    Trainer(project_dir=tmp_path, max_epochs=2, **QUIET).fit(Net(), datamodule=resumed, ckpt_path="last")
    assert resumed.served == 8  # 4 restored from the checkpoint + 4 trained in epoch 2


def test_loaders_and_a_datamodule_together_are_refused(tmp_path: Path) -> None:
    loader = DataLoader(TensorDataset(torch.randn(4, 2), torch.randn(4, 1)), batch_size=2)
    with pytest.raises(ValueError, match="pass either dataloaders or datamodule=, not both"):
        Trainer(project_dir=tmp_path, **QUIET).fit(Net(), loader, datamodule=Numbers())
