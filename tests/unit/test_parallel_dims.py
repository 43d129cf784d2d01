"""The description of an N-D mesh (`ParallelDims`, Accelerate's `ParallelismConfig`) and tensor-parallel plans: sizes
checked against the number of processes with errors that name the product and the fix, ``-1`` as the rest, where each
process sits, and plans read from a `transformers` model. (The meshes at work: tests/distributed/test_nd_parallel.py.)"""

from __future__ import annotations

import pytest
from torch import nn

from strategies.mesh import ParallelDims
from strategies.tensor_parallel import apply_tensor_parallel, model_plan
from trainer import ParallelismConfig


def test_minus_one_takes_the_rest_and_coordinates_put_tp_innermost() -> None:
    dims = ParallelDims(world_size=8, dp_replicate=2, tp=2)
    assert (dims.dp_replicate, dims.dp_shard, dims.tp, dims.dp_size) == (2, 2, 2, 4)
    assert [dims.coordinates(r)["tp"] for r in range(4)] == [0, 1, 0, 1]  # a tensor-parallel group: neighbouring ranks
    assert [dims.coordinates(r)["dp"] for r in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]  # one batch per tp group
    assert dims.hsdp and dims.tp_enabled and dims.n_d
    assert not ParallelDims(world_size=4).n_d  # plain FSDP: dp_shard=-1 takes all


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"world_size": 8, "dp_shard": 2, "tp": 2}, ValueError, r"dp_replicate=1 × dp_shard=2 × tp=2 = 4, but there are 8 processes"),
        ({"world_size": 6, "dp_shard": -1, "tp": 4}, ValueError, r"does not divide the 6 processes"),
        ({"world_size": 4, "dp_shard": -1, "tp": -1}, ValueError, "only one dimension may be -1"),
        ({"world_size": 4, "tp": 0}, ValueError, r"tp=0 must be a positive int"),
        ({"world_size": 4, "cp": 2}, NotImplementedError, "context parallelism is not available"),
    ],
)
def test_bad_sizes_are_refused_with_the_product_and_the_fix(kwargs: dict, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        ParallelDims(**kwargs)


def test_parallelism_config_has_accelerates_names_and_checks_the_total() -> None:
    config = ParallelismConfig(dp_replicate_size=2, dp_shard_size=2, tp_size=2)
    assert (config.total_size, config.data_parallel_size, config.non_data_parallel_size) == (8, 4, 2)
    assert config.dp_dim_names == ["dp_replicate", "dp_shard"] and config.active_mesh_dims == ["dp_replicate", "dp_shard", "tp"]
    assert config.tp_handler is not None and config.shards
    with pytest.raises(ValueError, match=r"total_size \(2 × 2 × 2 = 8\) does not match num_processes \(4\)"):
        config.resolved(4)
    assert ParallelismConfig().resolved(4).dp_replicate_size == 4  # all sizes 1 on several processes: replicas (DDP)
    with pytest.raises(ValueError, match="dp_shard_size > 1"):
        ParallelismConfig(dp_replicate_size=2, tp_size=2)
    with pytest.raises(NotImplementedError, match="context and sequence parallelism"):
        ParallelismConfig(cp_size=2)


def test_parallelism_config_reads_the_launchers_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARALLELISM_CONFIG_TP_SIZE", "2")
    assert ParallelismConfig().tp_size == 2


def test_a_transformers_model_carries_its_plan() -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2)
    plan = model_plan(transformers.LlamaForCausalLM(config))
    assert plan["model.layers.*.self_attn.q_proj"] == "colwise" and plan["model.layers.*.mlp.down_proj"] == "rowwise"
    assert plan["lm_head"] == "colwise_gather_output"


class _Mesh:
    """Stands in for a DeviceMesh where only its size is read before any split."""

    def size(self) -> int:
        return 2


def test_a_plan_is_required_and_checked_before_anything_is_split() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))
    with pytest.raises(ValueError, match="needs a tensor-parallel plan"):
        apply_tensor_parallel(model, _Mesh(), None)
    with pytest.raises(ValueError, match=r"\['9'\] name no submodule"):
        apply_tensor_parallel(model, _Mesh(), {"0": "colwise", "9": "rowwise"})
    with pytest.raises(ValueError, match="'diagonal' is not a parallel style"):
        apply_tensor_parallel(model, _Mesh(), {"0": "diagonal"})


def test_one_builder_makes_every_mesh_with_its_names() -> None:
    import torch.distributed as dist

    # A fake group on an in-process store: the meshes' shapes and names, no processes and no TCP port to collide on.
    dist.init_process_group("fake", rank=0, world_size=4, store=dist.HashStore())
    try:
        plain = ParallelDims(world_size=4)  # FSDP alone: the one-dimensional mesh fully_shard makes by default
        mesh = plain.build_mesh("cpu")
        assert mesh.mesh_dim_names is None and mesh.size() == 4
        assert plain.fsdp_mesh(mesh) is mesh and plain.data_parallel_mesh(mesh) is mesh
        dims = ParallelDims(world_size=4, dp_shard=2, tp=2)
        mesh = dims.build_mesh("cpu")
        assert mesh.mesh_dim_names == ("dp_replicate", "dp_shard", "tp")
        assert dims.fsdp_mesh(mesh).mesh_dim_names == ("dp_shard",) and dims.data_parallel_mesh(mesh).mesh_dim_names == ("dp",)
        mesh = dims.build_mesh("cpu", lightning_names=True)  # ModelParallelStrategy's, as Lightning names them
        assert mesh.mesh_dim_names == ("data_parallel", "tensor_parallel")
        assert dims.fsdp_mesh(mesh).mesh_dim_names == ("data_parallel",) == dims.data_parallel_mesh(mesh).mesh_dim_names
        hsdp = ParallelDims(world_size=4, dp_replicate=2, dp_shard=2)
        assert hsdp.fsdp_mesh(hsdp.build_mesh("cpu")).mesh_dim_names == ("dp_replicate", "dp_shard")
        with pytest.raises(ValueError, match="no replicate dimension"):
            hsdp.build_mesh("cpu", lightning_names=True)
    finally:
        dist.destroy_process_group()


def test_composable_parallelism_is_a_sharded_strategy_on_a_mesh() -> None:
    from trainer import Accelerator
    from trainer.state import AcceleratorState
    from trainer.utils import FullyShardedDataParallelPlugin

    assert Accelerator(cpu=True).is_composable_parallelism_enabled is False
    AcceleratorState._reset_state(reset_partial_state=True)
    sharded = Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin())  # (one process: a one-process group)
    assert sharded.strategy.sharded and sharded.is_composable_parallelism_enabled is True
    AcceleratorState._reset_state(reset_partial_state=True)
