"""FSDP × tensor parallel step on a 2-D mesh: the Accelerator (``ParallelismConfig(dp_shard_size=N/2, tp_size=2)``)
against a raw ``parallelize_module`` + ``fully_shard`` loop, in the same job (``trainer launch --num_processes 4 --cpu``
or torchrun on GPUs).

Usage: tp_rounds.py RESULT.json ROUNDS STEPS. Both build the same MLP blocks from the same seed with the same plan
(up-projection column-wise, down-projection row-wise) and train on the same batches; rounds alternate which goes
first, each timed between barriers. Rank 0 writes both sides' seconds per step and their first losses.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from benchmarks.rounds import WIDTH, Block, alternating_rounds

BLOCKS, BATCH = 4, 16


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*(Block() for _ in range(BLOCKS)))


PLAN = {"*.up": "colwise", "*.down": "rowwise"}


def raw_setup(mesh: Any) -> tuple[nn.Module, torch.optim.Optimizer]:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    model = make_model().to(mesh.device_type)
    parallelize_module(model, mesh["tp"], {"*.up": ColwiseParallel(), "*.down": RowwiseParallel()})
    for block in model:
        fully_shard(block, mesh=mesh["dp_shard"])
    fully_shard(model, mesh=mesh["dp_shard"])
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def main() -> None:
    from torch.distributed.device_mesh import init_device_mesh

    from trainer import Accelerator, FullyShardedDataParallelPlugin, ParallelismConfig

    result, rounds, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    blocks = FullyShardedDataParallelPlugin(auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap=["Block"])
    accelerator = Accelerator(parallelism_config=ParallelismConfig(dp_shard_size=int(os.environ["WORLD_SIZE"]) // 2,
                                                                   tp_size=2, tp_plan=PLAN), fsdp_plugin=blocks)
    plain = make_model()
    model, optimizer = accelerator.prepare(plain, torch.optim.AdamW(plain.parameters(), lr=1e-3))
    device = accelerator.device
    mesh = init_device_mesh(device.type, (dist.get_world_size() // 2, 2), mesh_dim_names=("dp_shard", "tp"))
    raw_model, raw_optimizer = raw_setup(mesh)
    dp_rank = accelerator.strategy.data_parallel_rank
    g = torch.Generator().manual_seed(dp_rank)
    batches = [torch.randn(BATCH, WIDTH, generator=g).to(device) for _ in range(8)]

    def ours(x: torch.Tensor) -> torch.Tensor:
        loss = model(x).square().mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        return loss

    def raw(x: torch.Tensor) -> torch.Tensor:
        loss = raw_model(x).square().mean()
        loss.backward()
        raw_optimizer.step()
        raw_optimizer.zero_grad()
        return loss

    first = {"ours": ours(batches[0]).item(), "raw": raw(batches[0]).item()}
    for _ in range(3):
        ours(batches[1]), raw(batches[1])
    times = alternating_rounds(ours, raw, batches, rounds, steps, device)
    if accelerator.is_main_process:
        with open(result, "w") as handle:
            json.dump({"times": times, "first_loss": first}, handle)
    accelerator.end_training()


if __name__ == "__main__":
    main()
