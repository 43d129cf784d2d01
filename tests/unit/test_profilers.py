"""``Trainer(profiler="pytorch"|"advanced"|"simple"|<Profiler>)`` with Lightning's classes (``trainer.profilers``)."""

from __future__ import annotations

import json
import pstats
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from trainer.fit.module import TrainModule
from trainer.fit.trainer import Trainer
from trainer.profilers import AdvancedProfiler, PassThroughProfiler, Profiler, PyTorchProfiler, SimpleProfiler

QUIET: dict[str, Any] = dict(log_with=None, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                             num_sanity_val_steps=0)


class Small(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])

    def train_dataloader(self) -> DataLoader:
        return DataLoader(TensorDataset(torch.randn(32, 4), torch.zeros(32, 1)), batch_size=4)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _fit(tmp_path: Path, profiler: Any, batches: int = 8) -> Trainer:
    trainer = Trainer(project_dir=tmp_path, max_epochs=1, limit_train_batches=batches, profiler=profiler, **QUIET)
    trainer.fit(Small())
    return trainer


def _trace(directory: Path) -> dict[str, Any]:
    traces = sorted(directory.glob("*.pt.trace.json"))
    assert len(traces) == 1, traces
    assert traces[0].name.startswith("fit-training_step."), traces[0].name  # Lightning's <stage>-<action>.<worker> naming
    return dict(json.loads(traces[0].read_text()))


def test_pytorch_profiler_writes_a_trace_of_the_scheduled_steps_and_a_table(tmp_path: Path, capsys: Any) -> None:
    schedule = torch.profiler.schedule(wait=1, warmup=1, active=2)
    profiler = PyTorchProfiler(dirpath=tmp_path / "prof", schedule=schedule, record_shapes=True, row_limit=5)
    _fit(tmp_path, profiler)
    events = _trace(tmp_path / "prof")["traceEvents"]
    names = [e.get("name", "") for e in events]
    steps = sorted({n for n in names if n.startswith("ProfilerStep#")})
    assert steps == ["ProfilerStep#2", "ProfilerStep#3"]  # after wait=1 and warmup=1: the 2 active steps, one cycle
    assert "[pl][profile]training_step" in names and "aten::addmm" in names  # the step's ops
    assert any("Input Dims" in e.get("args", {}) for e in events)  # record_shapes reached torch
    out = capsys.readouterr().out
    assert "FIT Profiler Report" in out and "Self CPU" in out and "cpu_time_total" not in out
    assert profiler.profiler is None  # stopped at the end of fit


def test_pytorch_profiler_summary_goes_to_the_file_named_by_filename(tmp_path: Path, capsys: Any) -> None:
    profiler = PyTorchProfiler(dirpath=tmp_path, filename="perf", schedule=torch.profiler.schedule(wait=0, warmup=1, active=1),
                               sort_by_key="count", export_to_chrome=False)
    _fit(tmp_path, profiler)
    assert "Profiler Report" not in capsys.readouterr().out
    assert "aten::" in (tmp_path / "fit-perf.txt").read_text()
    assert not list(tmp_path.glob("*.pt.trace.json"))


def test_profiler_pytorch_string_with_few_batches_records_every_step(tmp_path: Path) -> None:
    """The default schedule (wait=1, warmup=1, active=3) needs 5 steps; with 3 Lightning records them all."""
    with pytest.warns(UserWarning, match="default schedule"):
        trainer = _fit(tmp_path, "pytorch", batches=3)
    assert isinstance(trainer.profiler, PyTorchProfiler)
    names = {e.get("name") for e in _trace(Path(trainer.log_dir))["traceEvents"]}
    assert "[pl][profile]training_step" in names


def test_pytorch_profiler_refuses_unknown_settings() -> None:
    with pytest.raises(ValueError, match="sort_by_key='gpu'"):
        PyTorchProfiler(sort_by_key="gpu")
    with pytest.raises(ValueError, match="table_kwargs key 'sort_by'"):
        PyTorchProfiler(table_kwargs={"sort_by": "count"})
    with pytest.raises(ValueError, match=r"torch\.profiler\.schedule"):
        PyTorchProfiler(schedule=lambda step: "record")


def test_advanced_profiler_gives_cprofile_stats_per_action(tmp_path: Path, capsys: Any) -> None:
    profiler = AdvancedProfiler(dirpath=tmp_path, dump_stats=True, line_count_restriction=5)
    _fit(tmp_path, profiler)
    out = capsys.readouterr().out
    assert "Profile stats for: training_step" in out and "Profile stats for: optimizer_step" in out
    assert "Ordered by: cumulative time" in out
    # the step's own code is in its stats (the printed top 5 by cumulative time depend on the machine's timings)
    stats = pstats.Stats(str(tmp_path / "fit-training_step.prof"))
    assert any(name == "mse_loss" for _, _, name in stats.stats)  # type: ignore[attr-defined]
    assert profiler.profiled_actions == {}  # released after describe


def test_advanced_string_and_simple_profiler_object(tmp_path: Path, capsys: Any) -> None:
    assert isinstance(Trainer(profiler="advanced", **QUIET).profiler, AdvancedProfiler)
    simple = SimpleProfiler(dirpath=tmp_path, filename="simple")
    _fit(tmp_path, simple, batches=2)
    assert len(simple.recorded["training_step"]) == 2
    assert "training_step" in (tmp_path / "fit-simple.txt").read_text()


def test_a_custom_profiler_gets_start_and_stop(tmp_path: Path) -> None:
    class Counting(Profiler):
        def __init__(self) -> None:
            super().__init__()
            self.started: list[str] = []

        def start(self, action_name: str) -> None:
            self.started.append(action_name)

    profiler = Counting()
    _fit(tmp_path, profiler, batches=2)
    assert profiler.started.count("training_step") == 2 and profiler.started.count("run_training_epoch") == 1
    assert isinstance(PassThroughProfiler(), Profiler)
