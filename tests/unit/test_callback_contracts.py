"""The seams between the Trainer, the module and the callbacks: `TrainerView`, the ordering attributes, `overrides`,
`ValidationSchedule`, and the event list written once."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest

from callbacks.base import Callback, in_fit, overrides
from callbacks.checkpoint import ModelCheckpoint
from callbacks.early_stopping import EarlyStopping
from callbacks.events import ALL_EVENTS, MODULE_EVENTS
from callbacks.on_exception import OnExceptionCheckpoint
from callbacks.view import ModuleTrainerView, TrainerView, ValidationSchedule
from trainer.fit.dispatch import order_callbacks
from trainer.fit.module import TrainModule
from trainer.fit.trainer import Trainer

_NOT_HOOKS = {"state_dict", "load_state_dict", "idle_batch_hooks"}
_TRANSFER_HOOKS = {"on_before_batch_transfer", "on_after_batch_transfer"}
# Lightning's module-only hooks around an evaluation loop (no callback has them; the loop calls them itself)
_MODEL_MODE_HOOKS = {"on_validation_model_eval", "on_validation_model_train", "on_test_model_eval", "on_test_model_train",
                     "on_predict_model_eval"}


def test_the_callback_base_has_one_method_per_event_in_loop_order() -> None:
    hooks = [name for name, value in vars(Callback).items() if inspect.isfunction(value) and not name.startswith("_") and name not in _NOT_HOOKS]
    assert hooks == list(ALL_EVENTS)


def test_the_module_has_one_hook_per_module_event() -> None:
    hooks = {name for name in vars(TrainModule) if (name.startswith("on_") or name in ("setup", "teardown")) and name not in _TRANSFER_HOOKS | _MODEL_MODE_HOOKS}
    assert hooks == set(MODULE_EVENTS)


def test_a_trainer_has_every_member_of_the_views(tmp_path: Path) -> None:
    def members(view: type) -> set[str]:
        return {name for name in vars(view) if not name.startswith("_")} | set(view.__annotations__)

    callbacks, module = members(TrainerView), members(TrainerView) | members(ModuleTrainerView)
    trainer = Trainer(project_dir=tmp_path, log_with=None, enable_progress_bar=False)
    assert {"run_state", "global_step", "validation_schedule", "save_checkpoint", "strategy"} <= callbacks
    assert "log_value" not in callbacks and {"log_value", "manual_backward", "step_manual_optimizer"} <= module
    assert [name for name in sorted(module) if not hasattr(trainer, name)] == []


class _Flags(Callback):
    runs_last = True


class _OldFlags(Callback):
    _runs_last = True  # the names before they were public still count
    _monitors_metrics = True


def test_ordering_is_declared_by_public_class_attributes() -> None:
    plain, last, old = Callback(), _Flags(), _OldFlags()
    assert order_callbacks([last, old, plain]) == [plain, last, old]
    assert (ModelCheckpoint.runs_last, ModelCheckpoint.monitors_metrics) == (True, True)
    assert (EarlyStopping.runs_last, EarlyStopping.monitors_metrics) == (False, True)
    assert _OldFlags.monitors_metrics and not Callback.monitors_metrics and not Callback.runs_last


class _Base:
    def hook(self) -> None: ...


class _Same(_Base):
    pass


class _Own(_Base):
    def hook(self) -> None: ...


class _Extra(_Base):
    def other(self) -> None: ...

    prop = property(lambda self: 1)


def test_overrides() -> None:
    assert overrides(_Own(), "hook", _Base) and not overrides(_Same(), "hook", _Base)
    assert overrides(_Extra(), "other", _Base)  # the base lacks it
    assert not overrides(_Extra(), "prop", _Base) and not overrides(_Extra(), "missing", _Base)
    assert not overrides(None, "hook", _Base)


@pytest.mark.parametrize(
    ("interval", "every", "total", "epoch", "due_after"),
    [
        (None, 1, 4, 0, [3]),  # the epoch's end
        (2, 1, 5, 0, [1, 3]),  # every 2 batches
        (0.5, 1, 4, 0, [1, 3]),  # every half epoch
        (8, 1, 4, 0, [3]),  # longer than the epoch: its end
        (None, 2, 4, 0, []),  # every 2nd epoch: not the first
        (None, 2, 4, 1, [3]),
        (1.0, 1, float("inf"), 0, [3]),  # a stream: its end (the last batch is known while in use)
        (3, 1, float("inf"), 0, [2]),  # a stream: every 3 batches only
    ],
)
def test_validation_schedule_due(interval: Any, every: int, total: float, epoch: int, due_after: list[int]) -> None:
    schedule = ValidationSchedule(interval, every, total)
    assert [i for i in range(4) if schedule.due(epoch, i, last=i == 3)] == due_after


def test_validation_schedule_once_per_epoch() -> None:
    assert ValidationSchedule(None, 1, 4).once_per_epoch and ValidationSchedule(1.0, 1, 4).once_per_epoch
    assert ValidationSchedule(4, 1, 4).once_per_epoch and not ValidationSchedule(2, 1, 4).once_per_epoch
    assert not ValidationSchedule(0.5, 1, 4).once_per_epoch and not ValidationSchedule(None, 2, 4).once_per_epoch


def test_the_trainer_owns_its_schedule(tmp_path: Path) -> None:
    trainer = Trainer(project_dir=tmp_path, log_with=None, val_check_interval=2, check_val_every_n_epoch=3)
    trainer.num_training_batches = 6
    assert trainer.validation_schedule == ValidationSchedule(2, 3, 6)
    assert (trainer.val_check_interval, trainer.check_val_every_n_epoch, trainer.num_training_batches) == (2, 3, 6)


class _Stage:
    def __init__(self, stage: str | None, sanity_checking: bool = False) -> None:
        self.stage, self.sanity_checking = stage, sanity_checking


def test_in_fit() -> None:
    view: Any = _Stage("fit")
    assert in_fit(view) and not in_fit(_Stage("fit", True)) and in_fit(_Stage("fit", True), sanity_check=True)  # type: ignore[arg-type]
    assert not in_fit(_Stage("validate")) and not in_fit(_Stage(None))  # type: ignore[arg-type]


def test_a_default_callback_is_not_added_when_a_subclass_is_passed(tmp_path: Path) -> None:
    class Mine(ModelCheckpoint):
        pass

    mine = Mine()
    trainer = Trainer(project_dir=tmp_path, log_with=None, callbacks=[mine])
    assert [cb for cb in trainer.callbacks if isinstance(cb, ModelCheckpoint)] == [mine]
    assert trainer.checkpoint_callback is mine


def test_a_trainer_that_starts_its_processes_at_fit_has_no_accelerator_before(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer.fit import args

    monkeypatch.setattr(args, "can_rerun_current_script", lambda: True)  # as from `python script.py` (not a notebook)
    trainer = Trainer(project_dir=tmp_path, log_with=None, strategy="ddp", devices=2, accelerator="cpu")
    assert trainer.world_size == 1 and trainer.is_global_zero
    with pytest.raises(RuntimeError, match=r"start at trainer\.fit\(\)"):
        trainer.accelerator  # noqa: B018


class _Fitting:
    stage, sanity_checking, world_size, is_global_zero, global_rank = "fit", False, 1, True, 0

    def __init__(self) -> None:
        self.saved: list[str] = []

    def save_checkpoint(self, dirpath: Any) -> Path:
        self.saved.append(str(dirpath))
        return Path(dirpath)


def test_on_exception_checkpoint_leaves_a_preemption_alone(tmp_path: Path) -> None:
    from trainer.fit import preemption

    callback, trainer = OnExceptionCheckpoint(tmp_path), _Fitting()
    callback.on_exception(trainer, None, preemption.Preempted(15, tmp_path / "preempted"))  # type: ignore[arg-type]
    assert trainer.saved == [] and callback.saved_path is None
    callback.on_exception(trainer, None, KeyboardInterrupt())  # type: ignore[arg-type]
    assert trainer.saved == [str(tmp_path / "on_exception")]
