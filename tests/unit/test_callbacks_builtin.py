"""The built-in callbacks: ProgressBar, LearningRateMonitor, ModelSummary, Timer, ThroughputMonitor,
OnExceptionCheckpoint. Argument checks and pure helpers first, then real `Trainer` runs on a tiny model."""

from __future__ import annotations

import io
import re
import threading
import types
from datetime import timedelta

import pytest
import torch
from torch import nn

from callbacks.lr_monitor import LearningRateMonitor
from callbacks.on_exception import OnExceptionCheckpoint
from callbacks.progress import ProgressBar, _total
from callbacks.summary import ModelSummary, format_count, format_summary, summarize
from callbacks.throughput import ThroughputMonitor
from callbacks.timer import Timer, parse_duration


# ------------------------------------------------------------------------------------ argument checks
@pytest.mark.parametrize(
    ("factory", "message"),
    [
        (lambda: ProgressBar(refresh_rate=-1), r"refresh_rate=-1"),
        (lambda: ProgressBar(refresh_rate=1.5), r"refresh_rate=1.5"),
        (lambda: LearningRateMonitor(logging_interval="batch"), r"logging_interval='batch'.*'step', 'epoch'"),
        (lambda: ModelSummary(max_depth=-2), r"max_depth=-2"),
        (lambda: ModelSummary(max_depth="1"), r"max_depth='1'"),
        (lambda: Timer(duration="12:00"), r"'12:00'.*DD:HH:MM:SS"),
        (lambda: Timer(duration={"hour": 1}), r"unknown keys \['hour'\]"),
        (lambda: Timer(duration="00:00:00:00"), r"must be positive"),
        (lambda: Timer(interval="batch"), r"interval='batch'"),
        (lambda: ThroughputMonitor(window_size=0), r"window_size=0"),
        (lambda: ThroughputMonitor(log_every_n_steps=0), r"log_every_n_steps=0"),
        (lambda: OnExceptionCheckpoint(""), r"dirpath=''"),
        (lambda: OnExceptionCheckpoint("ckpts", filename="a/b"), r"filename='a/b'"),
        (lambda: OnExceptionCheckpoint("ckpts", filename=""), r"filename=''"),
    ],
)
def test_bad_arguments_raise_value_error_naming_the_value(factory, message):
    with pytest.raises(ValueError, match=message):
        factory()


@pytest.mark.parametrize(
    "factory",
    [
        lambda: Timer(duration=3600),
        lambda: ThroughputMonitor(batch_size_fn=3),
        lambda: OnExceptionCheckpoint(None),
    ],
)
def test_wrong_types_raise_type_error(factory):
    with pytest.raises(TypeError, match="pass"):
        factory()


# ------------------------------------------------------------------------------------ pure helpers
def test_parse_duration_accepts_string_timedelta_and_dict():
    assert parse_duration("01:02:03:04") == timedelta(days=1, hours=2, minutes=3, seconds=4)
    assert parse_duration(timedelta(minutes=5)) == timedelta(minutes=5)
    assert parse_duration({"hours": 12}) == timedelta(hours=12)
    assert parse_duration(None) is None


def test_progress_totals_from_batch_counts():
    assert _total(7) == 7
    assert _total(float("inf")) is None
    assert _total(None) is None
    assert _total([3, 4]) == 7
    assert _total([3, float("inf")]) is None


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(3, 5)  # 20 params
        self.norm = nn.BatchNorm1d(5)  # 10 params, 2 buffers of 5 floats + 1 int64 counter


def test_summarize_counts_params_trainable_and_tied_weights_once():
    model = nn.Sequential()
    model.add_module("embed", nn.Embedding(10, 4))  # 40
    model.add_module("block", _Block())  # 30
    model.add_module("head", nn.Linear(4, 10, bias=False))  # 40, tied to embed below
    model.head.weight = model.embed.weight
    model.add_module("frozen", nn.Linear(2, 2))  # 6
    for p in model.frozen.parameters():
        p.requires_grad_(False)

    summary = summarize(model, max_depth=1)
    assert [(r.name, r.type, r.params) for r in summary.layers] == [
        ("embed", "Embedding", 40),
        ("block", "_Block", 30),
        ("head", "Linear", 40),
        ("frozen", "Linear", 6),
    ]
    assert summary.total_params == 40 + 30 + 6 == sum(p.numel() for p in model.parameters())
    assert summary.trainable_params == 70
    assert summary.non_trainable_params == 6
    assert summary.size_bytes == 76 * 4 + 10 * 4 + 8  # params + BatchNorm running stats + num_batches_tracked

    deep = summarize(model, max_depth=2)
    assert [r.name for r in deep.layers] == ["embed", "block", "block.inner", "block.norm", "head", "frozen"]
    assert [r.name for r in summarize(model, max_depth=-1).layers] == [r.name for r in deep.layers]
    assert summarize(model, max_depth=0).layers == []


def test_summary_table_text():
    model = nn.Sequential(nn.Linear(1000, 1000), nn.ReLU())
    text = format_summary(summarize(model))
    assert re.search(r"0 \| 0\s+\| Linear \| 1\.0 M", text)
    assert re.search(r"1 \| 1\s+\| ReLU\s+\| 0", text)
    assert "1.0 M      Trainable params" in text
    assert "0          Non-trainable params" in text
    assert "4.004      Total estimated model params size (MB)" in text
    assert format_count(999) == "999"
    assert format_count(1234) == "1.2 K"
    assert format_count(3_400_000_000) == "3.4 B"


def test_timer_state_round_trip_restores_train_time():
    timer = Timer(duration=dict(minutes=10))
    assert timer.time_elapsed("train") == 0.0
    assert timer.time_remaining() == 600.0
    restored = Timer(duration=dict(minutes=10))
    restored.load_state_dict({"time_elapsed": {"train": 120.0, "validate": 5.0}})
    assert restored.time_elapsed("train") == 120.0
    assert restored.time_elapsed("validate") == 0.0
    assert restored.time_remaining("train") == 480.0
    assert restored.state_dict()["time_elapsed"]["train"] == 120.0
    with pytest.raises(ValueError, match="stage 'fit'"):
        restored.time_elapsed("fit")


# ------------------------------------------------------------------------------------ with the real Trainer
import time  # noqa: E402
from pathlib import Path  # noqa: E402

from torch.nn import functional as F  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from callbacks.base import Callback  # noqa: E402
from trainer import Trainer, TrainModule  # noqa: E402


def _loader(n: int = 64, batch_size: int = 8) -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=generator)
    return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=batch_size)


class TinyModule(TrainModule):
    """A linear regression; optional sleep per step, failure at a given batch, scheduler choice."""

    def __init__(self, sleep: float = 0.0, fail_at: int | None = None, scheduler: str | None = None, groups: int = 1):
        super().__init__()
        self.layer = nn.Linear(4, 1)
        self.extra = nn.Linear(1, 1)
        self.sleep, self.fail_at, self.scheduler, self.groups = sleep, fail_at, scheduler, groups

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.extra(self.layer(x))

    def training_step(self, batch, batch_idx):
        if self.fail_at is not None and self.global_step == self.fail_at:
            raise RuntimeError("boom")
        if self.sleep:
            time.sleep(self.sleep)
        x, y = batch
        loss = F.mse_loss(self(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.mse_loss(self(x), y), prog_bar=True)

    def configure_optimizers(self):
        if self.groups == 2:
            params = [{"params": self.layer.parameters()}, {"params": self.extra.parameters(), "lr": 0.01}]
        else:
            params = self.parameters()
        optimizer = torch.optim.SGD(params, lr=0.1, momentum=0.9)
        if self.scheduler == "step":
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
        if self.scheduler == "epoch":
            return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.1)]
        return optimizer


class MetricsRecorder(Callback):
    """Keeps every ``(step, metrics)`` the Trainer sends to its trackers."""

    def __init__(self) -> None:
        self.records: list[tuple[int, dict]] = []

    def on_log_metrics(self, trainer, module, metrics, step):
        self.records.append((step, dict(metrics)))

    def values(self, name: str) -> list[tuple[int, float]]:
        return [(step, float(m[name])) for step, m in self.records if name in m]


def _trainer(tmp_path: Path, **kwargs) -> Trainer:
    settings = dict(
        max_epochs=1, project_dir=str(tmp_path), log_with=None, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0, log_every_n_steps=1,
    )
    settings.update(kwargs)
    return Trainer(**settings)


def _final_line(output: str, prefix: str) -> str:
    """The last redraw of the bar whose description starts with `prefix` (tqdm redraws with \\r)."""
    frames = [frame.strip() for frame in re.split(r"[\r\n]", output) if frame.strip().startswith(prefix)]
    assert frames, f"no bar starting with {prefix!r} in {output!r}"
    return frames[-1]


@pytest.mark.timeout(120)
def test_progress_bar_totals_and_postfix(tmp_path):
    stream = io.StringIO()
    bar = ProgressBar(refresh_rate=3, file=stream)
    trainer = _trainer(tmp_path, callbacks=[bar], limit_train_batches=7, num_sanity_val_steps=2)
    trainer.fit(TinyModule(), _loader(), _loader(n=32))
    output = stream.getvalue()
    train = _final_line(output, "Epoch 0")
    assert "7/7" in train
    assert re.search(r"loss=[0-9.e+-]+", train) and re.search(r"train_loss=[0-9.e+-]+", train)
    assert re.search(r"val_loss=[0-9.e+-]+", train)  # validation metrics shown after validation
    assert "4/4" in _final_line(output, "Validation")
    assert "2/2" in _final_line(output, "Sanity Checking")
    assert bar.train_bar is None and bar.eval_bar is None


class _Threads(Callback):
    """The threads alive at each training batch's end."""

    def __init__(self):
        self.seen = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.seen.append(list(threading.enumerate()))


@pytest.mark.timeout(120)
def test_progress_bar_starts_no_thread(tmp_path):
    """tqdm's monitor thread stays off: once a process has started a thread, every later step costs more."""
    from tqdm._monitor import TMonitor

    stream, threads = io.StringIO(), _Threads()
    before = set(threading.enumerate())  # a monitor another library's bar started earlier in this process is not ours
    trainer = _trainer(tmp_path, callbacks=[ProgressBar(refresh_rate=2, file=stream), threads])
    trainer.fit(TinyModule(), _loader())
    assert "8/8" in _final_line(stream.getvalue(), "Epoch 0")
    assert threads.seen and not any(isinstance(t, TMonitor) and t not in before for alive in threads.seen for t in alive)


@pytest.mark.timeout(120)
def test_progress_bar_redraws_only_every_refresh_rate_batches(tmp_path):
    stream = io.StringIO()
    trainer = _trainer(tmp_path, callbacks=[ProgressBar(refresh_rate=4, file=stream, min_interval=0)])
    trainer.fit(TinyModule(), _loader())  # 8 batches: redraws at 4 and 8
    counts = {m.group(1) for m in re.finditer(r"Epoch 0: *\d+%\|[^|]*\| *(\d+)/8", stream.getvalue())}
    assert counts <= {"0", "4", "8"} and "8" in counts


@pytest.mark.timeout(120)
def test_progress_bar_redraws_at_most_every_min_interval(tmp_path):
    stream = io.StringIO()
    trainer = _trainer(tmp_path, callbacks=[ProgressBar(refresh_rate=1, file=stream, min_interval=3600)])
    trainer.fit(TinyModule(), _loader())  # within the hour: only the last batch redraws
    counts = {m.group(1) for m in re.finditer(r"Epoch 0: *\d+%\|[^|]*\| *(\d+)/8", stream.getvalue())}
    assert counts <= {"0", "8"} and "8" in counts
    with pytest.raises(ValueError, match="min_interval=-1"):
        ProgressBar(min_interval=-1)


class _BatchClock(Callback):
    """A clock that moves 10 ms per training batch, and counts how often it is read."""

    def __init__(self) -> None:
        self.batches, self.reads = 0, 0

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        self.batches += 1

    def monotonic(self) -> float:
        self.reads += 1
        return self.batches * 0.01


@pytest.mark.timeout(120)
def test_progress_bar_reads_the_clock_on_few_batches_and_still_redraws_every_min_interval(tmp_path, monkeypatch):
    """The train bar does not read the clock every batch: at the pace since its last redraw it waits the batches the
    rest of min_interval takes. At 10 ms a batch and min_interval=0.1 s it still redraws every 10 to 12 batches."""
    clock, stream, redraws = _BatchClock(), io.StringIO(), []

    class CountingBar(ProgressBar):
        def _refresh_train_bar(self, trainer):
            redraws.append(self._pending)
            super()._refresh_train_bar(trainer)

    monkeypatch.setattr("callbacks.progress.time", types.SimpleNamespace(monotonic=clock.monotonic))  # the bar's clock only
    trainer = _trainer(tmp_path, max_epochs=1, callbacks=[clock, CountingBar(refresh_rate=1, file=stream, min_interval=0.1)])
    trainer.fit(TinyModule(), _loader(n=960))  # 120 batches
    assert clock.batches == 120
    *steady, _last_batch, epoch_end = redraws  # then the last batch's redraw and the epoch end's (nothing pending)
    assert all(10 <= n <= 12 for n in steady) and len(steady) >= 9 and sum(redraws) == 120 and epoch_end == 0, str(redraws)
    assert clock.reads <= 40, clock.reads  # read on every batch before: 120 reads


@pytest.mark.timeout(120)
def test_default_progress_bar_and_summary_are_added_and_replaceable(tmp_path, capsys):
    trainer = _trainer(tmp_path, enable_progress_bar=True, enable_model_summary=True)
    assert sum(isinstance(cb, ProgressBar) for cb in trainer.callbacks) == 1
    assert sum(isinstance(cb, ModelSummary) for cb in trainer.callbacks) == 1
    summary = ModelSummary(max_depth=-1)
    trainer = _trainer(tmp_path, enable_progress_bar=True, enable_model_summary=True, callbacks=[summary])
    assert [cb for cb in trainer.callbacks if isinstance(cb, ModelSummary)] == [summary]
    trainer.fit(TinyModule(), _loader())
    out = capsys.readouterr().out
    assert out.count("Trainable params") == 1
    assert re.search(r"layer +\| Linear \| 5\b", out) and re.search(r"extra +\| Linear \| 2\b", out)
    assert "7          Total params" in out
    assert summary.summary.total_params == 7 and summary.summary.trainable_params == 7


@pytest.mark.timeout(120)
def test_lr_monitor_logs_the_scheduled_learning_rate_each_step(tmp_path):
    recorder = MetricsRecorder()
    trainer = _trainer(tmp_path, callbacks=[LearningRateMonitor(log_momentum=True), recorder], max_steps=5)
    trainer.fit(TinyModule(scheduler="step"), _loader())
    lrs = recorder.values("lr-SGD")
    assert [step for step, _ in lrs] == [0, 1, 2, 3, 4]
    for step, lr in lrs:
        assert lr == pytest.approx(0.1 * 0.5**step)
    assert {value for _, value in recorder.values("lr-SGD-momentum")} == {0.9}
    assert trainer.logged_metrics["lr-SGD"] == pytest.approx(0.1 * 0.5**4)


@pytest.mark.timeout(120)
def test_lr_monitor_epoch_interval_and_param_groups(tmp_path):
    recorder = MetricsRecorder()
    trainer = _trainer(tmp_path, callbacks=[LearningRateMonitor(), recorder], max_epochs=3, limit_train_batches=2)
    trainer.fit(TinyModule(scheduler="epoch", groups=2), _loader())
    assert recorder.values("lr-SGD/pg1") == [(0, pytest.approx(0.1)), (2, pytest.approx(0.01)), (4, pytest.approx(0.001))]
    assert recorder.values("lr-SGD/pg2") == [(0, pytest.approx(0.01)), (2, pytest.approx(0.001)), (4, pytest.approx(0.0001))]


@pytest.mark.timeout(120)
def test_timer_stops_training_when_the_budget_is_spent(tmp_path):
    timer = Timer(duration=timedelta(seconds=0.5), verbose=False)
    trainer = _trainer(tmp_path, callbacks=[timer], max_epochs=1000)
    started = time.monotonic()
    trainer.fit(TinyModule(sleep=0.02), _loader())
    assert time.monotonic() - started < 30
    assert trainer.should_stop
    assert 0 < trainer.global_step < 8000
    assert timer.time_elapsed("train") >= 0.5
    assert timer.time_remaining() <= 0
    assert timer.state_dict()["time_elapsed"]["train"] >= 0.5


@pytest.mark.timeout(120)
def test_timer_epoch_interval_stops_at_an_epoch_boundary(tmp_path):
    timer = Timer(duration=dict(seconds=0.3), interval="epoch", verbose=False)
    trainer = _trainer(tmp_path, callbacks=[timer], max_epochs=1000)
    trainer.fit(TinyModule(sleep=0.02), _loader())
    assert trainer.global_step > 0 and trainer.global_step % 8 == 0
    assert timer.time_elapsed("train") >= 0.3


@pytest.mark.timeout(120)
def test_throughput_values_are_positive_and_plausible(tmp_path):
    recorder = MetricsRecorder()
    monitor = ThroughputMonitor(window_size=4, log_every_n_steps=4)
    trainer = _trainer(tmp_path, callbacks=[monitor, recorder], max_epochs=2)
    trainer.fit(TinyModule(sleep=0.01), _loader())  # 16 batches of 8 samples, >= 10 ms each
    samples = recorder.values("throughput/samples_per_sec")
    batches = recorder.values("throughput/batches_per_sec")
    assert len(samples) == 4 and len(batches) == 4
    for (_, s), (_, b) in zip(samples, batches):
        assert 0 < b <= 100  # a batch takes at least 10 ms
        assert s == pytest.approx(8 * b)
    assert recorder.values("throughput/device/samples_per_sec") == samples  # one process


@pytest.mark.timeout(120)
def test_on_exception_checkpoint_is_written_and_loadable(tmp_path):
    callback = OnExceptionCheckpoint(tmp_path / "ckpts")
    trainer = _trainer(tmp_path, callbacks=[callback], max_epochs=2)
    module = TinyModule(fail_at=3)
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(module, _loader())
    path = tmp_path / "ckpts" / "on_exception"
    assert callback.saved_path == str(path) and path.is_dir()
    weights = {k: v.clone() for k, v in module.state_dict().items()}

    resumed = TinyModule()
    recorder = MetricsRecorder()
    trainer = _trainer(tmp_path, callbacks=[recorder], max_steps=3)  # already at step 3: nothing to train
    trainer.fit(resumed, _loader(), ckpt_path=str(path))
    assert trainer.global_step == 3
    for name, value in resumed.state_dict().items():
        torch.testing.assert_close(value, weights[name])


@pytest.mark.timeout(120)
def test_timer_elapsed_time_is_restored_on_resume(tmp_path):
    first = Timer(verbose=False)
    trainer = _trainer(tmp_path, callbacks=[first], max_epochs=1)
    trainer.fit(TinyModule(sleep=0.02), _loader())
    spent = first.time_elapsed("train")
    assert spent >= 8 * 0.02
    trainer.save_checkpoint(tmp_path / "ckpt")

    second = Timer(verbose=False)
    trainer = _trainer(tmp_path, callbacks=[second], max_epochs=2)
    trainer.fit(TinyModule(sleep=0.02), _loader(), ckpt_path=str(tmp_path / "ckpt"))
    assert second.time_elapsed("train") >= spent + 8 * 0.02


@pytest.mark.timeout(120)
def test_on_exception_local_weights_file_loads_into_the_module(tmp_path):
    from safetensors.torch import load_file

    callback = OnExceptionCheckpoint(tmp_path, filename="crash")
    trainer = _trainer(tmp_path, callbacks=[callback])
    module = TinyModule()
    trainer.fit(module, _loader())
    path = callback._save_local_weights(trainer, module)  # what each rank writes in a multi-process run
    assert path == str(tmp_path / "crash" / "rank0.safetensors")
    fresh = TinyModule()
    fresh.load_state_dict(load_file(path))
    for name, value in fresh.state_dict().items():
        torch.testing.assert_close(value, module.state_dict()[name])


@pytest.mark.timeout(120)
def test_on_exception_checkpoint_skips_failed_evaluation(tmp_path):
    class FailingValidation(TinyModule):
        def validation_step(self, batch, batch_idx):
            raise RuntimeError("bad validation")

    callback = OnExceptionCheckpoint(tmp_path / "ckpts")
    trainer = _trainer(tmp_path, callbacks=[callback])
    with pytest.raises(RuntimeError, match="bad validation"):
        trainer.validate(FailingValidation(), _loader())
    assert callback.saved_path is None and not (tmp_path / "ckpts").exists()


# ------------------------------------------------------------------------------------ LambdaCallback
def test_lambda_callback_runs_the_given_hooks_only(tmp_path):
    import callbacks
    from callbacks.base import overrides
    from callbacks.lambda_function import LambdaCallback
    from trainer.fit.dispatch import HookDispatcher

    assert callbacks.LambdaCallback is LambdaCallback
    seen: list[tuple] = []
    callback = LambdaCallback(
        on_train_epoch_start=lambda trainer, module: seen.append(("epoch", trainer.current_epoch)),
        on_train_batch_end=lambda trainer, module, outputs, batch, batch_idx: seen.append(("batch", batch_idx)),
        on_validation_end=lambda trainer, module: seen.append(("val", type(module).__name__)),
    )
    assert overrides(callback, "on_train_batch_end", Callback) and not overrides(callback, "on_train_batch_start", Callback)
    dispatcher = HookDispatcher(None, TrainModule, [callback], None)  # type: ignore[arg-type]
    assert set(dispatcher._callback_hooks) == {"on_train_epoch_start", "on_train_batch_end", "on_validation_end"}
    _trainer(tmp_path, max_epochs=2, callbacks=[callback]).fit(TinyModule(), _loader(n=16), _loader(n=16))
    assert seen == [("epoch", 0), ("batch", 0), ("batch", 1), ("val", "TinyModule"),
                    ("epoch", 1), ("batch", 0), ("batch", 1), ("val", "TinyModule")]
    with pytest.raises(TypeError, match="LambdaCallback\\(setup=3\\)"):
        LambdaCallback(setup=3)


def test_lambda_callback_takes_lightnings_keywords_in_order():
    import inspect

    from callbacks.lambda_function import LambdaCallback

    names = list(inspect.signature(LambdaCallback).parameters)
    assert names[:4] == ["setup", "teardown", "on_fit_start", "on_fit_end"] and names[-2:] == ["on_predict_epoch_end", "on_log_metrics"]
    assert len(names) == 38 and set(names) <= set(vars(Callback))
