"""N-D parallelism on 4 real processes (gloo): FSDP × tensor parallel on a 2×2 mesh and HSDP (2 replicas × 2 shards),
in both faces, against one process on the full batch; clip norms, each sample counted once, and sharded checkpoints
loaded onto other meshes.

Every 4-process case runs one job; they are slow on a 2-core machine, so each case checks several things at once.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.helpers.multiprocess import run_distributed

pytestmark = [pytest.mark.distributed]

DATA, BATCH = 32, 8  # 4 global batches of 8 samples: a data-parallel process gets 8 / dp of each


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 4))


MLP_PLAN = {"0": "colwise", "2": "rowwise"}  # the user's plan (names of submodules); the last layer is replicated


def _llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(config)


def _dataset(kind: str) -> torch.utils.data.Dataset:
    g = torch.Generator().manual_seed(1)
    if kind == "llama":
        return torch.utils.data.TensorDataset(torch.randint(0, 64, (DATA, 12), generator=g))
    x = torch.randn(DATA, 16, generator=g)
    return torch.utils.data.TensorDataset(x, x[:, :4].sum(1, keepdim=True).repeat(1, 4))


def _loss(model: nn.Module, batch: Any, kind: str) -> torch.Tensor:
    if kind == "llama":
        return model(input_ids=batch[0], labels=batch[0]).loss
    return F.mse_loss(model(batch[0]), batch[1])


def _accelerator_run(kind: str, sizes: dict[str, int] | None, save_to: str | None = None) -> dict[str, Any]:
    """Train 4 steps (SGD with momentum, clipping at 1.0); return the losses, clip norms, samples gathered, and the full
    weights. (Not Adam: its division by the root of the second moment turns fp32 rounding differences of near-zero
    gradients, which a different reduction order makes, into whole learning-rate steps.)"""
    from trainer import Accelerator, ParallelismConfig

    config = ParallelismConfig(**sizes, tp_plan=MLP_PLAN if kind == "mlp" and sizes.get("tp_size", 1) > 1 else None) if sizes else None
    accelerator = Accelerator(cpu=True, parallelism_config=config)
    model = _llama() if kind == "llama" else _mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    dp = accelerator.strategy.data_parallel_size
    loader = torch.utils.data.DataLoader(_dataset(kind), batch_size=BATCH // dp)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses, norms, seen = [], [], 0
    for batch in loader:
        loss = _loss(model, batch, kind)
        accelerator.backward(loss)
        norms.append(float(accelerator.clip_grad_norm_(model.parameters(), 1.0)))
        optimizer.step()
        optimizer.zero_grad()
        losses.append(accelerator.reduce(loss.detach(), "mean").item())
        seen += len(accelerator.gather_for_metrics(batch[0]))
    if save_to is not None:
        accelerator.save_state(save_to)
    weights = accelerator.get_state_dict(model)
    out = {"losses": losses, "norms": norms, "seen": seen, "tp_rank": accelerator.tensor_parallel_rank if config else 0,
           "weights": {k: v.clone() for k, v in weights.items()} if accelerator.is_main_process else None}
    accelerator.end_training()
    return out


def _assert_close(single: dict[str, Any], many: dict[str, Any], tol: float = 1e-5) -> None:
    assert many["losses"] == pytest.approx(single["losses"], abs=tol)
    assert many["norms"] == pytest.approx(single["norms"], rel=tol)
    want, got = single["weights"], many["weights"]
    assert want.keys() == got.keys()
    worst = max((want[k] - got[k]).abs().max().item() for k in want)
    assert worst < tol, f"weights differ by {worst}"


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    ("kind", "sizes"),
    [("mlp", {"dp_shard_size": 2, "tp_size": 2}), ("mlp", {"dp_replicate_size": 2, "dp_shard_size": 2}),
     ("llama", {"dp_shard_size": 2, "tp_size": 2}), ("llama", {"dp_replicate_size": 2, "dp_shard_size": 2})],
    ids=["mlp-fsdp2xtp2", "mlp-hsdp2x2", "llama-fsdp2xtp2-own-plan", "llama-hsdp2x2"],
)
def test_accelerator_on_a_2x2_mesh_matches_one_process(kind: str, sizes: dict[str, int]) -> None:
    if kind == "llama":
        pytest.importorskip("transformers")
    single = _accelerator_run(kind, None)
    results = run_distributed(_accelerator_run, kind, sizes, nprocs=4, timeout=600)
    _assert_close(single, results[0])
    assert [r["seen"] for r in results] == [DATA] * 4  # gather_for_metrics: each sample once, on every process
    if "tp_size" in sizes:
        assert [r["tp_rank"] for r in results] == [0, 1, 0, 1]


def _load_run(path: str, sizes: dict[str, int] | None) -> dict[str, torch.Tensor] | None:
    """Prepare a fresh MLP on this mesh, load the 2×2 checkpoint at `path`, return the full weights (process 0)."""
    from trainer import Accelerator, ParallelismConfig

    accelerator = Accelerator(cpu=True, parallelism_config=ParallelismConfig(**sizes) if sizes else None)
    torch.manual_seed(123)  # other initial weights: the load must replace them
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.load_state(path)  # resharded, and the data positions are global (no warning since docs/elastic.md)
    weights = accelerator.get_state_dict(model)
    out = {k: v.clone() for k, v in weights.items()} if accelerator.is_main_process else None
    accelerator.end_training()
    return out


@pytest.mark.timeout(900)
def test_a_2x2_checkpoint_loads_onto_2_processes_and_onto_1(tmp_path: Path) -> None:
    saved = run_distributed(_accelerator_run, "mlp", {"dp_shard_size": 2, "tp_size": 2}, str(tmp_path / "ckpt"), nprocs=4, timeout=600)
    want = saved[0]["weights"]
    on_two = run_distributed(_load_run, str(tmp_path / "ckpt"), {"dp_shard_size": 2}, nprocs=2, timeout=300)[0]
    on_one = run_distributed(_load_run, str(tmp_path / "ckpt"), None, nprocs=1, timeout=300)[0]  # no process group sharding
    for got in (on_two, on_one):
        assert got is not None and got.keys() == want.keys()
        assert all(torch.equal(want[k], got[k]) for k in want)


# --------------------------------------------------------------------------------------------- the Trainer face
def _trainer_run(strategy_kind: str, kind: str) -> dict[str, Any]:
    from strategies import FSDPStrategy, ModelParallelStrategy, ParallelDims
    from trainer import Trainer, TrainModule

    class Net(TrainModule):
        def __init__(self, parallelize: bool) -> None:
            super().__init__()
            self.net = _llama() if kind == "llama" else _mlp()
            self.parallelize = parallelize
            self.norms: list[float] = []

        def configure_model(self) -> None:  # Lightning's ModelParallelStrategy contract: the module parallelizes itself
            if not self.parallelize:
                return
            from torch.distributed.fsdp import fully_shard
            from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

            parallelize_module(self.net, self.device_mesh["tensor_parallel"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
            fully_shard(self.net, mesh=self.device_mesh["data_parallel"])

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            loss = _loss(self.net, batch, kind)
            self.log("loss", loss, sync_dist=True)
            return loss

        def on_before_optimizer_step(self, optimizer: Any) -> None:
            self.norms.append(float(self.trainer.strategy.clip_grad_norm_(self.parameters(), 1.0)))

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if strategy_kind == "single":
        strategy: Any = "single"
    elif strategy_kind == "model_parallel":
        strategy = ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=2, cpu=True)
    elif strategy_kind == "fsdp_tp":  # the strategy applies the plan the Llama inside the module carries
        strategy = FSDPStrategy(parallel_dims=ParallelDims(world_size=world, dp_shard=2, tp=2), cpu=True)
    else:
        strategy = FSDPStrategy(parallel_dims=ParallelDims(world_size=world, dp_replicate=2, dp_shard=2), cpu=True)
    module = Net(parallelize=strategy_kind == "model_parallel")
    trainer = Trainer(strategy=strategy, accelerator="cpu", max_epochs=1, log_with=None, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0, log_every_n_steps=1)
    dp = trainer.strategy.data_parallel_size
    trainer.fit(module, torch.utils.data.DataLoader(_dataset(kind), batch_size=BATCH // dp))
    weights = trainer.strategy.module_state_dict(module)
    return {"norms": module.norms, "loss": float(trainer.logged_metrics["loss"]),
            "weights": {k.removeprefix("net."): v.clone() for k, v in weights.items()} if trainer.is_global_zero else None}


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("strategy_kind", "kind"), [("model_parallel", "mlp"), ("hsdp", "mlp"), ("fsdp_tp", "llama"), ("hsdp", "llama")])
def test_trainer_on_a_2x2_mesh_matches_one_process(strategy_kind: str, kind: str) -> None:
    if kind == "llama":
        pytest.importorskip("transformers")
    single = _trainer_run("single", kind)
    many = run_distributed(_trainer_run, strategy_kind, kind, nprocs=4, timeout=600)[0]
    assert many["norms"] == pytest.approx(single["norms"], rel=1e-5)
    assert many["loss"] == pytest.approx(single["loss"], abs=1e-5)  # self.log(sync_dist=True): reduced over the data-parallel group
    worst = max((single["weights"][k] - many["weights"][k]).abs().max().item() for k in single["weights"])
    assert worst < 1e-5, f"weights differ by {worst}"


# ----------------------------------------------------------------------- composing with precision, checkpointing, export
def _composed_run(nd: bool, export: str | None) -> list[float]:
    """Tiny Llama, bf16 mixed precision; on the mesh also activation checkpointing of its decoder blocks (TP → AC → FSDP)."""
    from trainer import Accelerator, FullyShardedDataParallelPlugin, ParallelismConfig

    if nd:
        blocks = FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap", activation_checkpointing=True)
        accelerator = Accelerator(cpu=True, mixed_precision="bf16", parallelism_config=ParallelismConfig(dp_shard_size=2, tp_size=2),
                                  fsdp_plugin=blocks)
    else:
        accelerator = Accelerator(cpu=True, mixed_precision="bf16")
    model = _llama()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(_dataset("llama"), batch_size=BATCH // accelerator.strategy.data_parallel_size)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for (ids,) in loader:
        loss = model(input_ids=ids, labels=ids).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(accelerator.reduce(loss.detach().float(), "mean").item())
    if export is not None:
        accelerator.save_model(model, export)
    accelerator.end_training()
    return losses


@pytest.mark.timeout(900)
def test_tensor_parallel_composes_with_bf16_activation_checkpointing_and_exports_a_plain_model(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from safetensors.torch import load_file

    single = _composed_run(False, None)
    many = run_distributed(_composed_run, True, str(tmp_path / "export"), nprocs=4, timeout=600)[0]
    assert many == pytest.approx(single, abs=1e-3)  # bf16 compute: reduction order shows at the 1e-4 level
    weights = {k: v for f in sorted((tmp_path / "export").glob("*.safetensors")) for k, v in load_file(str(f)).items()}
    plain = _llama()
    assert plain.load_state_dict(weights, strict=True) is not None  # every key, full shapes: a plain model loads it
