"""The pipeline split and its settings without processes: names per stage, placement, pruning, refusals."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from strategies import ParallelDims, PipelineConfig
from strategies import pipeline_split as split


class Net(nn.Module):
    def __init__(self, layers: int = 4) -> None:
        super().__init__()
        self.embed = nn.Linear(2, 4)
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(layers)])
        self.norm = nn.LayerNorm(4)
        self.rope = nn.Identity()  # no parameters: kept on every stage
        self.head = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        if self.head is not None:
            x = self.head(self.norm(x))
        return x


def test_auto_split_gives_equal_layers_and_the_ends_to_the_end_stages() -> None:
    assert split.auto_split(Net(), 2) == [["embed", "layers.0", "layers.1"], ["layers.2", "layers.3", "norm", "rope", "head"]]
    with pytest.raises(ValueError, match="4 layers \\(layers\\) do not divide into 3 pipeline stages"):
        split.auto_split(Net(), 3)


def test_prune_keeps_the_stages_names_and_a_view_shares_the_layers() -> None:
    model = Net()
    first = split.prune(model, {"layers.2", "layers.3", "norm", "head"}, in_place=False)
    assert model.embed is not None and len(model.layers) == 4  # a view leaves the model whole
    assert first.embed is None and first.rope is not None and [n for n, _ in first.layers.named_children()] == ["2", "3"]
    assert next(iter(first.layers)) is model.layers[2]  # the same module, not a copy
    assert sorted(first.state_dict()) == sorted(k for k in model.state_dict() if not k.startswith(("embed", "layers.0", "layers.1")))
    split.prune(model, {"embed", "layers.0"}, in_place=True)
    assert model.head is None and model.norm is None and sorted(model.state_dict()) == [
        "embed.bias", "embed.weight", "layers.0.bias", "layers.0.weight"]
    assert model(torch.ones(3, 2)).shape == (3, 4)  # its forward skips what it does not hold


def test_stage_placement_looped_and_v() -> None:
    assert [split.stage_indices(r, 2, 2, v_style=False) for r in range(2)] == [(0, 2), (1, 3)]
    assert [split.stage_indices(r, 2, 2, v_style=True) for r in range(2)] == [(0, 3), (1, 2)]


def test_explicit_names_are_checked() -> None:
    config = PipelineConfig(module_fqns_per_stage=[["embed", "layers.0"], ["layers.1", "layers.2", "layers.3", "norm", "head"]])
    assert config.plan(Net(), 2)[0] == ["embed", "layers.0"]
    with pytest.raises(ValueError, match="in none: \\['head'\\]"):
        PipelineConfig(module_fqns_per_stage=[["embed", "layers.0"], ["layers.1", "layers.2", "layers.3", "norm"]]).plan(Net(), 2)
    with pytest.raises(ValueError, match="names \\['body'\\]"):
        PipelineConfig(module_fqns_per_stage=[["embed", "body"], ["head"]]).plan(Net(), 2)
    with pytest.raises(ValueError, match=r"holds no nn\.ModuleList"):
        split.layer_container(nn.Linear(2, 2))


def test_config_refuses_what_a_schedule_cannot_run() -> None:
    assert PipelineConfig(schedule="interleaved1f1b").schedule == "Interleaved1F1B"
    with pytest.raises(ValueError, match="is not a schedule; choose one of GPipe, 1F1B"):
        PipelineConfig(schedule="2F2B")
    with pytest.raises(ValueError, match="stages_per_rank=3; use stages_per_rank=2"):
        PipelineConfig(schedule="DualPipeV", stages_per_rank=3)
    with pytest.raises(ValueError, match="runs one stage per process"):
        PipelineConfig(schedule="1F1B", stages_per_rank=2)
    with pytest.raises(ValueError, match="microbatches=0"):
        PipelineConfig(microbatches=0)
    with pytest.raises(ValueError, match="layers_per_stage=3"):
        PipelineConfig(schedule="Interleaved1F1B", layers_per_stage=3).plan(Net(), 2)
    assert len(PipelineConfig(schedule="Interleaved1F1B", layers_per_stage=1).plan(Net(), 2)) == 4
    with pytest.raises(ValueError, match="fewer than the 2 processes"):
        PipelineConfig(microbatches=1).microbatches_for(2, 2)


def test_parallel_dims_puts_pp_outermost() -> None:
    dims = ParallelDims(world_size=8, pp=2, dp_shard=2, tp=2)
    assert [dims.coordinates(r)["pp"] for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [dims.coordinates(r)["dp"] for r in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert ParallelDims(world_size=4, pp=2).dp_shard == 2 and str(dims) == "pp=2 × dp_replicate=1 × dp_shard=2 × tp=2"
    with pytest.raises(ValueError, match="pp=2 × dp_replicate=1 × dp_shard=2 × tp=1 = 4, but there are 2 processes"):
        ParallelDims(world_size=2, pp=2, dp_shard=2)


def test_the_memory_planner_refuses_pipeline_stages_it_does_not_model() -> None:
    from trainer.planning.memory import estimate_memory

    with pytest.raises(NotImplementedError, match=r"pipeline_schedule='Interleaved1F1B'\): the planner models one stage per process"):
        estimate_memory(Net(), pp=2, pipeline_schedule="Interleaved1F1B", input_shape=(6,), batch_size=4)
    with pytest.raises(NotImplementedError, match=r"estimate_memory\(tp=2\): the planner does not model tensor parallelism"):
        estimate_memory(Net(), tp=2, input_shape=(6,))
