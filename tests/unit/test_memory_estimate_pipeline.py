"""`estimate_memory(pp=...)` without processes: the stages follow the pipeline's split, the schedule's microbatches in
flight change the first stage's peak, the CLI prints every stage, and what is not modelled is refused with the fix.
(The estimates against real pipelined steps: tests/distributed/test_memory_estimate_pipeline.py.)"""

from __future__ import annotations

import json

import pytest

from benchmarks.memory_estimate import MLP, StagedMLP
from trainer.cli import main
from trainer.utils import estimate_memory

SHAPE = {"input_shape": (256, 64), "batch_size": 8, "device": "cpu"}


def test_stages_follow_the_split_and_the_schedule() -> None:
    one = estimate_memory(StagedMLP, pp=2, microbatches=4, **SHAPE)
    gpipe = estimate_memory(StagedMLP, pp=2, microbatches=4, pipeline_schedule="GPipe", **SHAPE)
    whole = estimate_memory(StagedMLP, **SHAPE)
    assert one.pp == 2 and len(one.stages) == 2 and one.peak == max(s.peak for s in one.stages) == one.stages[0].peak
    # each stage holds its own layers: embed + 2 layers, 2 layers + head
    assert [s.parameters for s in one.stages] == [4 * (64 * 256 + 256 + 2 * (256 * 256 + 256)), 4 * (2 * (256 * 256 + 256) + 256 * 64 + 64)]
    assert sum(s.parameters for s in one.stages) == whole.parameters
    assert gpipe.stages[0].peak > one.stages[0].peak  # 4 microbatches in flight against 2
    assert gpipe.stages[0].activations > one.stages[0].activations


def test_cli_prints_every_stage(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["estimate-memory", "benchmarks.memory_estimate:StagedMLP", "--input_shape", "256,64", "--batch_size", "8",
            "--device", "cpu", "--pp", "2", "--microbatches", "4"]
    assert main(args) == 0
    assert "stage 0:" in capsys.readouterr().out
    assert main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["pp"] == 2 and len(out["stages"]) == 2 and out["per_process"]["peak"] == max(s["peak"] for s in out["stages"])
    assert main([*args, "--tp", "2"]) == 2
    assert "tensor parallelism" in capsys.readouterr().err
    assert main([*args, "--budget", "1GiB"]) == 2
    assert "--budget searches data-parallel layouts only" in capsys.readouterr().err


@pytest.mark.parametrize(("kwargs", "error", "words"), [
    ({"tp": 2}, NotImplementedError, "tensor parallelism"),
    ({"pp": 0}, ValueError, "pp=0"),
    ({"pipeline_schedule": "Interleaved1F1B"}, NotImplementedError, "one stage per process"),
    ({"pipeline_schedule": "Zigzag"}, ValueError, "not a schedule"),
    ({"strategy": "ddp", "num_processes": 2}, NotImplementedError, "strategy='ddp'"),
    ({"precision": "bf16-mixed"}, NotImplementedError, "bf16-mixed"),
    ({"microbatches": 3}, ValueError, "batch_size=8 does not split into 3"),
    ({"microbatches": 1}, ValueError, "fewer than the 2 processes"),
])
def test_what_is_not_modelled_is_refused_with_the_fix(kwargs: dict, error: type, words: str) -> None:
    with pytest.raises(error, match=words):
        estimate_memory(StagedMLP, **{"pp": 2, **SHAPE, **kwargs})


def test_layers_that_do_not_divide_into_the_stages_are_refused() -> None:
    with pytest.raises(ValueError, match=r"4 layers .* do not divide into 3 pipeline stages"):
        estimate_memory(MLP, pp=3, input_shape=(64, 512), batch_size=3, device="cpu")
