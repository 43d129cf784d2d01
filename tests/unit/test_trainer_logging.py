"""``self.log`` semantics: step/epoch names, weighted means, reduce_fx, torchmetrics, and what reaches trackers."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from callbacks.base import Callback
from trainer.fit.module import TrainModule
from trainer.fit.results import ResultsStore, infer_batch_size
from trainer.fit.trainer import Trainer


def _store() -> ResultsStore:
    return ResultsStore(device=torch.device("cpu"), reduce=lambda t, op: t, gather_object=lambda o: [o])


# ------------------------------------------------------------------------------------- the store alone
def test_epoch_mean_is_weighted_by_batch_size() -> None:
    store = _store()
    store.set_context("validation", False)
    store.log("acc", torch.tensor(1.0), batch_size=3)
    store.log("acc", 5.0, batch_size=1)
    values, logged = store.reduce_epoch("validation")
    assert values == logged == {"acc": pytest.approx(2.0)}  # (3 * 1 + 1 * 5) / 4


def test_batch_size_is_inferred_from_the_batch() -> None:
    store = _store()
    store.set_context("validation", False)
    for rows, value in ((4, 1.0), (2, 4.0)):
        store.set_batch((torch.zeros(rows, 3), torch.zeros(rows)))
        store.log("x", value)
    assert store.reduce_epoch("validation")[0]["x"] == pytest.approx(2.0)
    assert infer_batch_size({"a": [torch.zeros(7, 2)]}) == 7


@pytest.mark.parametrize(("fx", "expected"), [("sum", 9.0), ("max", 5.0), ("min", 1.0), (torch.max, 5.0), ("mean", 3.0)])
def test_reduce_fx(fx: Any, expected: float) -> None:
    store = _store()
    store.set_context("test", False)
    for v in (1.0, 3.0, 5.0):
        store.log("v", torch.tensor(v), reduce_fx=fx, batch_size=1)
    assert store.reduce_epoch("test")[0] == {"v": pytest.approx(expected)}


def test_training_defaults_are_per_step_and_both_give_suffixed_names() -> None:
    store = _store()
    store.set_context("train", True)
    store.log("loss", torch.tensor(2.0), batch_size=1)
    store.log("both", torch.tensor(4.0), on_epoch=True, batch_size=1, prog_bar=True)
    store.log("both", torch.tensor(6.0), on_epoch=True, batch_size=1, prog_bar=True)
    assert set(store.callback_metrics) == {"loss", "both", "both_step"}
    assert isinstance(store.callback_metrics["loss"], torch.Tensor)  # kept on device: no host sync per step
    assert store.flush_step() == {"loss": 2.0, "both_step": 6.0}
    assert store.flush_step() == {"loss": 2.0, "both_step": 6.0}  # nothing new since: a later row of the epoch has them again
    values, _ = store.reduce_epoch("train")
    assert values == {"both_epoch": 5.0}
    assert store.flush_step() == {}  # a new epoch: not until logged again
    assert store.callback_metrics["both"] == 5.0 and store.progress_bar_metrics["both_epoch"] == 5.0


def test_logger_false_is_kept_out_of_the_loggers() -> None:
    store = _store()
    store.set_context("validation", False)
    store.log("hidden", 1.0, logger=False)
    store.log("shown", 2.0)
    values, logged = store.reduce_epoch("validation")
    assert values == {"hidden": 1.0, "shown": 2.0} and logged == {"shown": 2.0}
    assert store.logged_metrics == {"shown": 2.0}


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"value": torch.ones(3)}, ValueError, "tensor of shape \\(3,\\)"),
        ({"value": "high"}, TypeError, "value of type str"),
        ({"value": {"acc": 0.5}}, TypeError, r"got a dict; .*self\.log_dict\(\{'name/<key>'"),
        ({"value": 1.0, "reduce_fx": "median"}, ValueError, "reduce_fx='median'"),
        ({"value": 1.0, "on_step": False, "on_epoch": False}, ValueError, "logs nothing"),
        ({"value": 1.0, "batch_size": 0}, ValueError, "batch_size=0"),
    ],
)
def test_bad_log_calls_are_explained(kwargs: dict[str, Any], error: type, match: str) -> None:
    store = _store()
    store.set_context("validation", False)
    with pytest.raises(error, match=match):
        store.log("name", **kwargs)


def test_changing_settings_of_a_name_is_refused() -> None:
    store = _store()
    store.set_context("validation", False)
    store.log("a", 1.0)
    with pytest.raises(ValueError, match="same settings"):
        store.log("a", 1.0, reduce_fx="sum")


# ------------------------------------------------------------------------------------- in a Trainer
class Recorder(Callback):
    def __init__(self) -> None:
        self.records: list[tuple[int, dict[str, float]]] = []

    def on_log_metrics(self, trainer: Any, module: Any, metrics: dict[str, float], step: int) -> None:
        self.records.append((step, dict(metrics)))


class Logs(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        import torchmetrics

        self.total = torchmetrics.SumMetric()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (x,) = batch
        loss = self.layer(x).pow(2).mean()
        self.log("loss", loss, on_step=True, on_epoch=True)
        self.log("seen", float(len(x)), reduce_fx="sum", on_step=False, on_epoch=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        (x,) = batch
        self.log("x_mean", x.mean())
        self.total.update(x.sum())
        self.log("x_sum", self.total)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _data(n: int, batch_size: int) -> DataLoader:
    return DataLoader(TensorDataset(torch.arange(n, dtype=torch.float32)[:, None]), batch_size=batch_size)


def _trainer(tmp_path: Any, **kwargs: Any) -> Trainer:
    return Trainer(log_with=None, project_dir=tmp_path, enable_progress_bar=False, enable_model_summary=False,
                   enable_checkpointing=False, **kwargs)


def test_epoch_values_and_what_the_trackers_receive(tmp_path: Any) -> None:
    recorder = Recorder()
    trainer = _trainer(tmp_path, max_epochs=2, log_every_n_steps=2, num_sanity_val_steps=0, callbacks=[recorder])
    module = Logs()
    trainer.fit(module, _data(4, 1), _data(5, 2))  # validation batches of 2, 2, 1
    metrics = trainer.callback_metrics
    assert metrics["x_mean"] == pytest.approx(2.0)  # weighted: the mean of 0..4, not of the batch means (2.0 vs 1.83)
    assert metrics["x_sum"] == pytest.approx(10.0)  # torchmetrics: computed and reset every epoch
    assert metrics["seen"] == 4.0
    assert {"loss", "loss_step", "loss_epoch"} <= set(metrics)
    steps = [(step, sorted(values)) for step, values in recorder.records]
    # Lightning's steps: a batch's values at the step before its optimizer step (batch 1 -> step 1), validation and
    # the epoch values at the epoch's last step
    assert steps == [
        (1, ["epoch", "loss_step"]), (3, ["epoch", "loss_step"]),
        (3, ["epoch", "x_mean", "x_sum"]), (3, ["epoch", "loss_epoch", "seen"]),
        (5, ["epoch", "loss_step"]), (7, ["epoch", "loss_step"]),
        (7, ["epoch", "x_mean", "x_sum"]), (7, ["epoch", "loss_epoch", "seen"]),
    ]
    assert [values["epoch"] for _, values in recorder.records] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert trainer.logged_metrics["x_sum"] == pytest.approx(10.0)


def test_validate_and_test_return_epoch_metrics(tmp_path: Any) -> None:
    trainer = _trainer(tmp_path)
    module = Logs()
    module.test_step = module.validation_step  # type: ignore[method-assign]
    assert trainer.validate(module, _data(3, 2)) == [{"x_mean": pytest.approx(1.0), "x_sum": pytest.approx(3.0)}]
    assert trainer.test(module, _data(5, 4)) == [{"x_mean": pytest.approx(2.0), "x_sum": pytest.approx(10.0)}]


def test_sanity_check_leaves_no_metrics_behind(tmp_path: Any) -> None:
    recorder = Recorder()
    calls: list[int] = []

    class Watched(Logs):
        def on_validation_start(self) -> None:
            calls.append(self.global_step)

    module = Watched()
    trainer = _trainer(tmp_path, max_epochs=1, num_sanity_val_steps=1, check_val_every_n_epoch=2, callbacks=[recorder])
    trainer.fit(module, _data(2, 1), _data(5, 2))
    assert calls == [0]  # the sanity check ran, no validation epoch did
    assert "x_mean" not in trainer.callback_metrics and "x_mean" not in trainer.logged_metrics
    assert all("x_mean" not in values for _, values in recorder.records)


class LogsInPredict(Logs):
    def predict_step(self, batch: Any, batch_idx: int) -> Any:
        self.log("nope", 1.0)


def test_logging_in_predict_is_refused(tmp_path: Any) -> None:
    with pytest.raises(RuntimeError, match="not supported during predict"):
        _trainer(tmp_path).predict(LogsInPredict(), _data(2, 1))


def test_log_outside_a_trainer_says_how_to_attach() -> None:
    with pytest.raises(RuntimeError, match="not attached to a Trainer"):
        Logs().log("x", 1.0)


def test_open_epoch_accumulators_round_trip_through_json() -> None:
    import json

    store = _store()
    store.set_context("train", True)
    store.log("loss", torch.tensor(1.0), on_epoch=True, batch_size=2)
    store.log("peak", 3.0, on_step=False, on_epoch=True, reduce_fx="max")
    restored = _store()
    restored.load_state_dict(json.loads(json.dumps(store.state_dict())))
    restored.set_context("train", True)
    restored.log("loss", torch.tensor(4.0), on_epoch=True, batch_size=1)
    restored.log("peak", 2.0, on_step=False, on_epoch=True, reduce_fx="max")
    assert restored.reduce_epoch("train")[0] == {"loss_epoch": pytest.approx(2.0), "peak": 3.0}  # (2*1 + 1*4) / 3


def test_logging_does_not_read_tensors_back_until_a_write(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[str] = []
    for method in ("item", "tolist", "__float__", "cpu"):
        original = getattr(torch.Tensor, method)

        def counting(self: torch.Tensor, *args: Any, _name: str = method, _original: Any = original, **kwargs: Any) -> Any:
            reads.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, method, counting)
    store = _store()
    store.set_context("train", True)
    for step in range(100):
        store.set_batch((torch.zeros(4, 2),))
        store.log("loss", torch.tensor(float(step)), on_epoch=True)
        store.log("acc", torch.tensor(0.5), on_step=False, on_epoch=True, reduce_fx="max")
    assert reads == []  # 200 logged tensors, no host read-back
    assert store.flush_step() == {"loss_step": 99.0}
    assert reads == ["item"]  # one value, one read
    assert store.reduce_epoch("train")[0] == {"loss_epoch": pytest.approx(49.5), "acc": 0.5}
    assert reads == ["item", "tolist"]  # one transfer for every name


class LogsFromACallback(Callback):
    def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
        trainer.log_metrics({"custom": torch.tensor(1.5), "count": 3})


def test_log_metrics_reaches_metrics_and_trackers(tmp_path: Any) -> None:
    recorder = Recorder()
    trainer = _trainer(tmp_path, max_epochs=1, num_sanity_val_steps=0, callbacks=[LogsFromACallback(), recorder])
    trainer.fit(Logs(), _data(4, 2))
    assert trainer.callback_metrics["custom"] == 1.5 and trainer.logged_metrics["count"] == 3.0
    assert (2, {"custom": 1.5, "count": 3.0, "epoch": 0}) in recorder.records
    with pytest.raises(TypeError, match="not a number"):
        trainer.log_metrics({"bad": "text"})
    with pytest.raises(TypeError, match="needs a dict"):
        trainer.log_metrics([("lr", 0.1)])  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------- the step trackers receive
class LogsEverything(TrainModule):
    """Logs a per-step loss, a validation mean and a learning rate, to check the steps trackers receive."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = self.layer(batch[0]).pow(2).mean()
        self.log("loss", loss, on_step=True, on_epoch=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val", batch[0].mean())

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_tracker_steps_are_lightnings_with_accumulation_and_mid_epoch_validation(tmp_path: Any) -> None:
    recorder = Recorder()
    trainer = _trainer(tmp_path, max_epochs=1, log_every_n_steps=1, accumulate_grad_batches=2, val_check_interval=2,
                       num_sanity_val_steps=0, callbacks=[recorder])
    trainer.fit(LogsEverything(), _data(4, 1), _data(2, 1))
    # Lightning: batch 1 ends the first window and logs at step 0 (the step before its optimizer step); the validation
    # it triggers logs at the same step; the epoch values go to the epoch's last step.
    assert [(step, sorted(values)) for step, values in recorder.records] == [
        (0, ["epoch", "loss_step"]), (0, ["epoch", "val"]),
        (1, ["epoch", "loss_step"]), (1, ["epoch", "val"]),
        (1, ["epoch", "loss_epoch"]),
    ]
    assert trainer.global_step == 2 and trainer.logging_step == 2


class TwoOptimizers(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.a, self.b = torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)

    def training_step(self, batch: Any, batch_idx: int) -> None:
        for opt, layer in zip(self.optimizers(), (self.a, self.b)):
            loss = layer(batch[0]).pow(2).mean()
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()
            self.log("loss", loss)

    def configure_optimizers(self) -> Any:
        return [torch.optim.SGD(self.a.parameters(), lr=0.01), torch.optim.SGD(self.b.parameters(), lr=0.01)]


def test_manual_optimization_tracker_steps_count_batches(tmp_path: Any) -> None:
    recorder = Recorder()
    trainer = _trainer(tmp_path, max_epochs=1, log_every_n_steps=1, callbacks=[recorder])
    trainer.fit(TwoOptimizers(), _data(3, 1))
    assert trainer.global_step == 6  # two optimizer steps per batch, as Lightning counts them
    assert [step for step, _ in recorder.records] == [0, 1, 2]  # but trackers see one step per batch, from 0


class GAN(TrainModule):
    """Two optimizers stepped by hand: the discriminator's every batch, the generator's (and its loss) every other one."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.g, self.d = torch.nn.Linear(1, 1), torch.nn.Linear(1, 1)

    def training_step(self, batch: Any, batch_idx: int) -> None:
        g_opt, d_opt = self.optimizers()
        d_loss = self.d(batch[0]).mean() - self.d(self.g(batch[0]).detach()).mean()
        d_opt.zero_grad()
        self.manual_backward(d_loss)
        d_opt.step()
        self.log("d_loss", d_loss)
        if batch_idx % 2 == 1:
            g_loss = -self.d(self.g(batch[0])).mean()
            g_opt.zero_grad()
            self.manual_backward(g_loss)
            g_opt.step()
            self.log("g_loss", g_loss)

    def configure_optimizers(self) -> Any:
        return [torch.optim.SGD(self.g.parameters(), lr=0.01), torch.optim.SGD(self.d.parameters(), lr=0.01)]


def test_a_step_value_logged_earlier_in_the_epoch_goes_with_every_later_row_as_in_lightning(tmp_path: Any) -> None:
    """Lightning 2.6.6's metrics.csv of this GAN (CSVLogger, log_every_n_steps=1, 2 epochs of 4 batches): g_loss, logged
    at odd batches, is in every row after its first in the epoch, with the value last logged; not in an epoch's first row."""
    import csv

    from callbacks.trackers import CSVLogger

    trainer = Trainer(logger=CSVLogger(str(tmp_path), name="gan", version=0), project_dir=tmp_path, max_epochs=2,
                      log_every_n_steps=1, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    trainer.fit(GAN(), _data(4, 1))
    with open(tmp_path / "gan" / "version_0" / "metrics.csv") as f:
        rows = [{k: v for k, v in row.items() if v} for row in csv.DictReader(f)]
    assert trainer.global_step == 12  # 3 optimizer steps per 2 batches
    assert [(row["step"], row["epoch"], sorted(row)) for row in rows] == [
        ("0", "0", ["d_loss", "epoch", "step"]), ("1", "0", ["d_loss", "epoch", "g_loss", "step"]),
        ("2", "0", ["d_loss", "epoch", "g_loss", "step"]), ("3", "0", ["d_loss", "epoch", "g_loss", "step"]),
        ("4", "1", ["d_loss", "epoch", "step"]), ("5", "1", ["d_loss", "epoch", "g_loss", "step"]),
        ("6", "1", ["d_loss", "epoch", "g_loss", "step"]), ("7", "1", ["d_loss", "epoch", "g_loss", "step"]),
    ]
    assert rows[2]["g_loss"] == rows[1]["g_loss"] != rows[3]["g_loss"]  # batch 2 logged none: batch 1's value again


def test_logged_metrics_keep_the_step_values_after_the_epoch(tmp_path: Any) -> None:
    trainer = _trainer(tmp_path, max_epochs=1, log_every_n_steps=50, num_sanity_val_steps=0)
    trainer.fit(LogsEverything(), _data(3, 1), _data(2, 1))
    assert set(trainer.logged_metrics) == {"loss_step", "loss_epoch", "val"}  # loss_step although never written (50 > 3)
    assert float(trainer.logged_metrics["loss_step"]) == pytest.approx(float(trainer.callback_metrics["loss_step"]))


def test_lr_monitor_logs_at_the_tracker_step_without_an_epoch(tmp_path: Any) -> None:
    from callbacks.lr_monitor import LearningRateMonitor

    recorder = Recorder()
    trainer = _trainer(tmp_path, max_epochs=1, log_every_n_steps=2, num_sanity_val_steps=0,
                       callbacks=[LearningRateMonitor(logging_interval="step"), recorder])
    trainer.fit(LogsEverything(), _data(4, 1))
    rows = [(step, sorted(values)) for step, values in recorder.records]
    assert rows == [(1, ["lr-SGD"]), (1, ["epoch", "loss_step"]), (3, ["lr-SGD"]), (3, ["epoch", "loss_step"]),
                    (3, ["epoch", "loss_epoch"])]


class LogsPerValidationStep(LogsEverything):
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("vloss", batch[0].mean(), on_step=True)  # on_epoch stays True in validation: vloss_step and vloss_epoch

    test_step = validation_step


def test_on_step_in_validation_and_test_gives_lightnings_step_and_epoch_names(tmp_path: Any) -> None:
    recorder = Recorder()
    trainer = _trainer(tmp_path, max_epochs=2, log_every_n_steps=50, callbacks=[recorder])
    module = LogsPerValidationStep()
    trainer.fit(module, _data(2, 1), _data(3, 2))  # validation batches [0, 1] and [2]; the sanity check logs nothing
    rows = [(step, values) for step, values in recorder.records if "vloss_step" in values or "vloss_epoch" in values]
    # Lightning: each evaluation batch at the count of evaluation batches of this fit so far (no epoch key),
    # the epoch value as any epoch value (at the training step, with the epoch)
    assert rows == [
        (0, {"vloss_step": 0.5}), (1, {"vloss_step": 2.0}), (1, {"vloss_epoch": 1.0, "epoch": 0}),
        (2, {"vloss_step": 0.5}), (3, {"vloss_step": 2.0}), (3, {"vloss_epoch": 1.0, "epoch": 1}),
    ]
    # Lightning: callback_metrics take evaluation values as epoch values only (vloss_step never reaches them)
    assert {"vloss", "vloss_epoch"} <= set(trainer.callback_metrics) and "vloss_step" not in trainer.callback_metrics
    assert {"vloss_step", "vloss_epoch"} <= set(trainer.logged_metrics)
    recorder.records.clear()
    assert trainer.test(module, _data(3, 2)) == [{"vloss_epoch": pytest.approx(1.0)}]
    assert [step for step, values in recorder.records if "vloss_step" in values] == [0, 1]  # a new run counts from 0


class _BatchEndOutputs(Callback):
    def __init__(self) -> None:
        self.seen: list[tuple[Any, Any]] = []

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.seen.append((outputs, dict(trainer.callback_metrics)))


class _LogsItsLoss(TrainModule):
    """Logs the loss it returns on even batches, a dict with it on odd ones, and something else on batch 2."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        loss = self.layer(batch[0]).pow(2).mean()
        self.log("other" if batch_idx == 2 else "loss", loss * 2 if batch_idx == 2 else loss)
        return {"loss": loss, "n": batch_idx} if batch_idx % 2 else loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_batch_end_outputs_are_detached_once_with_the_logged_loss(tmp_path: Any) -> None:
    seen = _BatchEndOutputs()
    trainer = _trainer(tmp_path, max_epochs=1, callbacks=[seen])
    trainer.fit(_LogsItsLoss(), _data(5, 1))
    losses = [out["loss"] if isinstance(out, dict) else out for out, _ in seen.seen]
    assert all(not loss.requires_grad and loss.grad_fn is None for loss in losses)
    assert [out["n"] for out, _ in seen.seen[1::2]] == [1, 3]  # a dict keeps its other items
    # a loss that self.log logged this batch reaches the hook as the very tensor the metrics hold (one detach)
    for batch_idx in (0, 1, 3, 4):
        assert losses[batch_idx] is seen.seen[batch_idx][1]["loss"]
    # batch 2 logged another tensor: its output is detached on its own, and the stale "loss" is not reused
    assert losses[2] is not seen.seen[2][1]["loss"] and losses[2] is not seen.seen[2][1]["other"]
    assert float(seen.seen[2][1]["other"]) == pytest.approx(2 * float(losses[2]))


# ------------------------------------------------------------------------------------- Lightning's other arguments
def _two_process_store(reduced: list[str]) -> ResultsStore:
    """A store that believes it is one of two processes; `reduced` records each collective reduction."""
    return ResultsStore(device=torch.device("cpu"), reduce=lambda t, op: reduced.append(op) or t,
                        gather_object=lambda o: [o, o], world_size=2)


def test_rank_zero_only_never_synchronizes() -> None:
    reduced: list[str] = []
    store = _two_process_store(reduced)
    store.set_context("train", True)
    store.log("r0", torch.tensor(3.0), on_epoch=True, sync_dist=True, rank_zero_only=True, batch_size=1)
    store.log("r0", torch.tensor(5.0), on_epoch=True, sync_dist=True, rank_zero_only=True, batch_size=1)  # the fast path
    assert store.flush_step() == {"r0_step": 5.0}
    assert store.reduce_epoch("train")[0] == {"r0_epoch": 4.0}
    assert reduced == []  # the process's own values: no collective another process would have to join
    store.set_context("train", True)
    store.log("synced", torch.tensor(1.0), sync_dist=True)
    store.flush_step()
    assert reduced == ["sum"]  # without rank_zero_only, sync_dist reduces


def test_rank_zero_only_refuses_a_metric_on_several_processes() -> None:
    torchmetrics = pytest.importorskip("torchmetrics")
    store = _two_process_store([])
    store.set_context("validation", False)
    with pytest.raises(ValueError, match="synchronizes itself in compute"):
        store.log("m", torchmetrics.SumMetric(), rank_zero_only=True)


def test_sync_dist_group() -> None:
    store = _store()
    store.set_context("validation", False)
    store.log("a", 1.0, sync_dist=True, sync_dist_group=None)
    with pytest.raises(NotImplementedError, match=r"sub-group of processes is not supported.*sync_dist_group=None"):
        store.log("b", 1.0, sync_dist=True, sync_dist_group=object())


def test_enable_graph_keeps_the_step_values_graph() -> None:
    store = _store()
    store.set_context("train", True)
    weight = torch.tensor(2.0, requires_grad=True)
    for _ in range(2):  # the checked call, then the fast path
        store.log("kept", weight * 3, on_epoch=True, enable_graph=True, batch_size=1)
        store.log("plain", weight * 3, batch_size=1)
        assert store.callback_metrics["kept"].grad_fn is not None and store.callback_metrics["plain"].grad_fn is None
    store.callback_metrics["kept"].backward()
    assert weight.grad == 3.0
    values, _ = store.reduce_epoch("train")
    assert values == {"kept_epoch": 6.0} and not store._entries["train"]["kept"].updates  # accumulators held no graph


def test_metric_attribute_is_accepted() -> None:
    store = _store()
    store.set_context("validation", False)
    store.log("a", 1.0, metric_attribute="metric")
    with pytest.raises(TypeError, match="metric_attribute=3"):
        store.log("b", 1.0, metric_attribute=3)  # type: ignore[arg-type]


class LogsPositionally(Logs):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (x,) = batch
        loss = self.layer(x).pow(2).mean()
        # Lightning's order: name, value, prog_bar, logger, on_step, on_epoch, reduce_fx, enable_graph, sync_dist, ...
        self.log("shown", loss, True, None, False, True, "sum")
        self.log_dict({"quiet": loss}, False, False, rank_zero_only=True)
        self.log("r0", loss, rank_zero_only=True, sync_dist=True, sync_dist_group=None, metric_attribute=None)
        return loss


def test_log_takes_lightnings_positional_order(tmp_path: Any) -> None:
    trainer = _trainer(tmp_path, max_epochs=1, num_sanity_val_steps=0, limit_val_batches=0)
    trainer.fit(LogsPositionally(), _data(4, 2))
    assert "shown" in trainer.progress_bar_metrics and "shown" in trainer.logged_metrics  # prog_bar, logger=None: True
    assert "quiet" in trainer.callback_metrics and "quiet" not in trainer.logged_metrics  # logger=False
    assert "r0" in trainer.logged_metrics
