"""`estimate_memory` for DDP, FSDP2 and DeepSpeed ZeRO-2/3 against one iteration measured on 2 real processes (gloo,
CPU; DeepSpeed's engine measured from before it is built, `trainer.planning.measure.measure_zero`).

One `run_distributed` call measures every configuration inside the same two processes (the full grid is
`benchmarks/memory_estimate.py`); the estimates run here, on fake tensors over a fake process group. The DeepSpeed
rows need the deepspeed extra (its CPU communication op compiles once, cached in ``TORCH_EXTENSIONS_DIR``).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from benchmarks.memory_estimate import MODELS, measure_all
from tests.helpers.multiprocess import run_distributed
from trainer.planning.layouts import Setup
from trainer.planning.memory import estimate_setup
from trainer.planning.models import meta_copy

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(780)]

CONFIGS = [  # (model, strategy, precision, activation checkpointing, optimizer)
    ("llama", "fsdp", "32-true", False, "adamw"),
    ("llama", "fsdp", "bf16-mixed", True, "sgd"),
    ("mlp", "fsdp", "bf16-true", True, "adamw"),
    ("llama", "ddp", "bf16-mixed", False, "adamw"),
]
if importlib.util.find_spec("deepspeed") is not None:
    CONFIGS += [
        ("llama", "deepspeed_stage_2", "32-true", False, "adamw"),
        ("mlp", "deepspeed_stage_2", "bf16-mixed", True, "adamw"),
        ("llama", "deepspeed_stage_3", "bf16-mixed", True, "sgd"),
        ("mlp", "deepspeed_stage_3", "32-true", False, "adamw"),
    ]


def _configs() -> list[tuple[str, Setup]]:
    return [(model, Setup(strategy=strategy, num_processes=2, precision=precision, optimizer=optimizer, activation_checkpointing=ac,
                          batch_size=2, shape=(32,) if model == "llama" else (8, 512), device="cpu"))
            for model, strategy, precision, ac, optimizer in CONFIGS]


def test_ddp_fsdp2_and_zero_estimates_are_within_10_percent_of_two_measured_processes():
    configs = _configs()
    # DeepSpeed compiles its CPU communication op once per test session: minutes on a busy machine
    per_rank = run_distributed(measure_all, configs, nprocs=2, timeout=600)
    for (name, setup), measured in zip(configs, per_rank[0], strict=True):
        torch.manual_seed(0)
        estimate = estimate_setup(meta_copy(MODELS[name][0]()), setup)
        label = f"{name} {setup.strategy} {setup.precision} ac={setup.activation_checkpointing} {setup.optimizer}"
        assert estimate.peak == pytest.approx(measured["peak"], rel=0.10), label
        assert estimate.parameters == pytest.approx(measured["parameters"], rel=0.10), label
        assert estimate.optimizer == pytest.approx(measured["optimizer"], rel=0.10), label
        if setup.strategy.startswith("deepspeed"):  # the engine's copies and buffers: a weights-only count is far below
            assert estimate.weights_only < 0.5 * measured["peak"], label
