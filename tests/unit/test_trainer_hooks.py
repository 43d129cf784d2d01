"""The full hook order of a `Trainer.fit` with validation, and hook dispatch rules."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from callbacks.base import Callback
from callbacks.checkpoint import ModelCheckpoint
from callbacks.events import ALL_EVENTS
from trainer.fit.dispatch import HookDispatcher, order_callbacks
from trainer.fit.module import TrainModule
from trainer.fit.trainer import Trainer

MODULE_HOOKS = [e for e in ALL_EVENTS if e not in ("on_log_metrics", "on_exception")]


def _recording_module_hook(name: str) -> Any:
    def hook(self: Any, *args: Any) -> None:
        self.calls.append(f"module.{name}")

    return hook


def _recording_callback_hook(name: str) -> Any:
    def hook(self: Any, trainer: Any, module: Any, *args: Any) -> None:
        self.calls.append(f"{self.tag}.{name}")

    return hook


class RecordingSGD(torch.optim.SGD):
    def __init__(self, params: Any, calls: list[str]) -> None:
        super().__init__(params, lr=0.1)
        self.calls = calls

    def step(self, closure: Any = None) -> Any:
        out = super().step(closure)  # recorded once the parameters were updated (a closure runs inside)
        self.calls.append("optimizer.step")
        return out

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.calls.append("optimizer.zero_grad")
        super().zero_grad(set_to_none)


class RecordingModule(TrainModule):
    def __init__(self, calls: list[str]) -> None:
        super().__init__()
        self.calls = calls
        self.layer = torch.nn.Linear(2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.calls.append("module.training_step")
        loss = self.layer(batch[0]).pow(2).mean()
        self.log("loss", loss, on_epoch=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.calls.append("module.validation_step")
        self.log("val", self.layer(batch[0]).mean())

    def configure_optimizers(self) -> Any:
        self.calls.append("module.configure_optimizers")
        return RecordingSGD(self.parameters(), self.calls)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.calls.append("module.zero_grad")
        super().zero_grad(set_to_none)


class RecordingCallback(Callback):
    def __init__(self, calls: list[str], tag: str = "cb") -> None:
        self.calls, self.tag = calls, tag


class LastCallback(RecordingCallback):
    _runs_last = True


class MonitoringCallback(RecordingCallback):
    """Stands for ModelCheckpoint / EarlyStopping: a callback that decides on a logged metric."""

    _monitors_metrics = True


for _event in MODULE_HOOKS:
    setattr(RecordingModule, _event, _recording_module_hook(_event))
for _event in ALL_EVENTS:
    setattr(RecordingCallback, _event, _recording_callback_hook(_event))


def _both(*events: str) -> list[str]:
    """Lightning's order for one event: the callback's hook, then the module's (steps: the module only)."""
    out = []
    for e in events:
        out += [f"module.{e}"] if e.endswith("_step") or e == "configure_optimizers" else [f"cb.{e}", f"module.{e}"]
    return out


# Lightning 2.x's order (tests/tests_pytorch/models/test_hooks.py, test_trainer_model_hook_system_fit): callbacks
# before the module, except at the training epoch's end, where the metric-monitoring callbacks (ModelCheckpoint,
# EarlyStopping; here "mon", first in the list) run after the module; optimizer.zero_grad after training_step,
# before backward.
# Our module also has on_sanity_check_start/end (Lightning's has them on callbacks only).
EXPECTED_FIT = [
    "mon.setup", "cb.setup", "module.setup",
    "module.configure_optimizers",
    "mon.on_fit_start", "cb.on_fit_start", "module.on_fit_start",
    "module.zero_grad",
    "mon.on_sanity_check_start", "cb.on_sanity_check_start", "module.on_sanity_check_start",
    "mon.on_validation_start", "cb.on_validation_start", "module.on_validation_start",
    "mon.on_validation_epoch_start", "cb.on_validation_epoch_start", "module.on_validation_epoch_start",
    "mon.on_validation_batch_start", "cb.on_validation_batch_start", "module.on_validation_batch_start",
    "module.validation_step",
    "mon.on_validation_batch_end", "cb.on_validation_batch_end", "module.on_validation_batch_end",
    "mon.on_validation_batch_start", "cb.on_validation_batch_start", "module.on_validation_batch_start",
    "module.validation_step",
    "mon.on_validation_batch_end", "cb.on_validation_batch_end", "module.on_validation_batch_end",
    "mon.on_validation_epoch_end", "cb.on_validation_epoch_end", "module.on_validation_epoch_end",
    "mon.on_validation_end", "cb.on_validation_end", "module.on_validation_end",
    "mon.on_sanity_check_end", "cb.on_sanity_check_end", "module.on_sanity_check_end",
    "mon.on_train_start", "cb.on_train_start", "module.on_train_start",
    # epoch 0
    "mon.on_train_epoch_start", "cb.on_train_epoch_start", "module.on_train_epoch_start",
    "mon.on_train_batch_start", "cb.on_train_batch_start", "module.on_train_batch_start",
    "module.training_step",
    "mon.on_before_zero_grad", "cb.on_before_zero_grad", "module.on_before_zero_grad", "optimizer.zero_grad",
    "mon.on_before_backward", "cb.on_before_backward", "module.on_before_backward",
    "mon.on_after_backward", "cb.on_after_backward", "module.on_after_backward",
    "mon.on_before_optimizer_step", "cb.on_before_optimizer_step", "module.on_before_optimizer_step",
    "optimizer.step",
    "mon.on_train_batch_end", "cb.on_train_batch_end", "module.on_train_batch_end",
    "mon.on_train_batch_start", "cb.on_train_batch_start", "module.on_train_batch_start",
    "module.training_step",
    "mon.on_before_zero_grad", "cb.on_before_zero_grad", "module.on_before_zero_grad", "optimizer.zero_grad",
    "mon.on_before_backward", "cb.on_before_backward", "module.on_before_backward",
    "mon.on_after_backward", "cb.on_after_backward", "module.on_after_backward",
    "mon.on_before_optimizer_step", "cb.on_before_optimizer_step", "module.on_before_optimizer_step",
    "optimizer.step",
    "mon.on_train_batch_end", "cb.on_train_batch_end", "module.on_train_batch_end",
    "mon.on_validation_start", "cb.on_validation_start", "module.on_validation_start",
    "mon.on_validation_epoch_start", "cb.on_validation_epoch_start", "module.on_validation_epoch_start",
    "mon.on_validation_batch_start", "cb.on_validation_batch_start", "module.on_validation_batch_start",
    "module.validation_step",
    "mon.on_validation_batch_end", "cb.on_validation_batch_end", "module.on_validation_batch_end",
    "mon.on_validation_batch_start", "cb.on_validation_batch_start", "module.on_validation_batch_start",
    "module.validation_step",
    "mon.on_validation_batch_end", "cb.on_validation_batch_end", "module.on_validation_batch_end",
    "mon.on_validation_epoch_end", "cb.on_validation_epoch_end", "module.on_validation_epoch_end",
    "mon.on_log_metrics", "cb.on_log_metrics",
    "mon.on_validation_end", "cb.on_validation_end", "module.on_validation_end",
    "cb.on_train_epoch_end", "module.on_train_epoch_end", "mon.on_train_epoch_end",
    "mon.on_log_metrics", "cb.on_log_metrics",
    # epoch 1
    "mon.on_train_epoch_start", "cb.on_train_epoch_start", "module.on_train_epoch_start",
    "mon.on_train_batch_start", "cb.on_train_batch_start", "module.on_train_batch_start",
    "module.training_step",
    "mon.on_before_zero_grad", "cb.on_before_zero_grad", "module.on_before_zero_grad", "optimizer.zero_grad",
    "mon.on_before_backward", "cb.on_before_backward", "module.on_before_backward",
    "mon.on_after_backward", "cb.on_after_backward", "module.on_after_backward",
    "mon.on_before_optimizer_step", "cb.on_before_optimizer_step", "module.on_before_optimizer_step",
    "optimizer.step",
    "mon.on_train_batch_end", "cb.on_train_batch_end", "module.on_train_batch_end",
    "mon.on_train_batch_start", "cb.on_train_batch_start", "module.on_train_batch_start",
    "module.training_step",
    "mon.on_before_zero_grad", "cb.on_before_zero_grad", "module.on_before_zero_grad", "optimizer.zero_grad",
    "mon.on_before_backward", "cb.on_before_backward", "module.on_before_backward",
    "mon.on_after_backward", "cb.on_after_backward", "module.on_after_backward",
    "mon.on_before_optimizer_step", "cb.on_before_optimizer_step", "module.on_before_optimizer_step",
    "optimizer.step",
    "mon.on_train_batch_end", "cb.on_train_batch_end", "module.on_train_batch_end",
    "mon.on_validation_start", "cb.on_validation_start", "module.on_validation_start",
    "mon.on_validation_epoch_start", "cb.on_validation_epoch_start", "module.on_validation_epoch_start",
    "mon.on_validation_batch_start", "cb.on_validation_batch_start", "module.on_validation_batch_start",
    "module.validation_step",
    "mon.on_validation_batch_end", "cb.on_validation_batch_end", "module.on_validation_batch_end",
    "mon.on_validation_batch_start", "cb.on_validation_batch_start", "module.on_validation_batch_start",
    "module.validation_step",
    "mon.on_validation_batch_end", "cb.on_validation_batch_end", "module.on_validation_batch_end",
    "mon.on_validation_epoch_end", "cb.on_validation_epoch_end", "module.on_validation_epoch_end",
    "mon.on_log_metrics", "cb.on_log_metrics",
    "mon.on_validation_end", "cb.on_validation_end", "module.on_validation_end",
    "cb.on_train_epoch_end", "module.on_train_epoch_end", "mon.on_train_epoch_end",
    "mon.on_log_metrics", "cb.on_log_metrics",
    "mon.on_train_end", "cb.on_train_end", "module.on_train_end",
    "mon.on_fit_end", "cb.on_fit_end", "module.on_fit_end",
    "mon.teardown", "cb.teardown", "module.teardown",
]


def _loader(n: int = 4, batch_size: int = 2) -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(n, 2)), batch_size=batch_size)


def _trainer(tmp_path: Any, **kwargs: Any) -> Trainer:
    defaults: dict[str, Any] = dict(log_with=None, project_dir=tmp_path, enable_progress_bar=False,
                                    enable_model_summary=False, enable_checkpointing=False)
    return Trainer(**{**defaults, **kwargs})


def test_fit_hook_order_matches_the_literal_list(tmp_path: Any) -> None:
    calls: list[str] = []
    trainer = _trainer(tmp_path, max_epochs=2, callbacks=[MonitoringCallback(calls, "mon"), RecordingCallback(calls)])
    assert [type(cb) for cb in trainer.callbacks] == [MonitoringCallback, RecordingCallback]
    trainer.fit(RecordingModule(calls), _loader(), _loader())
    assert calls == EXPECTED_FIT
    assert trainer.global_step == 4 and trainer.current_epoch == 2


def test_test_and_predict_hook_order(tmp_path: Any) -> None:
    calls: list[str] = []
    module = RecordingModule(calls)
    module.test_step = lambda batch, idx: calls.append("module.test_step")  # type: ignore[method-assign]
    trainer = _trainer(tmp_path, callbacks=[RecordingCallback(calls)])
    trainer.test(module, _loader(2))
    assert calls == [*_both("setup", "on_test_start", "on_test_epoch_start", "on_test_batch_start"), "module.test_step", *_both("on_test_batch_end", "on_test_epoch_end", "on_test_end", "teardown")]
    calls.clear()
    trainer.predict(module, _loader(2))
    assert calls == _both("setup", "on_predict_start", "on_predict_epoch_start", "on_predict_batch_start",
                          "on_predict_batch_end", "on_predict_epoch_end", "on_predict_end", "teardown")


def test_runs_last_callbacks_come_after_the_others(tmp_path: Any) -> None:
    calls: list[str] = []
    last, first = LastCallback(calls, "last"), RecordingCallback(calls, "first")
    trainer = _trainer(tmp_path, max_epochs=1, callbacks=[last, first], num_sanity_val_steps=0)
    assert trainer.callbacks == [first, last]
    trainer.fit(RecordingModule(calls), _loader(2, 2))
    end = [c for c in calls if c.endswith("on_train_epoch_end")]
    assert end == ["first.on_train_epoch_end", "last.on_train_epoch_end", "module.on_train_epoch_end"]


class OnlyEpochEnd(Callback):
    def __init__(self) -> None:
        self.seen = 0

    def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
        self.seen += 1


def test_dispatch_skips_objects_that_do_not_override() -> None:
    module = TrainModule()
    cb = OnlyEpochEnd()
    dispatch = HookDispatcher(module, TrainModule, order_callbacks([cb]), owner=None)
    assert not dispatch.has("on_train_batch_start")
    assert dispatch.has("on_train_epoch_end")
    dispatch.call("on_train_epoch_end")
    assert cb.seen == 1


class CountsBatches(ModelCheckpoint):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.batches = 0

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.batches += 1
        super().on_train_batch_end(trainer, module, outputs, batch, batch_idx)


def test_an_idle_per_batch_hook_is_left_out_of_the_epoch_but_not_a_subclass_own(tmp_path: Any) -> None:
    by_epoch, by_steps = ModelCheckpoint(dirpath=tmp_path / "a"), ModelCheckpoint(dirpath=tmp_path / "b", every_n_train_steps=2)
    assert HookDispatcher(None, TrainModule, [by_epoch], owner=None).caller("on_train_batch_end") is None
    assert HookDispatcher(None, TrainModule, [by_steps], owner=None).caller("on_train_batch_end") is not None
    counting = CountsBatches(dirpath=tmp_path / "c")  # saves by epoch, but overrides the hook: it runs every batch
    trainer = _trainer(tmp_path, callbacks=[counting], max_epochs=2)
    trainer.fit(RecordingModule([]), _loader())
    assert counting.batches == 2 * trainer.num_training_batches


class Broken(Callback):
    def on_train_start(self, trainer: Any, module: Any) -> None:
        raise KeyError("boom")


class SawException(Callback):
    def __init__(self) -> None:
        self.exceptions: list[BaseException] = []
        self.torn_down = False

    def on_exception(self, trainer: Any, module: Any, exception: BaseException) -> None:
        self.exceptions.append(exception)

    def teardown(self, trainer: Any, module: Any, stage: str) -> None:
        self.torn_down = True


def test_callback_exception_gets_a_note_and_on_exception_fires(tmp_path: Any) -> None:
    watcher = SawException()
    trainer = _trainer(tmp_path, max_epochs=1, callbacks=[Broken(), watcher])
    with pytest.raises(KeyError) as info:
        trainer.fit(RecordingModule([]), _loader())
    assert "raised in callback Broken.on_train_start" in getattr(info.value, "__notes__", [])
    assert watcher.exceptions == [info.value]
    assert watcher.torn_down


class BrokenAtBatchEnd(Callback):
    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        raise KeyError("batch end")


class BrokenAfterBackward(RecordingModule):
    def on_after_backward(self) -> None:
        raise KeyError("after backward")


def test_per_batch_hook_exceptions_get_the_same_notes(tmp_path: Any) -> None:
    """The per-batch events are fired through functions built once per epoch: their errors are named as `call` names them."""
    with pytest.raises(KeyError) as info:
        _trainer(tmp_path, max_epochs=1, callbacks=[BrokenAtBatchEnd()]).fit(RecordingModule([]), _loader())
    assert "raised in callback BrokenAtBatchEnd.on_train_batch_end" in getattr(info.value, "__notes__", [])
    with pytest.raises(KeyError) as info:
        _trainer(tmp_path, max_epochs=1).fit(BrokenAfterBackward([]), _loader())
    assert "raised in the module's hook BrokenAfterBackward.on_after_backward" in getattr(info.value, "__notes__", [])


class LogsAtEpochEnd(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self.layer(batch[0]).pow(2).mean()
        self.log("loss", loss, on_step=False, on_epoch=True)
        return loss

    def on_train_epoch_end(self) -> None:
        self.log("from_epoch_end", 7.0)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Sees(Callback):
    def __init__(self) -> None:
        self.seen: list[list[str]] = []

    def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
        self.seen.append(sorted(trainer.callback_metrics))


class SeesAfterTheModule(Sees):
    _monitors_metrics = True


def test_epoch_end_callbacks_see_the_epoch_values_and_monitors_see_what_the_module_logged(tmp_path: Any) -> None:
    before, after = Sees(), SeesAfterTheModule()
    trainer = _trainer(tmp_path, max_epochs=1, callbacks=[after, before])
    trainer.fit(LogsAtEpochEnd(), _loader())
    assert before.seen == [["loss"]]  # the epoch value of what training_step logged, as in Lightning
    assert after.seen == [["from_epoch_end", "loss"]]  # and, after the module's hook, what it logged there
    assert trainer.logged_metrics == {"loss": pytest.approx(float(trainer.callback_metrics["loss"])), "from_epoch_end": 7.0}


class LogsTwice(LogsAtEpochEnd):
    def on_train_epoch_end(self) -> None:
        self.log("loss", 1.0)


def test_one_name_from_a_step_and_an_epoch_end_hook_is_refused(tmp_path: Any) -> None:
    with pytest.raises(ValueError, match=r"'loss'.*epoch-end hook.*another name"):
        _trainer(tmp_path, max_epochs=1).fit(LogsTwice(), _loader())


def test_checkpoint_hooks_run_in_lightnings_order(tmp_path: Any) -> None:
    calls: list[str] = []
    module = RecordingModule(calls)
    trainer = _trainer(tmp_path, max_epochs=1, num_sanity_val_steps=0, callbacks=[RecordingCallback(calls)])
    trainer.fit(module, _loader(2))
    calls.clear()
    trainer.save_checkpoint(tmp_path / "ckpt")
    assert calls == ["cb.on_save_checkpoint", "module.on_save_checkpoint"]  # saving: callbacks first
    calls.clear()
    trainer = _trainer(tmp_path, max_epochs=2, num_sanity_val_steps=0, callbacks=[RecordingCallback(calls)])
    trainer.fit(module, _loader(2), ckpt_path=str(tmp_path / "ckpt"))
    loading = [c for c in calls if "load_checkpoint" in c]
    assert loading == ["module.on_load_checkpoint", "cb.on_load_checkpoint"]  # loading: the module first


class ManualRecording(RecordingModule):
    def __init__(self, calls: list[str]) -> None:
        super().__init__(calls)
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> None:
        self.calls.append("module.training_step")
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(self.layer(batch[0]).pow(2).mean())
        opt.step(lambda: self.calls.append("closure"))


def test_manual_optimization_batch_order_is_lightnings(tmp_path: Any) -> None:
    calls: list[str] = []
    trainer = _trainer(tmp_path, max_epochs=1, num_sanity_val_steps=0, limit_train_batches=1,
                       callbacks=[RecordingCallback(calls)])
    trainer.fit(ManualRecording(calls), _loader())
    start = calls.index("cb.on_train_batch_start")
    # Lightning's (test_hooks.py, _manual_train_batch): the closure runs before on_before_optimizer_step, and the
    # loop itself zeroes nothing (the step's opt.zero_grad() does)
    assert calls[start:calls.index("module.on_train_batch_end") + 1] == [
        "cb.on_train_batch_start", "module.on_train_batch_start",
        "module.training_step", "optimizer.zero_grad",
        "cb.on_before_backward", "module.on_before_backward", "cb.on_after_backward", "module.on_after_backward",
        "closure", "cb.on_before_optimizer_step", "module.on_before_optimizer_step", "optimizer.step",
        "cb.on_train_batch_end", "module.on_train_batch_end",
    ]


def test_an_unknown_event_name_is_an_error_not_a_silent_no_op() -> None:
    # before, dispatch.call("on_trian_start") fired nothing and said nothing
    dispatch = HookDispatcher(None, TrainModule, [Callback()], owner=None)
    for fire in (dispatch.call, dispatch.call_callbacks, dispatch.call_module, dispatch.caller, dispatch.has):
        with pytest.raises(ValueError, match="no event is called 'on_trian_start'; did you mean 'on_train_start'"):
            fire("on_trian_start")
    dispatch.call("on_train_start")  # a known event without hooks: nothing to do, no error


def test_every_event_the_code_fires_by_name_is_declared() -> None:
    """The literal names passed to the dispatcher anywhere in trainer/ and callbacks/ (read from the source)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    methods = {"call", "caller", "call_callbacks", "call_module", "has"}
    fired = set()
    for path in [*(root / "trainer").rglob("*.py"), *(root / "callbacks").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in methods
                    and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)
                    and "dispatch" in ast.unparse(node.func.value)):
                fired.add((node.args[0].value, f"{path.relative_to(root)}:{node.lineno}"))
    assert len(fired) >= 15  # the scan finds the literal calls (names built at run time are checked when fired)
    unknown = sorted(where for name, where in fired if name not in ALL_EVENTS)
    assert not unknown, unknown
