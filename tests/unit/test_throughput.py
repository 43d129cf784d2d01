"""`ThroughputMonitor`'s Lightning figures: items (tokens) per second, FLOPs per second and MFU, against a fixed clock."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import torch

from callbacks.throughput import ThroughputMonitor, get_available_flops
from tests.unit.test_callbacks_builtin import MetricsRecorder, TinyModule, _loader, _trainer
from trainer.utilities import measure_flops


def _fixed_clock(monitor: ThroughputMonitor, tick: float = 0.5) -> None:
    """Each reading of the monitor's clock is `tick` seconds after the previous one: one batch takes `tick` seconds."""
    ticks = itertools.count()
    monitor._now = lambda: next(ticks) * tick  # type: ignore[method-assign]


def _flops_per_batch(batch_size: int = 8) -> int:
    with torch.device("meta"):
        model, x = TinyModule(), torch.randn(batch_size, 4)
    return measure_flops(model, lambda: model(x), lambda y: y.sum())


def test_items_flops_and_mfu_are_computed_as_lightning(tmp_path: Path) -> None:
    flops = _flops_per_batch()
    # forward (2*8*4 + 2*8*1) + backward: both weight grads, and the input grad of the second layer only (x needs none)
    assert flops == (64 + 16) + (64 + 16 + 16)
    recorder = MetricsRecorder()
    monitor = ThroughputMonitor(length_fn=lambda batch: batch[0].numel(), window_size=4, log_every_n_steps=4,
                                flops_per_batch=flops, available_flops=1e3, time_unit="minutes")
    _fixed_clock(monitor)
    _trainer(tmp_path, callbacks=[monitor, recorder]).fit(TinyModule(), _loader())  # 8 batches of 8 samples of 4 items
    (_, metrics), *_ = [r for r in recorder.records if "throughput/device/mfu" in r[1]]
    assert metrics["throughput/batches_per_sec"] == pytest.approx(2.0)  # 4 batches in 4 * 0.5 s
    assert metrics["throughput/samples_per_sec"] == pytest.approx(16.0)
    assert metrics["throughput/items_per_sec"] == metrics["throughput/device/items_per_sec"] == pytest.approx(64.0)
    assert metrics["throughput/flops_per_sec"] == pytest.approx(4 * flops / 2.0)
    assert metrics["throughput/device/mfu"] == metrics["throughput/mfu"] == pytest.approx(4 * flops / 2.0 / 1e3)  # flops / time / peak
    assert metrics["throughput/time"] == pytest.approx(2.0 / 60) and metrics["throughput/items"] == 4 * 32


def test_flops_per_batch_from_the_module_attribute_and_no_mfu_without_a_peak(tmp_path: Path) -> None:
    class WithFlops(TinyModule):
        flops_per_batch = 100

    monitor = ThroughputMonitor(window_size=2, log_every_n_steps=2)
    _fixed_clock(monitor, tick=0.25)
    _trainer(tmp_path, callbacks=[monitor]).fit(WithFlops(), _loader())
    assert monitor.last_metrics["throughput/device/flops_per_sec"] == pytest.approx(400.0)
    assert "throughput/device/mfu" not in monitor.last_metrics  # CPU: no known peak
    assert "throughput/items_per_sec" not in monitor.last_metrics


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"length_fn": 3}, TypeError), ({"flops_per_batch": 0}, ValueError), ({"available_flops": -1.0}, ValueError),
    ({"time_unit": "weeks"}, ValueError),
])
def test_bad_arguments_are_refused(kwargs: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error, match=next(iter(kwargs))):
        ThroughputMonitor(**kwargs)


def test_available_flops_of_known_chips(monkeypatch: pytest.MonkeyPatch) -> None:
    assert get_available_flops(torch.device("cpu"), torch.float32) is None
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert get_available_flops(torch.device("cuda", 0), torch.bfloat16) == int(989.4e12)  # Lightning 2.6's figure
    with pytest.warns(UserWarning, match="FLOPs not found"):
        assert get_available_flops(torch.device("cuda", 0), torch.int8) is None
