"""Several evaluation loaders (``dataloader_idx``) and the batch-transfer hooks, as in Lightning."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from callbacks.base import Callback
from trainer import DataModule, Trainer, TrainModule


def _data(values: list[float], batch_size: int = 2) -> DataLoader:
    return DataLoader(TensorDataset(torch.tensor(values)[:, None]), batch_size=batch_size)


def _trainer(tmp_path: Any, **kwargs: Any) -> Trainer:
    defaults: dict[str, Any] = dict(log_with=None, project_dir=tmp_path, enable_progress_bar=False, enable_model_summary=False,
                                    enable_checkpointing=False)
    return Trainer(**{**defaults, **kwargs})


class TwoLoaders(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.seen: list[tuple[str, int, int]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.seen.append(("val", dataloader_idx, batch_idx))
        self.log("mean", batch[0].mean())
        self.log("all", batch[0].mean(), add_dataloader_idx=False)

    def test_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.log("mean", batch[0].mean())

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        return batch[0] * 10 + dataloader_idx

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.0)


class BatchHooks(Callback):
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def on_validation_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.calls.append(("end", batch_idx, dataloader_idx))


def test_validate_with_two_loaders_names_and_returns_each(tmp_path: Any) -> None:
    module, hooks = TwoLoaders(), BatchHooks()
    trainer = _trainer(tmp_path, callbacks=[hooks])
    results = trainer.validate(module, [_data([0.0, 2.0, 4.0]), _data([10.0, 20.0])])
    assert module.seen == [("val", 0, 0), ("val", 0, 1), ("val", 1, 0)]  # loader by loader, batch_idx from 0 each
    assert hooks.calls == [("end", 0, 0), ("end", 1, 0), ("end", 0, 1)]
    assert trainer.num_val_batches == [2, 1]
    # Lightning's names and result: one dict per loader, with its own values and the unsuffixed ones
    assert results == [
        {"mean/dataloader_idx_0": pytest.approx(2.0), "all": pytest.approx(7.2)},
        {"mean/dataloader_idx_1": pytest.approx(15.0), "all": pytest.approx(7.2)},
    ]
    assert trainer.test(module, [_data([1.0]), _data([3.0])]) == [{"mean/dataloader_idx_0": 1.0}, {"mean/dataloader_idx_1": 3.0}]


def test_one_loader_in_a_list_is_one_loader(tmp_path: Any) -> None:
    module = TwoLoaders()
    assert _trainer(tmp_path).validate(module, [_data([1.0, 3.0])]) == [{"mean": 2.0, "all": 2.0}]
    assert module.seen == [("val", 0, 0)]


def test_predict_with_two_loaders_gives_a_list_per_loader(tmp_path: Any) -> None:
    out = _trainer(tmp_path).predict(TwoLoaders(), [_data([1.0, 2.0], batch_size=1), _data([3.0])])
    assert [[t.flatten().tolist() for t in per_loader] for per_loader in out] == [[[10.0], [20.0]], [[31.0]]]


def test_fit_validates_every_loader_and_sanity_checks_each(tmp_path: Any) -> None:
    module = TwoLoaders()
    trainer = _trainer(tmp_path, max_epochs=1, num_sanity_val_steps=1)
    trainer.fit(module, _data([1.0, 2.0]), [_data([0.0, 2.0, 4.0]), _data([10.0, 20.0])])
    assert module.seen == [("val", 0, 0), ("val", 1, 0), ("val", 0, 0), ("val", 0, 1), ("val", 1, 0)]
    assert {"mean/dataloader_idx_0", "mean/dataloader_idx_1"} <= set(trainer.callback_metrics)


def test_combined_loader_modes_that_cannot_work_are_refused(tmp_path: Any) -> None:
    """Lightning's rule: training refuses ``sequential``; evaluation takes only ``sequential`` (several train loaders and
    dicts of loaders run: tests/integration/test_lightning_scripts.py::test_several_train_loaders_and_combined_loader_modes)."""
    from trainer.utilities import CombinedLoader

    with pytest.raises(ValueError, match=r"CombinedLoader\(mode='max_size_cycle'\) is not supported for the val dataloaders"):
        _trainer(tmp_path).validate(TwoLoaders(), CombinedLoader({"a": _data([1.0])}, "max_size_cycle"))
    with pytest.raises(ValueError, match=r"CombinedLoader\(mode='sequential'\) is not supported for the train dataloaders"):
        _trainer(tmp_path, max_epochs=1).fit(TwoLoaders(), CombinedLoader([_data([1.0]), _data([2.0])], "sequential"))


class Transfers(TwoLoaders):
    """Records the batch-transfer hooks around the batch hooks; doubles x before the transfer, adds 1 after."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []
        self.trained_on: list[list[float]] = []

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        self.calls.append(f"before({dataloader_idx})")
        return [batch[0] * 2]

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        self.calls.append(f"transfer({device.type},{dataloader_idx})")
        return super().transfer_batch_to_device(batch, device, dataloader_idx)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        self.calls.append(f"after({dataloader_idx})")
        return [batch[0] + 1]

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self.calls.append("on_train_batch_start")

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.trained_on.append(batch[0].flatten().tolist())
        return super().training_step(batch, batch_idx)

    def on_validation_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.calls.append("on_validation_batch_start")


def test_batch_transfer_hooks_run_before_the_batch_hooks(tmp_path: Any) -> None:
    module = Transfers()
    trainer = _trainer(tmp_path, max_epochs=1, num_sanity_val_steps=0)
    trainer.fit(module, _data([1.0, 2.0], batch_size=2), [_data([0.0]), _data([5.0])])
    device = trainer.accelerator.device.type
    assert module.calls == [
        "before(0)", f"transfer({device},0)", "after(0)", "on_train_batch_start",
        "before(0)", f"transfer({device},0)", "after(0)", "on_validation_batch_start",
        "before(1)", f"transfer({device},1)", "after(1)", "on_validation_batch_start",
    ]
    assert module.trained_on == [[3.0, 5.0]]  # the step sees the batch the hooks made
    assert trainer.callback_metrics["mean/dataloader_idx_1"] == 11.0


class DataWithTransfer(DataModule):
    def val_dataloader(self) -> Any:
        return _data([1.0])

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        return [batch[0] * 100]


def test_a_datamodule_batch_transfer_hook_wins_over_the_module(tmp_path: Any) -> None:
    module = Transfers()
    (result,) = _trainer(tmp_path).validate(module, datamodule=DataWithTransfer())
    assert result["mean"] == 101.0  # the DataModule's hook (x 100), then the module's on_after_batch_transfer (+ 1)
    assert "before(0)" not in module.calls and "after(0)" in module.calls
