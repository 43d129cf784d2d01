"""`BaseFinetuning`/`BackboneFinetuning`, `BasePredictionWriter`, `DeviceStatsMonitor` and `RichProgressBar`
(Lightning 2.6's callbacks): what each does in a real ``fit``/``predict``, and their errors."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from callbacks import (
    BackboneFinetuning,
    BaseFinetuning,
    BasePredictionWriter,
    Callback,
    DeviceStatsMonitor,
    ModelCheckpoint,
    RichProgressBar,
)
from trainer import Trainer, TrainModule


class Net(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Tanh())
        self.head = nn.Linear(8, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.mse_loss(self.head(self.backbone(x)).squeeze(1), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.head(self.backbone(x)).squeeze(1), y))

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.head(self.backbone(batch[0])).squeeze(1)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(filter(lambda p: p.requires_grad, self.parameters()), lr=0.1)


class GroupLRs(Callback):
    def __init__(self) -> None:
        self.lrs: list[list[float]] = []
        self.frozen: list[bool] = []

    def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
        self.lrs.append([g["lr"] for g in trainer.optimizers[0].param_groups])
        self.frozen.append(not module.backbone[0].weight.requires_grad)


def loader(n: int = 32) -> DataLoader:
    x = torch.randn(n, 4, generator=torch.Generator().manual_seed(0))
    return DataLoader(TensorDataset(x, x.sum(1)), batch_size=8)


def trainer_for(root: Path, *callbacks: Callback, max_epochs: int = 4, **kwargs: Any) -> Trainer:
    settings: dict[str, Any] = dict(max_epochs=max_epochs, callbacks=list(callbacks), log_with=None, enable_checkpointing=False,
                                    enable_progress_bar=False, enable_model_summary=False, project_dir=str(root))
    settings.update(kwargs)
    return Trainer(**settings)


@pytest.mark.filterwarnings("ignore:The provided params to be frozen")  # the BatchNorm kept trainable (train_bn)
def test_backbone_finetuning_unfreezes_and_schedules_the_backbone_lr(tmp_path: Path) -> None:
    record = GroupLRs()
    torch.manual_seed(0)
    module = Net()
    frozen_at_start = module.backbone[0].weight.detach().clone()
    trainer_for(tmp_path, BackboneFinetuning(unfreeze_backbone_at_epoch=1, lambda_func=lambda e: 1.5), record).fit(module, loader())
    # epoch 0: the head and the (trainable, train_bn) BatchNorm; epoch 1: the backbone at 0.1 * 0.1; then * 1.5 per epoch
    assert record.frozen == [True, False, False, False]
    assert [len(g) for g in record.lrs] == [1, 2, 2, 2]
    assert [g[1] for g in record.lrs[1:]] == pytest.approx([0.01, 0.015, 0.0225])
    assert not torch.equal(module.backbone[0].weight, frozen_at_start)  # trained after the unfreeze


@pytest.mark.filterwarnings("ignore:The provided params to be frozen")  # the BatchNorm kept trainable (train_bn)
def test_finetuning_resumes_with_the_added_groups_bit_for_bit(tmp_path: Path) -> None:
    def run(root: Path, ckpt_path: str | None = None, checkpoints: bool = False) -> Net:
        torch.manual_seed(0)
        module = Net()
        extra: list[Callback] = [ModelCheckpoint(dirpath=root / "ckpts", every_n_epochs=1, save_top_k=-1)] if checkpoints else []
        trainer_for(root, BackboneFinetuning(unfreeze_backbone_at_epoch=1, lambda_func=lambda e: 1.5), *extra,
                    enable_checkpointing=checkpoints).fit(module, loader(), ckpt_path=ckpt_path)
        return module

    straight = run(tmp_path / "straight", checkpoints=True)
    middle = next(p for p in (tmp_path / "straight" / "ckpts").iterdir() if p.name.startswith("epoch=2-"))
    resumed = run(tmp_path / "resumed", ckpt_path=str(middle))
    for a, b in zip(straight.state_dict().values(), resumed.state_dict().values()):
        assert torch.equal(a, b)


def test_base_finetuning_must_be_overridden_and_backbone_must_exist(tmp_path: Path) -> None:
    with pytest.raises(NotImplementedError, match="freeze_before_training"):
        trainer_for(tmp_path, BaseFinetuning()).fit(Net(), loader())

    class NoBackbone(Net):
        def __init__(self) -> None:
            super().__init__()
            self.trunk = self.backbone
            del self.backbone

    with pytest.raises(AttributeError, match=r"NoBackbone\.backbone, a torch\.nn\.Module"):
        trainer_for(tmp_path, BackboneFinetuning()).fit(NoBackbone(), loader())


def test_freeze_helpers_match_lightning() -> None:
    net = Net()
    BaseFinetuning.freeze(net.backbone, train_bn=False)
    assert not any(p.requires_grad for p in net.backbone.parameters()) and not net.backbone[1].track_running_stats
    assert list(BaseFinetuning.filter_params(net.backbone, requires_grad=False)) == list(net.backbone.parameters())
    BaseFinetuning.make_trainable(net.backbone)
    assert all(p.requires_grad for p in net.backbone.parameters()) and net.backbone[1].track_running_stats
    assert BaseFinetuning.flatten_modules([net.backbone, net.head]) == [net.backbone[0], net.backbone[1], net.backbone[2], net.head]
    optimizer = torch.optim.SGD(net.head.parameters(), lr=0.5)
    BaseFinetuning.unfreeze_and_add_param_group(net.backbone, optimizer)
    assert len(optimizer.param_groups) == 2 and optimizer.param_groups[1]["lr"] == pytest.approx(0.05)  # 0.5 / initial_denom_lr
    with pytest.warns(UserWarning, match="already exist within another group"):
        BaseFinetuning.unfreeze_and_add_param_group(net.backbone, optimizer)
    assert len(optimizer.param_groups) == 2


class Writer(BasePredictionWriter):
    def __init__(self, interval: str) -> None:
        super().__init__(interval)
        self.batches: list[tuple[int, int, torch.Tensor, Any]] = []
        self.epochs: list[tuple[list[Any], Any]] = []

    def write_on_batch_end(self, trainer: Any, pl_module: Any, prediction: Any, batch_indices: Any, batch: Any, batch_idx: int,
                           dataloader_idx: int) -> None:
        self.batches.append((batch_idx, dataloader_idx, prediction, batch_indices))

    def write_on_epoch_end(self, trainer: Any, pl_module: Any, predictions: Any, batch_indices: Any) -> None:
        self.epochs.append((predictions, batch_indices))


@pytest.mark.parametrize("interval", ["batch", "epoch", "batch_and_epoch"])
def test_prediction_writer_intervals(tmp_path: Path, interval: str) -> None:
    torch.manual_seed(0)
    module, writer = Net(), Writer(interval)
    expected = torch.cat(trainer_for(tmp_path, max_epochs=1).predict(module, loader(20)))  # type: ignore[arg-type]
    assert trainer_for(tmp_path, writer).predict(module, loader(20), return_predictions=False) is None
    if "batch" in interval:
        assert [(i, d) for i, d, _, _ in writer.batches] == [(0, 0), (1, 0), (2, 0)]
        assert torch.equal(torch.cat([p for _, _, p, _ in writer.batches]), expected)
    else:
        assert writer.batches == []
    if "epoch" in interval:
        ((predictions, indices),) = writer.epochs
        assert torch.equal(torch.cat(predictions), expected) and indices == [[]]
    else:
        assert writer.epochs == []


def test_prediction_writer_refuses_an_unknown_interval_and_needs_the_override(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"write_interval='step'.*\['batch', 'epoch', 'batch_and_epoch'\]"):
        BasePredictionWriter("step")
    with pytest.raises(NotImplementedError, match="write_on_batch_end"):
        trainer_for(tmp_path, BasePredictionWriter()).predict(Net(), loader(8))


def test_device_stats_monitor_logs_cpu_stats_to_the_tracker(tmp_path: Path) -> None:
    pytest.importorskip("psutil")
    trainer = trainer_for(tmp_path, DeviceStatsMonitor(), max_epochs=1, log_with="csv", log_every_n_steps=2, num_sanity_val_steps=0)
    trainer.fit(Net(), loader(), loader(16))
    (metrics,) = list((tmp_path / "logs").rglob("metrics.csv"))
    rows = list(csv.DictReader(metrics.open()))
    key = "DeviceStatsMonitor.on_train_batch_start/cpu_percent"
    logged = [r for r in rows if r.get(key)]
    assert [int(r["step"]) for r in logged] == [1, 3]  # batches 2 and 4 of 4: every log_every_n_steps=2
    for stat in ("cpu_vm_percent", "cpu_percent", "cpu_swap_percent"):
        for hook in ("on_train_batch_start", "on_train_batch_end", "on_validation_batch_start", "on_validation_batch_end"):
            assert any(r.get(f"DeviceStatsMonitor.{hook}/{stat}") for r in rows), (hook, stat)
    assert 0.0 <= float(logged[0][key]) <= 100.0 * torch.get_num_threads()


def test_device_stats_monitor_needs_a_tracker(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="without trackers"):
        trainer_for(tmp_path, DeviceStatsMonitor()).fit(Net(), loader())
    with pytest.raises(TypeError, match="cpu_stats"):
        DeviceStatsMonitor(cpu_stats="yes")  # type: ignore[arg-type]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_stats_monitor_logs_cuda_memory_stats(tmp_path: Path) -> None:
    trainer = trainer_for(tmp_path, DeviceStatsMonitor(cpu_stats=False), max_epochs=1, log_with="csv", log_every_n_steps=1,
                          accelerator="cuda", devices=1)
    trainer.fit(Net(), loader())
    rows = list(csv.DictReader(next((tmp_path / "logs").rglob("metrics.csv")).open()))
    key = "DeviceStatsMonitor.on_train_batch_end/allocated_bytes.all.current"
    assert [r for r in rows if r.get(key)] and all(float(r[key]) > 0 for r in rows if r.get(key))


def test_rich_progress_bar_draws_the_epochs(tmp_path: Path) -> None:
    pytest.importorskip("rich")
    out = io.StringIO()
    bar = RichProgressBar(leave=True, console_kwargs={"file": out, "force_terminal": False, "width": 120})
    trainer_for(tmp_path, bar, max_epochs=2, enable_progress_bar=True, num_sanity_val_steps=0).fit(Net(), loader(), loader(16))
    text = out.getvalue()
    assert "Epoch 0" in text and "Epoch 1" in text and text.count("4/4") == 2 and "loss: " in text  # leave=True: both kept
    assert bar.progress is None  # stopped at teardown


def test_rich_progress_bar_without_rich_names_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "rich", None)
    monkeypatch.setitem(sys.modules, "rich.progress", None)
    with pytest.raises(ImportError, match="pip install rich"):
        RichProgressBar()
