"""Lightning's CSVLogger and TensorBoardLogger, by their constructor arguments, write where Lightning writes."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from callbacks.trackers import CSVLogger, TensorBoardLogger
from trainer import Trainer, TrainModule


class Net(TrainModule):
    def __init__(self, lr: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.lin = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        loss = self.lin(batch[0]).pow(2).mean()
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


def _fit(tmp_path: Path, logger) -> None:
    loader = DataLoader(TensorDataset(torch.randn(16, 2)), batch_size=4)
    Trainer(project_dir=tmp_path / "project", logger=logger, max_epochs=2, log_every_n_steps=1, enable_progress_bar=False,
            enable_model_summary=False, enable_checkpointing=False).fit(Net(), loader)


def test_csv_logger_writes_lightnings_layout(tmp_path: Path) -> None:
    first = CSVLogger(tmp_path / "logs", name="exp")
    _fit(tmp_path, first)
    run = tmp_path / "logs" / "exp" / "version_0"
    assert first.log_dir == str(run) and (run / "hparams.yaml").read_text().strip() == "lr: 0.1"
    rows = list(csv.DictReader((run / "metrics.csv").read_text().splitlines()))
    assert len(rows) == 8 and float(rows[0]["train_loss"]) > 0
    # Lightning's rows: the step before each optimizer step (from 0), and the epoch with every self.log value
    assert [(row["step"], row["epoch"]) for row in rows] == [(str(i), str(i // 4)) for i in range(8)]
    _fit(tmp_path, CSVLogger(tmp_path / "logs", name="exp"))
    assert (tmp_path / "logs" / "exp" / "version_1" / "metrics.csv").is_file()
    _fit(tmp_path, CSVLogger(tmp_path / "logs", name="exp", version="fixed", prefix="p"))
    fixed = list(csv.DictReader((tmp_path / "logs" / "exp" / "fixed" / "metrics.csv").read_text().splitlines()))
    assert "p-train_loss" in fixed[0]


def test_csv_rows_of_a_learning_rate_monitor_have_no_epoch(tmp_path: Path) -> None:
    from callbacks.lr_monitor import LearningRateMonitor

    logger = CSVLogger(tmp_path / "logs", name="exp")
    loader = DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=4)
    Trainer(project_dir=tmp_path / "project", logger=logger, max_epochs=1, log_every_n_steps=1, enable_progress_bar=False,
            enable_model_summary=False, enable_checkpointing=False, callbacks=[LearningRateMonitor()]).fit(Net(), loader)
    rows = list(csv.DictReader((Path(logger.log_dir) / "metrics.csv").read_text().splitlines()))
    # as Lightning's CSVLogger writes them: the monitor passes its step itself, so its rows carry no epoch
    assert [(row["step"], row["epoch"], bool(row["lr-SGD"]), bool(row["train_loss"])) for row in rows] == [
        ("0", "", True, False), ("0", "0", False, True), ("1", "", True, False), ("1", "0", False, True),
    ]


def test_tensorboard_logger_writes_lightnings_layout(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = TensorBoardLogger(tmp_path / "tb", name="exp", version=3)
    _fit(tmp_path, logger)
    run = tmp_path / "tb" / "exp" / "version_3"
    assert logger.log_dir == str(run) and list(run.glob("events.out.tfevents.*"))
    events = EventAccumulator(str(run))
    events.Reload()
    assert len(events.Scalars("train_loss")) == 8


def test_wandb_logger_takes_lightnings_arguments_offline(tmp_path: Path, offline_env: Path) -> None:
    pytest.importorskip("wandb")
    import json

    from test_tracker_wandb import _records

    from callbacks.trackers import WandbLogger

    logger = WandbLogger(name="first-run", project="proj", offline=True, save_dir=tmp_path / "wb", prefix="p")
    _fit(tmp_path, logger)
    (run_file,) = (tmp_path / "wb" / "wandb").glob("offline-run-*/run-*.wandb")
    history, run = [], None
    for kind, record in _records(run_file):
        if kind == "history":
            history.append({item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item})
        elif kind == "run":
            run = record.run
    assert run is not None and run.project == "proj" and run.display_name == "first-run"
    assert len([row for row in history if "p-train_loss" in row]) == 8
    with pytest.raises(ValueError, match=r"WandbLogger does not support \['log_model'\]"):
        WandbLogger(log_model=True)


def test_mlflow_logger_takes_lightnings_arguments(tmp_path: Path, offline_env: Path) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from callbacks.trackers import MLFlowLogger

    logger = MLFlowLogger(experiment_name="exp", run_name="r1", save_dir=tmp_path / "mlruns", tags={"team": "a"})
    _fit(tmp_path, logger)
    client = MlflowClient((tmp_path / "mlruns").as_uri())  # Lightning's layout: save_dir is the file store
    experiment = client.get_experiment_by_name("exp")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "r1" and run.data.tags["team"] == "a" and run.data.params == {"lr": "0.1"}
    assert len(client.get_metric_history(run.info.run_id, "train_loss")) == 8
    with pytest.raises(ValueError, match=r"MLFlowLogger does not support \['asynchronous'\]"):
        MLFlowLogger(synchronous=False)


def test_comet_logger_takes_lightnings_arguments_offline(tmp_path: Path, offline_env: Path) -> None:
    pytest.importorskip("comet_ml")
    import json
    import zipfile

    from callbacks.trackers import CometLogger

    logger = CometLogger(project="proj", online=False, prefix="p", name="first-run", offline_directory=str(tmp_path / "comet"))
    _fit(tmp_path, logger)
    (archive,) = (tmp_path / "comet").glob("*.zip")
    with zipfile.ZipFile(archive) as handle:
        experiment = json.loads(handle.read("experiment.json"))
        messages = [json.loads(line) for line in handle.read("messages.json").splitlines() if line.strip()]
    assert experiment["project_name"] == "proj"
    params = {m["payload"]["param"]["paramName"]: m["payload"]["param"]["paramValue"] for m in messages if m["type"] == "parameter_msg"}
    assert params["lr"] in (0.1, "0.1")
    metrics = [m["payload"]["metric"] for m in messages if m["type"] == "metric_msg"]
    losses = [(metric["step"], metric["epoch"]) for metric in metrics if metric["metricName"] == "p_train_loss"]
    assert losses == [(i, i // 4) for i in range(8)]  # Lightning's steps, the epoch as Comet's epoch, not a metric
    assert not [metric for metric in metrics if metric["metricName"] in ("epoch", "p_epoch")]
    others = {m["payload"]["key"]: m["payload"]["value"] for m in messages if m["type"] == "log_other"}
    assert others["Name"] == "first-run"  # name= went to comet_ml.ExperimentConfig, as in Lightning
    with pytest.raises(ValueError, match="mode='sometimes'"):
        CometLogger(mode="sometimes")
    with pytest.raises(ValueError, match="both offline= and online="):
        CometLogger(offline=True, online=False)
    old = CometLogger(project_name="old", experiment_name="n", save_dir="dir", offline=True)
    assert (old._project, old.init_kwargs["online"], old.save_dir, old._config_kwargs["name"]) == ("old", False, "dir", "n")
