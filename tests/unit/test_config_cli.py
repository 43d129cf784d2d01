"""`trainer.cli.LightningCLI` in-process: args as a list or a dict, ``run=False``, environment variables, defaults,
subclass mode, links, and the saved config (Lightning 2.6's contract)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

pytest.importorskip("jsonargparse")

from callbacks import Callback
from trainer import DataModule, TrainModule
from trainer.cli import LightningCLI, ReduceLROnPlateau, SaveConfigCallback


class Data(DataModule):
    def __init__(self, batch_size: int = 4, size: int = 16) -> None:
        super().__init__()
        self.batch_size, self.size = batch_size, size

    def train_dataloader(self) -> DataLoader:
        x = torch.arange(self.size * 2, dtype=torch.float32).reshape(self.size, 2) / self.size
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=self.batch_size)

    val_dataloader = test_dataloader = predict_dataloader = train_dataloader


class Model(TrainModule):
    def __init__(self, width: int = 2, lr: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = nn.Linear(width, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = nn.functional.mse_loss(self.layer(batch[0]), batch[1])
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", nn.functional.mse_loss(self.layer(batch[0]), batch[1]))

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0])

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class WideModel(Model):
    def __init__(self, extra: int = 3, lr: float = 0.1) -> None:
        super().__init__(width=2, lr=lr)
        self.extra = extra


class Marker(Callback):
    pass


@pytest.fixture(autouse=True)
def _no_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["main.py"])  # args= is the command line here


QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


def test_run_false_with_a_list_and_a_dict() -> None:
    cli = LightningCLI(Model, Data, run=False, args=["--model.width=2", "--trainer.max_epochs=2", "--data.size=8"])
    assert cli.subcommand is None and isinstance(cli.model, Model) and cli.datamodule is not None and cli.datamodule.size == 8
    assert cli.trainer.max_epochs == 2 and not (Path("logs")).exists()  # nothing ran
    cli = LightningCLI(Model, Data, run=False, args={"model": {"lr": 0.5}, "trainer": {"max_steps": 3}})
    assert cli.model is not None and cli.model.hparams.lr == 0.5 and cli.trainer.max_steps == 3


def test_fit_saves_the_config_and_refuses_to_overwrite_it() -> None:
    args = ["fit", "--trainer.max_epochs=1", "--trainer.logger=null", *QUIET]
    cli = LightningCLI(Model, Data, args=args, trainer_defaults={"log_with": None})
    assert cli.trainer.global_step == 4  # 16 samples / 4
    saved = Path("logs") / "config.yaml"  # no tracker: trainer.log_dir is <project_dir>/logs
    assert yaml.safe_load(saved.read_text())["trainer"]["max_epochs"] == 1
    with pytest.raises(RuntimeError, match=r"config.yaml to NOT exist.*save_config_kwargs=\{\"overwrite\": True\}"):
        LightningCLI(Model, Data, args=[*args[:1], "--trainer.max_epochs=2", *args[2:]], trainer_defaults={"log_with": None})
    assert yaml.safe_load(saved.read_text())["trainer"]["max_epochs"] == 1
    LightningCLI(Model, Data, args=[*args[:1], "--trainer.max_epochs=2", *args[2:]], trainer_defaults={"log_with": None},
                 save_config_kwargs={"overwrite": True})
    assert yaml.safe_load(saved.read_text())["trainer"]["max_epochs"] == 2
    LightningCLI(Model, Data, args=args, trainer_defaults={"log_with": None}, save_config_callback=None)  # saves none: no error


def test_configs_merge_in_order_and_the_command_line_wins(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("trainer:\n  max_epochs: 5\n  max_steps: 7\nmodel:\n  lr: 0.2\n")
    (tmp_path / "b.yaml").write_text("trainer:\n  max_epochs: 6\n")
    cli = LightningCLI(Model, Data, run=False, args=["--config", str(tmp_path / "a.yaml"), "--config", str(tmp_path / "b.yaml"),
                                                     "--trainer.max_steps=9"])
    assert (cli.trainer.max_epochs, cli.trainer.max_steps) == (6, 9) and cli.model is not None and cli.model.hparams.lr == 0.2


def test_environment_variables(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PL_TRAINER__MAX_EPOCHS", "4")
    cli = LightningCLI(Model, Data, run=False, args=[])
    assert cli.config["trainer"]["max_epochs"] is None  # not read without default_env
    cli = LightningCLI(Model, Data, run=False, args=[], parser_kwargs={"default_env": True})
    assert cli.trainer.max_epochs == 4
    monkeypatch.setenv("MY_MODEL__LR", "0.3")
    cli = LightningCLI(Model, Data, run=False, args=[], parser_kwargs={"default_env": True, "env_prefix": "MY"})
    assert cli.model is not None and cli.model.hparams.lr == 0.3 and cli.config["trainer"]["max_epochs"] is None
    (tmp_path / "env.yaml").write_text("trainer:\n  max_steps: 11\n")
    monkeypatch.setenv("PL_CONFIG", str(tmp_path / "env.yaml"))
    cli = LightningCLI(Model, Data, run=False, args=[], parser_kwargs={"default_env": True})
    assert cli.trainer.max_steps == 11


def test_trainer_defaults_and_the_seed() -> None:
    marker = Marker()
    cli = LightningCLI(Model, Data, run=False, args=[], trainer_defaults={"max_epochs": 3, "callbacks": [marker]},
                       seed_everything_default=123)
    assert cli.trainer.max_epochs == 3 and marker in cli.trainer.callbacks
    assert cli.config["seed_everything"] == 123
    first = torch.rand(1)
    LightningCLI(Model, Data, run=False, args=[], seed_everything_default=123)
    assert torch.equal(torch.rand(1), first)  # seeded again, the same draw
    cli = LightningCLI(Model, Data, run=False, args=["--seed_everything=false"])
    assert cli.config["seed_everything"] is False
    cli = LightningCLI(Model, Data, run=False, args=[])  # True: a random seed, recorded in the config
    assert isinstance(cli.config["seed_everything"], int) and not isinstance(cli.config["seed_everything"], bool)


def test_subclass_mode_callbacks_optimizer_and_scheduler_by_class_path() -> None:
    args = ["--model", "tests.unit.test_config_cli.WideModel", "--model.extra=5",
            "--trainer.callbacks+=tests.unit.test_config_cli.Marker",
            "--optimizer=torch.optim.Adam", "--optimizer.lr=0.01",
            "--lr_scheduler=ReduceLROnPlateau", "--lr_scheduler.monitor=val_loss"]
    with pytest.warns(UserWarning, match="WideModel.configure_optimizers` will be overridden"):
        cli = LightningCLI(Model, Data, run=False, subclass_mode_model=True, args=args)
    assert type(cli.model) is WideModel and cli.model.extra == 5
    assert any(type(c) is Marker for c in cli.trainer.callbacks)
    configured = cli.model.configure_optimizers()
    assert isinstance(configured["optimizer"], torch.optim.Adam) and configured["optimizer"].param_groups[0]["lr"] == 0.01
    assert isinstance(configured["lr_scheduler"]["scheduler"], ReduceLROnPlateau) and configured["lr_scheduler"]["monitor"] == "val_loss"
    with pytest.raises(SystemExit):  # without subclass mode, a class path is not a Model argument
        LightningCLI(Model, Data, run=False, args=args[:2])


def test_links_and_predict() -> None:
    class LinkedCLI(LightningCLI):
        def add_arguments_to_parser(self, parser: Any) -> None:
            parser.link_arguments("data.batch_size", "model.width", compute_fn=lambda b: b // 2)

    cli = LinkedCLI(Model, Data, args=["predict", "--data.batch_size=4", "--trainer.logger=null", *QUIET],
                    trainer_defaults={"log_with": None})
    assert cli.model is not None and cli.model.hparams.width == 2 and os.path.exists("logs/config.yaml")
    with pytest.raises(SystemExit):  # a link target is not an option
        LinkedCLI(Model, Data, run=False, args=["--model.width=3"])


def test_bad_arguments_are_clear() -> None:
    with pytest.raises(TypeError, match="subclass of Trainer, TrainModule, DataModule or Callback"):
        LightningCLI(Model, run=False, args=[]).parser.add_lightning_class_args(int, "x")
    with pytest.raises(ValueError, match="save_to_log_dir=False"):
        SaveConfigCallback(None, None, save_to_log_dir=False)  # type: ignore[arg-type]


def test_the_trainer_command_does_not_load_the_config_cli() -> None:
    import subprocess

    code = "import sys, trainer.cli; print(sorted(m for m in sys.modules if m.startswith(('jsonargparse', 'trainer.fit'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"
