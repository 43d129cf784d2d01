"""Lightning's remaining `Trainer` arguments, with Lightning's meaning: num_nodes, overfit_batches, sync_batchnorm,
use_distributed_sampler, reload_dataloaders_every_n_epochs, inference_mode, detect_anomaly, benchmark, profiler, max_time,
min_epochs, min_steps, barebones; and the methods' return_predictions and weights_only."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from callbacks.base import Callback
from trainer.fit.args import _check_num_nodes
from trainer.fit.module import TrainModule
from trainer.fit.trainer import Trainer

QUIET: dict[str, Any] = dict(log_with=None, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)


def _data(n: int = 32) -> TensorDataset:
    return TensorDataset(torch.arange(n * 4, dtype=torch.float32).view(n, 4) / n, torch.zeros(n, 1))


class Recorder(TrainModule):
    """Records the first feature of every training batch, the loader calls, and the grad modes it ran under."""

    def __init__(self, *, shuffle: bool = True) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 1))
        self.shuffle = shuffle
        self.train_firsts: list[float] = []
        self.val_firsts: list[float] = []
        self.loader_calls = {"train": 0, "val": 0}
        self.modes: list[tuple[bool, bool]] = []
        self.anomaly: list[bool] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.train_firsts.append(round(float(batch[0][0, 0]), 4))
        self.anomaly.append(torch.is_anomaly_enabled())
        return torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.val_firsts.append(round(float(batch[0][0, 0]), 4))
        self.modes.append((torch.is_inference_mode_enabled(), torch.is_grad_enabled()))
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(batch[0]), batch[1]))

    def train_dataloader(self) -> DataLoader:
        self.loader_calls["train"] += 1
        return DataLoader(_data(), batch_size=4, shuffle=self.shuffle)

    def val_dataloader(self) -> DataLoader:
        self.loader_calls["val"] += 1
        return DataLoader(_data(16), batch_size=4)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_num_nodes_must_agree_with_the_launched_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    _check_num_nodes(1)  # one plain process
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    _check_num_nodes(2)  # 4 processes, 2 per machine: 2 machines
    _check_num_nodes(1)  # the default: whatever the launcher started (an elastic restart may change it)
    with pytest.raises(ValueError, match=r"num_nodes=3 but the launcher started 4 processes, 2 per machine .*: 2 machine\(s\). .*pass num_nodes=2"):
        _check_num_nodes(3)


@pytest.mark.parametrize(("overfit", "batches"), [(3, 3), (0.25, 2)])
def test_overfit_batches_trains_on_the_same_first_batches_unshuffled(overfit: int | float, batches: int, tmp_path: Any) -> None:
    module = Recorder()
    trainer = Trainer(project_dir=tmp_path, max_epochs=2, overfit_batches=overfit, num_sanity_val_steps=0, **QUIET)
    with pytest.warns(UserWarning, match="overfit_batches reads the train dataloader in order"):
        trainer.fit(module)
    first_batches = [round(i * 4 * 4 / 32, 4) for i in range(batches)]  # batch i starts at sample 4*i
    assert module.train_firsts == first_batches * 2  # the same batches, in order, every epoch
    assert trainer.num_training_batches == batches and trainer.num_val_batches == (3 if overfit == 3 else 1)
    assert len(module.val_firsts) == 2 * trainer.num_val_batches  # the validation loader, limited alike (Lightning 2.x)


def test_overfit_batches_keeps_an_unshuffled_loader_silently(tmp_path: Any, recwarn: Any) -> None:
    Trainer(project_dir=tmp_path, max_epochs=1, overfit_batches=1, num_sanity_val_steps=0, **QUIET).fit(Recorder(shuffle=False))
    assert not [w for w in recwarn if "overfit_batches" in str(w.message)]


def test_reload_dataloaders_every_n_epochs(tmp_path: Any) -> None:
    module = Recorder()
    Trainer(project_dir=tmp_path, max_epochs=5, reload_dataloaders_every_n_epochs=2, limit_train_batches=2, num_sanity_val_steps=0,
            **QUIET).fit(module)
    assert module.loader_calls == {"train": 3, "val": 3}  # epochs 0, 2 and 4 (Lightning reloads both)
    module = Recorder()
    Trainer(project_dir=tmp_path, max_epochs=3, limit_train_batches=2, num_sanity_val_steps=0, **QUIET).fit(module)
    assert module.loader_calls == {"train": 1, "val": 1}


@pytest.mark.parametrize(("inference_mode", "mode"), [(True, (True, False)), (False, (False, False))])
def test_inference_mode_chooses_how_evaluation_runs(inference_mode: bool, mode: tuple[bool, bool], tmp_path: Any) -> None:
    module = Recorder()
    trainer = Trainer(project_dir=tmp_path, max_epochs=1, limit_train_batches=1, inference_mode=inference_mode, **QUIET)
    trainer.fit(module)
    trainer.validate(module)
    assert set(module.modes) == {mode}


def test_detect_anomaly_runs_fit_under_anomaly_detection(tmp_path: Any) -> None:
    module = Recorder()
    with pytest.warns(UserWarning, match="Anomaly Detection has been enabled"):
        Trainer(project_dir=tmp_path, max_epochs=1, limit_train_batches=2, detect_anomaly=True, **QUIET).fit(module)
    assert module.anomaly == [True, True] and not torch.is_anomaly_enabled()
    module = Recorder()
    Trainer(project_dir=tmp_path, max_epochs=1, limit_train_batches=2, **QUIET).fit(module)
    assert module.anomaly == [False, False]


def test_benchmark_sets_cudnn_benchmark_and_none_leaves_it(tmp_path: Any) -> None:
    before = torch.backends.cudnn.benchmark
    try:
        Trainer(project_dir=tmp_path, benchmark=True, **QUIET)
        assert torch.backends.cudnn.benchmark is True
        Trainer(project_dir=tmp_path, **QUIET)
        assert torch.backends.cudnn.benchmark is True
        Trainer(project_dir=tmp_path, benchmark=False, **QUIET)
        assert torch.backends.cudnn.benchmark is False
    finally:
        torch.backends.cudnn.benchmark = before


def test_simple_profiler_times_the_main_actions_and_prints_a_summary(tmp_path: Any, capsys: Any) -> None:
    class Timing(Callback):
        def on_train_batch_end(self, *args: Any) -> None:
            pass

    class Profiled(Recorder):
        def on_train_epoch_end(self) -> None:
            pass

    trainer = Trainer(project_dir=tmp_path, max_epochs=2, limit_train_batches=3, profiler="simple", callbacks=[Timing()], **QUIET)
    trainer.fit(Profiled(shuffle=False))
    recorded = trainer.profiler.recorded  # type: ignore[union-attr]
    counts = {name: len(times) for name, times in recorded.items() if not name.startswith("[")}
    assert counts == {"train_dataloader_next": 6, "training_step": 6, "backward": 6, "optimizer_step": 6, "validation": 2,
                      "run_training_epoch": 2}
    hooks = {name: len(times) for name, times in recorded.items() if name.startswith("[")}
    assert hooks == {"[Callback]Timing.on_train_batch_end": 6, "[LightningModule]Profiled.on_train_epoch_end": 2}
    out = capsys.readouterr().out
    assert "Profiler report (profiler='simple')" in out and "training_step" in out
    assert Trainer(project_dir=tmp_path, **QUIET).profiler is None


def test_sync_batchnorm_in_one_process_changes_nothing(tmp_path: Any) -> None:
    module = Recorder()
    Trainer(project_dir=tmp_path, max_epochs=1, limit_train_batches=1, sync_batchnorm=True, **QUIET).fit(module)
    assert type(module.net[1]) is torch.nn.BatchNorm1d


def test_use_distributed_sampler_false_in_one_process_reads_the_loader_as_is(tmp_path: Any) -> None:
    module = Recorder(shuffle=False)
    trainer = Trainer(project_dir=tmp_path, max_epochs=1, use_distributed_sampler=False, num_sanity_val_steps=0, **QUIET)
    trainer.fit(module)
    assert module.train_firsts == [round(i * 16 / 32, 4) for i in range(8)] and trainer.num_val_batches == 4


class Named(Recorder):
    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(opt, 1), "name": "my_lr"}}


def test_trainer_logger_and_a_named_schedulers_metric(tmp_path: Any) -> None:
    from callbacks.lr_monitor import LearningRateMonitor
    from callbacks.trackers import CSVLogger

    logger = CSVLogger(tmp_path, name="run")
    trainer = Trainer(project_dir=tmp_path, max_epochs=2, limit_train_batches=2, logger=logger, callbacks=[LearningRateMonitor()],
                      enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    assert trainer.logger is logger and trainer.loggers == [logger]
    module = Named()
    trainer.fit(module)
    assert module.logger is logger and module.loggers == [logger]
    header = (tmp_path / "run" / "version_0" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert "my_lr" in header and "lr-my_lr" not in header  # Lightning: a scheduler's "name" is the metric name
    default = Trainer(project_dir=tmp_path, enable_progress_bar=False, enable_model_summary=False)
    assert default.logger.log_dir == str(tmp_path / "logs" / "default")  # before its run starts
    assert Trainer(project_dir=tmp_path, **QUIET).logger is None


class NamedGroups(Recorder):
    def configure_optimizers(self) -> Any:
        groups = [{"params": self.net[0].parameters(), "name": "encoder"}, {"params": [*self.net[1].parameters(), *self.net[2].parameters()]}]
        return torch.optim.SGD(groups, lr=0.1, momentum=0.9)


def test_lr_monitor_names_param_groups_and_momentum_as_lightning(tmp_path: Any) -> None:
    from callbacks.lr_monitor import LearningRateMonitor
    from callbacks.trackers import CSVLogger

    logger = CSVLogger(tmp_path, name="run")
    trainer = Trainer(project_dir=tmp_path, max_epochs=1, limit_train_batches=2, logger=logger, num_sanity_val_steps=0, log_every_n_steps=1,
                      callbacks=[LearningRateMonitor(log_momentum=True)], enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=False)
    trainer.fit(NamedGroups())
    header = set((tmp_path / "run" / "version_0" / "metrics.csv").read_text().splitlines()[0].split(","))
    assert {"lr-SGD/encoder", "lr-SGD/pg2", "lr-SGD/encoder-momentum", "lr-SGD/pg2-momentum"} <= header


# ------------------------------------------------------------------------ max_time, min_epochs, min_steps, barebones
class StopAsked(Callback):
    """Asks to stop at the end of every training batch (or epoch), as early stopping would."""

    def __init__(self, where: str = "batch") -> None:
        self.where = where

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.where == "batch":
            trainer.should_stop = True

    def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
        if self.where == "epoch":
            trainer.should_stop = True


def _fit(tmp_path: Any, batches: int = 4, **kwargs: Any) -> Trainer:
    trainer = Trainer(project_dir=tmp_path, **{**QUIET, **kwargs})
    trainer.fit(Recorder(shuffle=False), DataLoader(_data(batches * 4), batch_size=4))
    return trainer


@pytest.mark.parametrize("max_time", ["00:00:01:00", __import__("datetime").timedelta(minutes=1), {"minutes": 1}])
def test_max_time_adds_a_timer(max_time: Any) -> None:
    from callbacks.timer import Timer

    trainer = Trainer(max_time=max_time, **QUIET)
    (timer,) = [cb for cb in trainer.callbacks if isinstance(cb, Timer)]
    assert timer.duration is not None and timer.duration.total_seconds() == 60 and timer.interval == "step"
    assert trainer.max_epochs is None  # Lightning: a time limit and no max_epochs/max_steps means no epoch limit


def test_max_time_gives_way_to_a_timer_and_is_checked() -> None:
    from callbacks.timer import Timer

    mine = Timer(duration={"hours": 1})
    with pytest.warns(UserWarning, match="max_time.*ignored"):
        trainer = Trainer(max_time="00:00:01:00", callbacks=[mine], **QUIET)
    assert [cb for cb in trainer.callbacks if isinstance(cb, Timer)] == [mine]
    with pytest.raises(ValueError, match=r"max_time='1h'.*DD:HH:MM:SS"):
        Trainer(max_time="1h")
    with pytest.raises(TypeError, match="max_time=60"):
        Trainer(max_time=60)


def test_max_time_stops_training(tmp_path: Any) -> None:
    trainer = _fit(tmp_path, max_time={"microseconds": 1})  # spent after the first batch
    assert trainer.global_step == 1 and trainer.max_epochs is None


@pytest.mark.parametrize(("limits", "steps", "epochs"), [
    ({}, 1, 1),  # the stop asked after the first batch ends the epoch there
    ({"min_steps": 6}, 6, 2),  # min_steps without min_epochs: also a whole first epoch (Lightning's rule)
    ({"min_steps": 2}, 4, 1),
    ({"min_steps": 2, "min_epochs": 0}, 2, 1),
    ({"min_epochs": 2}, 8, 2),
])
def test_min_steps_and_min_epochs_hold_back_a_stop(tmp_path: Any, limits: dict[str, int], steps: int, epochs: int) -> None:
    trainer = _fit(tmp_path, max_epochs=5, callbacks=[StopAsked()], **limits)
    assert (trainer.global_step, trainer.current_epoch) == (steps, epochs)


def test_min_epochs_with_a_stop_at_epoch_end(tmp_path: Any) -> None:
    assert _fit(tmp_path, max_epochs=10, callbacks=[StopAsked("epoch")], min_epochs=3).current_epoch == 3
    assert _fit(tmp_path, max_epochs=10, callbacks=[StopAsked("epoch")]).current_epoch == 1
    assert _fit(tmp_path, max_epochs=2, callbacks=[StopAsked("epoch")], min_epochs=3).current_epoch == 2  # max_epochs wins
    with pytest.raises(ValueError, match="min_steps=-1"):
        Trainer(min_steps=-1)


def test_barebones_turns_off_what_costs_speed(tmp_path: Any) -> None:
    trainer = Trainer(barebones=True, max_epochs=1, project_dir=tmp_path)
    assert trainer.callbacks == [] and trainer.num_sanity_val_steps == 0 and trainer.barebones

    class Logs(Recorder):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            loss = super().training_step(batch, batch_idx)
            self.log("loss", loss)
            return loss

    with pytest.warns(UserWarning, match="barebones"):
        trainer.fit(Logs(), DataLoader(_data(8), batch_size=4))
    assert trainer.global_step == 2 and trainer.callback_metrics == {}
    assert not list(tmp_path.iterdir())  # no logs, no checkpoints


@pytest.mark.parametrize("turned_on", [
    {"enable_checkpointing": True}, {"enable_progress_bar": True}, {"enable_model_summary": True}, {"logger": True},
    {"log_every_n_steps": 50}, {"num_sanity_val_steps": 2}, {"fast_dev_run": True}, {"detect_anomaly": True},
    {"profiler": "simple"}, {"log_with": "tensorboard"},
])
def test_barebones_refuses_what_was_turned_on(turned_on: dict[str, Any]) -> None:
    (name, value), = turned_on.items()
    with pytest.raises(ValueError, match=rf"barebones=True, {name}={value!r}"):
        Trainer(barebones=True, **turned_on)


# ------------------------------------------------------------------------ predict(return_predictions=...), weights_only
class Predicts(Recorder):
    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return batch[0][:, 0]


class WritesPredictions(Callback):
    def __init__(self) -> None:
        self.written: list[torch.Tensor] = []

    def on_predict_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.written.append(outputs)


def test_predict_without_returning_predictions(tmp_path: Any) -> None:
    writer = WritesPredictions()
    trainer = Trainer(project_dir=tmp_path, callbacks=[writer], **QUIET)
    loader = DataLoader(_data(8), batch_size=4)
    assert trainer.predict(Predicts(), loader, return_predictions=False) is None
    assert torch.cat(writer.written).tolist() == _data(8).tensors[0][:, 0].tolist()
    returned = trainer.predict(Predicts(), loader, None, True)  # Lightning's order: model, dataloaders, datamodule, return_predictions
    assert returned is not None and torch.cat(returned).tolist() == _data(8).tensors[0][:, 0].tolist()


def test_weights_only(tmp_path: Any) -> None:
    trainer = Trainer(project_dir=tmp_path, max_epochs=1, **{**QUIET, "enable_checkpointing": True})
    module, loader = Predicts(), DataLoader(_data(8), batch_size=4)
    trainer.fit(module, loader, weights_only=None)
    assert "val_loss" in trainer.validate(module, loader, ckpt_path="last", weights_only=True)[0]
    assert trainer.checkpoint_callback is not None
    assert isinstance(Predicts.load_from_checkpoint(trainer.checkpoint_callback.best_model_path, weights_only=True), Predicts)
    for call in (lambda: trainer.fit(module, loader, weights_only=False), lambda: trainer.test(module, loader, weights_only=False),
                 lambda: trainer.predict(module, loader, weights_only=False),
                 lambda: type(module).load_from_checkpoint(tmp_path, weights_only=False)):
        with pytest.raises(ValueError, match=r"weights_only=False\) asks to unpickle the checkpoint, but checkpoints here hold no pickles"):
            call()
    with pytest.raises(TypeError, match="weights_only='yes'"):
        trainer.validate(module, loader, weights_only="yes")  # type: ignore[arg-type]
