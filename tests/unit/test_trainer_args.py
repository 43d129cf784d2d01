"""Every bad `Trainer` argument is refused at construction with a message naming the value and the fix."""

from __future__ import annotations

from typing import Any

import pytest

from callbacks.base import Callback
from trainer.fit.trainer import Trainer

QUIET: dict[str, Any] = dict(log_with=None, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"strategy": "fsdp3"}, ValueError, "strategy='fsdp3' is not known; choose one of 'auto', 'ddp', 'ddp_find_unused_parameters_false'"),
        ({"devices": 0}, ValueError, "devices=0 must be 'auto' or a positive int"),
        ({"devices": "2"}, ValueError, "devices='2'"),
        ({"strategy": "single", "devices": 2}, ValueError, "strategy='single' runs one process but devices=2"),
        ({"precision": "fp61"}, ValueError, "precision='fp61' is not supported; choose one of 32, 16, 'bf16'"),
        ({"max_epochs": 0}, ValueError, "max_epochs=0 must be an int >= 1"),
        ({"max_epochs": 1.5}, ValueError, "max_epochs=1.5"),
        ({"max_epochs": -1}, ValueError, "max_epochs=-1 \\(no epoch limit\\) needs max_steps"),
        ({"max_steps": 0}, ValueError, "max_steps=0 must be an int >= 1"),
        ({"accumulate_grad_batches": 0}, ValueError, "accumulate_grad_batches=0"),
        ({"gradient_clip_val": -1.0}, ValueError, "gradient_clip_val=-1.0 must be None or a number >= 0"),
        ({"gradient_clip_algorithm": "l2"}, ValueError, "gradient_clip_algorithm='l2' must be 'norm' or 'value'"),
        ({"callbacks": [object()]}, TypeError, "callbacks must be Callback instances"),
        ({"val_check_interval": 0}, ValueError, "val_check_interval=0"),
        ({"val_check_interval": 1.5}, ValueError, "val_check_interval=1.5"),
        ({"check_val_every_n_epoch": 0}, ValueError, "check_val_every_n_epoch=0"),
        ({"limit_train_batches": -1}, ValueError, "limit_train_batches=-1 must be None"),
        ({"limit_val_batches": 2.0}, ValueError, "limit_val_batches=2.0"),
        ({"num_sanity_val_steps": -2}, ValueError, "num_sanity_val_steps=-2"),
        ({"log_every_n_steps": 0}, ValueError, "log_every_n_steps=0"),
        ({"enable_progress_bar": "yes"}, TypeError, "enable_progress_bar='yes' must be True or False"),
        ({"seed": "42"}, TypeError, "seed='42' must be an int"),
        ({"process_group_timeout": 0}, ValueError, "process_group_timeout=0 must be a positive number"),
        ({"project_dir": 3}, TypeError, "project_dir=3 must be a path"),
        ({"log_with": "no-such-tracker"}, ValueError, "log_with='no-such-tracker' is not a known tracker"),
        ({"num_nodes": 0}, ValueError, "num_nodes=0 must be an int >= 1"),
        ({"num_nodes": 2}, ValueError, "num_nodes=2 but this is one process, not started by a launcher: 1 machine"),
        ({"overfit_batches": -1}, ValueError, "overfit_batches=-1 must be None"),
        ({"overfit_batches": 1.5}, ValueError, "overfit_batches=1.5"),
        ({"overfit_batches": 2, "limit_val_batches": 3}, ValueError, "overfit_batches=2 sets limit_train_batches and limit_val_batches"),
        ({"sync_batchnorm": 1}, TypeError, "sync_batchnorm=1 must be True or False"),
        ({"use_distributed_sampler": None}, TypeError, "use_distributed_sampler=None must be True or False"),
        ({"reload_dataloaders_every_n_epochs": -1}, ValueError, "reload_dataloaders_every_n_epochs=-1 must be an int >= 0"),
        ({"inference_mode": "yes"}, TypeError, "inference_mode='yes' must be True or False"),
        ({"detect_anomaly": None}, TypeError, "detect_anomaly=None must be True or False"),
        ({"benchmark": "on"}, TypeError, "benchmark='on' must be True, False or None"),
        ({"profiler": "xla"}, ValueError, "profiler='xla' is not supported; choose one of None, 'simple', 'advanced', 'pytorch'"),
    ],
)
def test_bad_values_are_refused_at_construction(kwargs: dict[str, Any], error: type, match: str, tmp_path: Any) -> None:
    with pytest.raises(error, match=match):
        Trainer(**{**QUIET, "project_dir": tmp_path, **kwargs})


def test_arguments_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        Trainer("ddp")  # type: ignore[misc]


def test_defaults(tmp_path: Any) -> None:
    trainer = Trainer(project_dir=tmp_path, log_with=None)
    assert trainer.max_epochs == 1000 and trainer.max_steps is None  # Lightning's default when neither is given
    assert trainer.world_size == 1 and trainer.global_rank == 0 and trainer.is_global_zero
    assert trainer.accumulate_grad_batches == 1 and trainer.accelerator.mixed_precision == "no"
    names = [type(cb).__name__ for cb in trainer.callbacks]
    assert names == ["ProgressBar", "ModelSummary", "ModelCheckpoint"]  # checkpointing runs last
    assert trainer.checkpoint_callback is trainer.callbacks[-1]
    assert trainer.global_step == 0 and trainer.current_epoch == 0 and not trainer.should_stop
    assert trainer.log_dir.endswith("logs")


def test_max_steps_alone_leaves_epochs_unbounded(tmp_path: Any) -> None:
    trainer = Trainer(project_dir=tmp_path, max_steps=5, **QUIET)
    assert trainer.max_epochs is None and trainer.max_steps == 5


@pytest.mark.parametrize(("given", "mode"), [("32", "no"), (32, "no"), ("32-true", "no"), ("bf16-mixed", "bf16"), ("bf16", "bf16"), ("16-mixed", "fp16"), (16, "fp16"), ("fp16", "fp16"), ("no", "no")])
def test_precision_spellings(given: Any, mode: str, tmp_path: Any) -> None:
    assert Trainer(project_dir=tmp_path, precision=given, **QUIET).accelerator.mixed_precision == mode


def test_single_callback_and_csv_tracker(tmp_path: Any) -> None:
    cb = Callback()
    trainer = Trainer(project_dir=tmp_path, callbacks=cb, log_with="csv", enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False)
    assert trainer.callbacks[0] is cb and type(trainer.callbacks[1]).__name__ == "CSVTracker"


def test_environment_settings_are_read_when_no_argument_says_otherwise(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINWRIGHT_MIXED_PRECISION", "bf16")
    monkeypatch.setenv("TRAINWRIGHT_GRADIENT_ACCUMULATION_STEPS", "3")
    trainer = Trainer(project_dir=tmp_path, **QUIET)
    assert trainer.accelerator.mixed_precision == "bf16" and trainer.accumulate_grad_batches == 3
    assert Trainer(project_dir=tmp_path, precision="32", accumulate_grad_batches=2, **QUIET).accumulate_grad_batches == 2


def test_devices_must_match_the_launched_processes(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="devices=4 but the launcher started 2 processes"):
        Trainer(project_dir=tmp_path, strategy="ddp", devices=4, **QUIET)


def test_lightning_argument_names(tmp_path: Any) -> None:
    from callbacks.trackers import CSVTracker

    trainer = Trainer(default_root_dir=tmp_path, logger=False, accelerator="cpu", enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False)
    assert trainer.project_dir == str(tmp_path) and trainer.accelerator.device.type == "cpu"
    assert not any(isinstance(cb, CSVTracker) for cb in trainer.callbacks)
    with_csv = Trainer(default_root_dir=tmp_path, logger=True, enable_progress_bar=False, enable_model_summary=False)
    assert any(isinstance(cb, CSVTracker) for cb in with_csv.callbacks)
    mine = CSVTracker()
    assert mine in Trainer(project_dir=tmp_path, logger=[mine], **{k: v for k, v in QUIET.items() if k != "log_with"}).callbacks


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"accelerator": "tpu", "strategy": "fsdp"}, ValueError, "accelerator='tpu' runs strategy='xla', but strategy='fsdp' was passed"),
        ({"accelerator": "abacus"}, ValueError, "accelerator='abacus' is not supported; choose one of 'auto', 'cpu'"),
        ({"default_root_dir": "a", "project_dir": "b"}, ValueError, "default_root_dir='a' and project_dir='b' name two directories"),
        ({"logger": True, "log_with": "tensorboard"}, ValueError, "logger=True and log_with='tensorboard' both choose trackers"),
    ],
)
def test_lightning_argument_conflicts(kwargs: dict[str, Any], error: type, match: str) -> None:
    base = {k: v for k, v in QUIET.items() if k not in kwargs}
    with pytest.raises(error, match=match):
        Trainer(**base, **kwargs)


def test_seed_everything_seeds_and_returns_the_seed(capsys: Any) -> None:
    import torch

    from trainer import seed_everything

    assert seed_everything(7) == 7 and "Seed set to 7" in capsys.readouterr().out
    a = torch.rand(3)
    seed_everything(7, verbose=False)
    assert torch.equal(a, torch.rand(3))


def test_fast_dev_run_runs_n_batches_of_every_stage_and_writes_nothing(tmp_path: Any) -> None:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from callbacks.checkpoint import ModelCheckpoint
    from trainer import TrainModule

    class Counting(TrainModule):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(2, 1)
            self.seen = {"train": 0, "val": 0, "test": 0}

        def training_step(self, batch, batch_idx):
            self.seen["train"] += 1
            return self.lin(batch[0]).pow(2).mean()

        def validation_step(self, batch, batch_idx):
            self.seen["val"] += 1
            self.log("val_loss", self.lin(batch[0]).pow(2).mean())

        def test_step(self, batch, batch_idx):
            self.seen["test"] += 1

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    loader = DataLoader(TensorDataset(torch.randn(40, 2)), batch_size=4)
    module = Counting()
    trainer = Trainer(project_dir=tmp_path, fast_dev_run=2, max_epochs=5, enable_progress_bar=False,
                      callbacks=[ModelCheckpoint(dirpath=tmp_path / "ck", monitor="val_loss")])
    trainer.fit(module, loader, loader)
    trainer.test(module, loader)
    assert module.seen == {"train": 2, "val": 2, "test": 2} and trainer.global_step == 2
    assert list(tmp_path.iterdir()) == []  # no checkpoint, no tracker files
