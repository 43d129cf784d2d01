"""`estimate_memory(pp=2)` against one pipelined iteration measured on 2 real processes (gloo, CPU), stage by stage:
an MLP under 1F1B and GPipe, and the tiny `transformers` Llama the pipeline tests train, under 1F1B. One job measures
every configuration; the estimates run here, on fake tensors."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from benchmarks.memory_estimate import StagedMLP
from tests.helpers.multiprocess import run_distributed
from trainer.planning.layouts import Setup

pytestmark = [pytest.mark.distributed]

BATCH = 8


def _llama() -> nn.Module:
    from tests.distributed.test_pipeline import _llama_stages

    _, stages = _llama_stages()
    stages.config = _llama_config()  # its batch is token ids
    return stages


def _llama_config() -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                       num_key_value_heads=2, max_position_embeddings=32)


CASES = [  # (model, its factory, one sample's shape, schedule, microbatches of the batch of 8)
    ("mlp", StagedMLP, (256, 64), "1F1B", 4), ("mlp", StagedMLP, (256, 64), "1F1B", 2), ("mlp", StagedMLP, (256, 64), "GPipe", 4),
    ("llama", _llama, (32,), "1F1B", 4),
]


def _setup(shape: tuple[int, ...]) -> Setup:
    return Setup(strategy="single", num_processes=1, precision="32-true", optimizer="adamw", activation_checkpointing=False,
                 batch_size=BATCH, shape=shape, device="cpu")


def _measure_all() -> list[dict[str, int]]:
    import datetime

    import torch.distributed as dist

    from trainer.planning.stages import measure_stage, tally_dict

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))  # ended by the pool after the call
    out = []
    for _, factory, shape, schedule, microbatches in CASES:
        torch.manual_seed(0)
        out.append(tally_dict(measure_stage(factory(), _setup(shape), schedule=schedule, microbatches=microbatches)))
    return out


@pytest.mark.timeout(300)
def test_each_stage_of_a_2_process_pipeline_is_estimated_within_10_percent() -> None:
    pytest.importorskip("transformers")
    from trainer.planning.memory import estimate_memory

    per_rank = run_distributed(_measure_all, nprocs=2, timeout=180)
    report, peaks = [], {}
    for index, (name, factory, shape, schedule, microbatches) in enumerate(CASES):
        estimate = estimate_memory(factory(), pp=2, pipeline_schedule=schedule, microbatches=microbatches, batch_size=BATCH,
                                   device="cpu", **({"seq_len": shape[0]} if name == "llama" else {"input_shape": shape}))
        assert len(estimate.stages) == 2 and estimate.peak == max(s.peak for s in estimate.stages)
        peaks[name, schedule, microbatches] = [stage.peak for stage in estimate.stages]
        for stage, (guess, ranks) in enumerate(zip(estimate.stages, per_rank, strict=True)):
            measured = ranks[index]
            report.append(f"{name} {schedule} x{microbatches} stage {stage}: estimate {guess.peak} measured {measured['peak']} "
                          f"ratio {guess.peak / measured['peak']:.3f}")
    print("\n".join(report))
    # the MLP's activations outweigh its weights: GPipe keeps 4 microbatches in flight, 1F1B 2 on the first stage, 1 on the last
    assert peaks["mlp", "GPipe", 4][0] > 1.2 * peaks["mlp", "1F1B", 4][0] and peaks["mlp", "1F1B", 4][0] > 1.2 * peaks["mlp", "1F1B", 4][1]
    for line in report:
        assert 0.9 <= float(line.rsplit(" ", 1)[1]) <= 1.1, "\n".join(report)
