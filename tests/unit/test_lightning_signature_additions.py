"""The parameters and methods added so that our signatures take Lightning 2.6's calls (see
``tests/unit/test_lightning_signatures.py``): each does what Lightning's does, or raises naming what to use."""

from __future__ import annotations

import argparse
import inspect
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback, LearningRateMonitor
from callbacks.trackers import CSVLogger
from trainer import DataModule, Trainer, TrainModule

QUIET = {"log_with": None, "enable_progress_bar": False, "enable_model_summary": False, "enable_checkpointing": False}


def _data(n: int = 4) -> DataLoader:
    return DataLoader(TensorDataset(torch.arange(n * 2.0).reshape(n, 2) / 10), batch_size=2)


class Line(TrainModule):
    def __init__(self, width: int = 2, lr: float = 0.1) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(width, 1)
        self.events: list[Any] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, weight_decay=0.01)


def test_fit_validate_test_predict_take_lightnings_model_keyword(tmp_path: Path) -> None:
    trainer = Trainer(max_epochs=1, project_dir=tmp_path, **QUIET)
    module = Line()
    trainer.fit(model=module, train_dataloaders=_data())
    assert trainer.global_step == 2
    assert trainer.predict(model=module, dataloaders=_data(2))[0].shape == (2, 1)


def test_the_trainers_lightning_only_arguments(tmp_path: Path) -> None:
    assert inspect.signature(Trainer).parameters["max_steps"].default == -1
    assert Trainer(max_steps=-1, max_epochs=1, **QUIET).max_steps is None  # -1 and None: no step limit
    with pytest.raises(NotImplementedError, match=r"model_registry='hub/model'.*not offered"):
        Trainer(model_registry="hub/model")
    with pytest.raises(TypeError, match=r"enable_autolog_hparams='no'\) must be True or False"):
        Trainer(enable_autolog_hparams="no")  # type: ignore[arg-type]


def _hparams_logged(tmp_path: Path, module: TrainModule, **kwargs: Any) -> dict[str, Any]:
    logger = CSVLogger(str(tmp_path), name="m", version=0)
    Trainer(max_epochs=1, logger=logger, project_dir=tmp_path, enable_progress_bar=False, enable_model_summary=False,
            enable_checkpointing=False, **kwargs).fit(module, _data())
    path = tmp_path / "m" / "version_0" / "hparams.yaml"
    return (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}


def test_hyperparameters_reach_the_trackers_unless_switched_off(tmp_path: Path) -> None:
    assert _hparams_logged(tmp_path / "on", Line(width=2)) == {"width": 2, "lr": 0.1}
    assert _hparams_logged(tmp_path / "off", Line(), enable_autolog_hparams=False) == {}

    class Quiet(Line):
        def __init__(self) -> None:
            super().__init__()
            self.save_hyperparameters(logger=False)

    quiet = Quiet()
    assert _hparams_logged(tmp_path / "quiet", quiet) == {}
    assert dict(quiet.hparams) == {"width": 2, "lr": 0.1}  # still kept (and saved in checkpoints)


def test_save_hyperparameters_takes_a_mapping_or_a_frame() -> None:
    class FromDict(TrainModule):
        def __init__(self, config: dict[str, Any]) -> None:
            super().__init__()
            self.save_hyperparameters(config, ignore="secret")

    assert dict(FromDict({"lr": 0.5, "secret": 1}).hparams) == {"lr": 0.5}

    class FromNamespace(TrainModule):
        def __init__(self, args: argparse.Namespace) -> None:
            super().__init__()
            self.save_hyperparameters(args)

    assert dict(FromNamespace(argparse.Namespace(depth=3)).hparams) == {"depth": 3}

    class FromFrame(TrainModule):
        def __init__(self, depth: int) -> None:
            super().__init__()
            self.build(depth * 2)

        def build(self, size: int) -> None:
            self.save_hyperparameters(frame=inspect.currentframe())

    assert dict(FromFrame(3).hparams) == {"depth": 3}  # Lightning 2.6.6's: the walk goes up to the __init__ arguments
    with pytest.raises(TypeError, match="pass argument names, or one dict"):
        FromDict.save_hyperparameters(FromDict({}), 3)


def test_load_from_checkpoint_reads_an_hparams_file(tmp_path: Path) -> None:
    trainer = Trainer(max_epochs=1, project_dir=tmp_path, **QUIET)
    trainer.fit(Line(lr=0.1), _data())
    trainer.save_checkpoint(tmp_path / "ckpt")
    (tmp_path / "h.yaml").write_text("lr: 0.5\n")
    module = Line.load_from_checkpoint(tmp_path / "ckpt", None, tmp_path / "h.yaml")  # Lightning's positions
    assert module.hparams.lr == 0.5
    assert Line.load_from_checkpoint(tmp_path / "ckpt", hparams_file=tmp_path / "h.yaml", lr=0.7).hparams.lr == 0.7
    (tmp_path / "h.csv").write_text("lr,0.5\n")
    with pytest.raises(ValueError, match=r"hparams_file=.*h.csv.*pass a .yaml or .yml file"):
        Line.load_from_checkpoint(tmp_path / "ckpt", hparams_file=tmp_path / "h.csv")


class ManualModule(Line):
    automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> None:
        wrapped, raw = self.optimizers(), self.optimizers(use_pl_optimizer=False)
        self.events.append((type(wrapped).__name__, raw is self.trainer.optimizers[0]))
        loss = super().training_step(batch, batch_idx)
        wrapped.zero_grad()
        self.manual_backward(loss, None, True)  # Tensor.backward's gradient, retain_graph: by position, as Lightning
        self.manual_backward(loss)  # the graph was kept
        wrapped.step()


def test_manual_optimization_arguments(tmp_path: Path) -> None:
    module = ManualModule()
    trainer = Trainer(max_epochs=1, project_dir=tmp_path, **QUIET)
    trainer.fit(module, _data())
    assert module.events == [("ManualOptimizer", True)] * 2 and trainer.global_step == 2


def test_all_gather_takes_lightnings_arguments(tmp_path: Path) -> None:
    module = Line()
    Trainer(max_epochs=1, project_dir=tmp_path, **QUIET).fit(module, _data())
    value = torch.ones(2, requires_grad=True)
    assert module.all_gather(value, sync_grads=True) is value  # one process: nothing to gather
    with pytest.raises(NotImplementedError, match=r"group=.*sub-group is not offered"):
        module.all_gather(value, group=object())


def test_prepare_data_and_the_old_configure_sharded_model_hook_run(tmp_path: Path) -> None:
    class Hooks(Line):
        def prepare_data(self) -> None:
            self.events.append("prepare_data")

        def setup(self, stage: str) -> None:
            self.events.append(f"setup:{stage}")

        def configure_sharded_model(self) -> None:
            self.events.append("configure_sharded_model")

    module = Hooks()
    with pytest.warns(DeprecationWarning, match="configure_sharded_model is deprecated.*configure_model"):
        Trainer(max_epochs=1, project_dir=tmp_path, **QUIET).fit(module, _data())
    assert module.events == ["prepare_data", "setup:fit", "configure_sharded_model"]

    class Both(Hooks):
        def configure_model(self) -> None:
            pass

    with pytest.raises(RuntimeError, match="both configure_model and configure_sharded_model"):
        Trainer(max_epochs=1, project_dir=tmp_path, **QUIET).fit(Both(), _data())


def test_the_module_dataloader_methods_default_to_none(tmp_path: Path) -> None:
    module = Line()
    assert (module.train_dataloader(), module.val_dataloader(), module.test_dataloader(), module.predict_dataloader()) == (None,) * 4
    with pytest.raises(ValueError, match=r"no train dataloader: pass one.*define train_dataloader"):
        Trainer(max_epochs=1, project_dir=tmp_path, **QUIET).fit(module)


def test_a_datamodule_hears_of_an_exception_after_the_callbacks(tmp_path: Path) -> None:
    order: list[str] = []

    class Data(DataModule):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)  # Lightning's signature

        def train_dataloader(self) -> Any:
            return _data()

        def on_exception(self, exception: BaseException) -> None:
            order.append(f"datamodule:{exception}")

    class Note(Callback):
        def on_exception(self, trainer: Any, module: Any, exception: BaseException) -> None:
            order.append("callback")

    class Fails(Line):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            raise KeyError("boom")

    with pytest.raises(KeyError):
        Trainer(max_epochs=1, project_dir=tmp_path, callbacks=[Note()], **QUIET).fit(Fails(), datamodule=Data(1, a=2))
    assert order == ["callback", "datamodule:'boom'"]


def test_learning_rate_monitor_logs_weight_decay(tmp_path: Path) -> None:
    logger = CSVLogger(str(tmp_path), name="m", version=0)
    Trainer(max_epochs=1, logger=logger, log_every_n_steps=1, project_dir=tmp_path, enable_progress_bar=False,
            enable_model_summary=False, enable_checkpointing=False,
            callbacks=[LearningRateMonitor(log_weight_decay=True)]).fit(Line(), _data())
    header = (tmp_path / "m" / "version_0" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"lr-SGD", "lr-SGD-weight_decay"} <= set(header)


def test_the_default_steps_take_any_arguments() -> None:
    module = Line()
    assert module.predict_step(batch=(torch.ones(1, 2),), batch_idx=0).shape == (1, 1)
    with pytest.raises(NotImplementedError, match="must implement validation_step"):
        module.validation_step(torch.ones(1, 2), 0, 1)
    with pytest.raises(NotImplementedError, match='missing the required "forward"'):
        TrainModule()(torch.ones(1))


def test_the_datamodules_hyperparameters_are_logged_with_the_modules(tmp_path: Path) -> None:
    class Data(DataModule):
        def __init__(self, batch_size: int = 2, lr: float = 0.1) -> None:
            super().__init__()
            self.save_hyperparameters()

        def train_dataloader(self) -> Any:
            return _data()

    def logged(data: DataModule, where: str) -> dict[str, Any]:
        logger = CSVLogger(str(tmp_path / where), name="m", version=0)
        Trainer(max_epochs=1, logger=logger, project_dir=tmp_path, enable_progress_bar=False, enable_model_summary=False,
                enable_checkpointing=False).fit(Line(), datamodule=data)
        return yaml.safe_load((tmp_path / where / "m" / "version_0" / "hparams.yaml").read_text())

    assert logged(Data(batch_size=4), "both") == {"width": 2, "lr": 0.1, "batch_size": 4}
    with pytest.raises(RuntimeError, match=r"\['lr'\] are in both the module's and the DataModule's hparams"):
        logged(Data(lr=0.3), "clash")


def test_strategy_root_device_is_lightnings_name_for_its_device() -> None:
    trainer = Trainer(accelerator="cpu", devices=1, log_with=None, enable_progress_bar=False)
    assert trainer.strategy.root_device == trainer.strategy.device == torch.device("cpu")
