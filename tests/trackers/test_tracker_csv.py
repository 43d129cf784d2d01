"""The built-in CSV tracker, read back with the ``csv`` module, from both faces."""

from __future__ import annotations

import csv
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from tracker_scenario import CONFIG, STEPS, expected_acc, expected_loss

from callbacks.trackers import CSVTracker, TrackerHub


def _rows(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        return list(reader.fieldnames or []), list(reader)


def test_csv_round_trip(run_scenario, offline_env: Path) -> None:
    hub = run_scenario("csv", project_name="csv-proj")
    tracker = hub.get("csv")
    assert tracker.run_dir == offline_env / "out" / "logs" / "csv-proj" / "version_0"
    header, rows = _rows(tracker.run_dir / "metrics.csv")
    assert header == ["step", "loss", "val/acc"]
    assert [int(row["step"]) for row in rows] == list(STEPS)
    for row in rows:
        assert float(row["loss"]) == pytest.approx(expected_loss(int(row["step"])), rel=1e-6)
        assert float(row["val/acc"]) == pytest.approx(expected_acc(int(row["step"])))
    assert yaml.safe_load((tracker.run_dir / "hparams.yaml").read_text()) == CONFIG


def test_new_metrics_widen_the_header_and_epoch_comes_second(tmp_path: Path) -> None:
    hub = TrackerHub("csv", project_dir=tmp_path)
    hub.init("proj")
    hub.log({"loss": 1.0}, step=0)
    hub.log({"loss": 0.5, "epoch": 0, "lr": torch.tensor(0.5)}, step=1)
    path = hub.get("csv").metrics_file
    assert _rows(path)[0] == ["step", "epoch", "loss", "lr"]  # rewritten as soon as new names appear
    hub.log({"val_acc": 0.9, "note": "best so far", "epoch": 1}, step=1)
    hub.log({"loss": 0.25}, step=None)
    hub.finish()
    header, rows = _rows(path)
    assert header == ["step", "epoch", "loss", "lr", "val_acc", "note"]
    assert rows == [
        {"step": "0", "epoch": "", "loss": "1.0", "lr": "", "val_acc": "", "note": ""},
        {"step": "1", "epoch": "0", "loss": "0.5", "lr": "0.5", "val_acc": "", "note": ""},
        {"step": "1", "epoch": "1", "loss": "", "lr": "", "val_acc": "0.9", "note": "best so far"},
        {"step": "", "epoch": "", "loss": "0.25", "lr": "", "val_acc": "", "note": ""},
    ]


def test_each_run_gets_the_next_free_version(tmp_path: Path) -> None:
    (tmp_path / "logs" / "proj" / "version_4").mkdir(parents=True)
    (tmp_path / "logs" / "proj" / "notes").mkdir()
    dirs = []
    for _ in range(2):
        hub = TrackerHub("csv", project_dir=tmp_path)
        hub.init("proj", config={"seed": 1})
        hub.log({"x": 1}, step=0)
        hub.finish()
        dirs.append(hub.get("csv").run_dir.name)
    assert dirs == ["version_5", "version_6"]


def test_without_project_dir_it_writes_under_the_current_directory(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    hub = TrackerHub("csv")
    hub.init("proj")
    hub.log({"x": 2}, step=7)
    hub.finish()
    assert _rows(tmp_path / "logs" / "proj" / "version_0" / "metrics.csv")[1] == [{"step": "7", "x": "2"}]


# ------------------------------------------------------------------------------------- the Trainer face
class TinyModule:
    """Stands for a ``TrainModule``: the tracker reads only ``hparams`` and the class name."""

    def __init__(self, hparams: dict) -> None:
        self.hparams = hparams


def test_callback_hooks_drive_the_tracker(tmp_path: Path, capsys) -> None:
    tracker = CSVTracker(logging_dir=tmp_path)
    trainer, module = SimpleNamespace(is_global_zero=True), TinyModule({"lr": 0.01, "layers": [2, 3]})
    tracker.on_fit_start(trainer, module)
    tracker.on_log_metrics(trainer, module, {"loss": 0.5, "epoch": 0}, 1)
    tracker.on_validation_start(trainer, module)  # already started: same run
    tracker.on_log_metrics(trainer, module, {"val_loss": 0.4, "epoch": 0}, 1)
    tracker.on_fit_end(trainer, module)
    tracker.teardown(trainer, module, "fit")
    tracker.on_test_start(trainer, module)  # a later test() appends to the same run
    tracker.on_log_metrics(trainer, module, {"test_acc": 1.0, "epoch": 0}, 1)
    tracker.teardown(trainer, module, "test")

    run_dir = tmp_path / "logs" / "TinyModule" / "version_0"
    assert tracker.run_dir == run_dir
    assert f"{run_dir}" in capsys.readouterr().out
    header, rows = _rows(run_dir / "metrics.csv")
    assert header == ["step", "epoch", "loss", "val_loss", "test_acc"]
    assert [(row["loss"], row["val_loss"], row["test_acc"]) for row in rows] == [
        ("0.5", "", ""),
        ("", "0.4", ""),
        ("", "", "1.0"),
    ]
    assert yaml.safe_load((run_dir / "hparams.yaml").read_text()) == {"lr": 0.01, "layers": [2, 3]}


def test_callback_does_nothing_on_other_ranks(tmp_path: Path, capsys) -> None:
    tracker = CSVTracker(logging_dir=tmp_path)
    trainer, module = SimpleNamespace(is_global_zero=False), TinyModule({})
    tracker.on_fit_start(trainer, module)
    tracker.on_log_metrics(trainer, module, {"loss": 0.5}, 1)
    tracker.on_fit_end(trainer, module)
    tracker.teardown(trainer, module, "fit")
    assert not (tmp_path / "logs").exists() and capsys.readouterr().out == ""


def test_trainer_fit_logs_to_csv(tmp_path: Path) -> None:
    pytest.importorskip("trainer.fit.trainer")
    from torch.utils.data import DataLoader, TensorDataset

    from trainer.fit.module import TrainModule
    from trainer.fit.trainer import Trainer

    class Regression(TrainModule):
        def __init__(self, lr: float = 0.05) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.layer = torch.nn.Linear(3, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.log("train_loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.hparams["lr"])

    data = TensorDataset(torch.randn(16, 3), torch.randn(16, 1))
    trainer = Trainer(
        max_epochs=2, project_dir=tmp_path, log_every_n_steps=1, enable_progress_bar=False,
        enable_checkpointing=False, enable_model_summary=False,
    )
    trainer.fit(Regression(), DataLoader(data, batch_size=4))

    run_dir = tmp_path / "logs" / "Regression" / "version_0"
    header, rows = _rows(run_dir / "metrics.csv")
    assert header[:3] == ["step", "epoch", "train_loss"]
    steps = [int(row["step"]) for row in rows if row["train_loss"]]
    assert steps == sorted(steps) and len(steps) == 8 and steps[-1] in (7, 8)
    assert {row["epoch"] for row in rows} == {"0", "1"}
    assert yaml.safe_load((run_dir / "hparams.yaml").read_text()) == {"lr": 0.05}


def test_accelerator_face_logs_to_csv(tmp_path: Path) -> None:
    pytest.importorskip("trainer.accelerator")
    from trainer import Accelerator, LoggerType

    with pytest.raises(ValueError, match="not a known tracker"):
        Accelerator(cpu=True, log_with=["csv", "tensorbored"])
    accelerator = Accelerator(cpu=True, log_with=LoggerType.CSV, project_dir=tmp_path)
    accelerator.init_trackers("acc-proj", config={"lr": 0.1, "model": {"depth": 2}})
    for step in range(3):
        accelerator.log({"loss": torch.tensor(1.0 / (step + 1)), "val": {"acc": step / 4}}, step=step)
    run_dir = accelerator.get_tracker("csv", unwrap=True).run_dir
    accelerator.end_training()

    assert run_dir == tmp_path / "logs" / "acc-proj" / "version_0"
    header, rows = _rows(run_dir / "metrics.csv")
    assert header == ["step", "loss", "val/acc"]
    assert [(row["step"], float(row["loss"]), float(row["val/acc"])) for row in rows] == [
        ("0", 1.0, 0.0),
        ("1", 0.5, 0.25),
        ("2", pytest.approx(1 / 3), 0.5),
    ]
    assert yaml.safe_load((run_dir / "hparams.yaml").read_text()) == {"lr": 0.1, "model": {"depth": 2}}
