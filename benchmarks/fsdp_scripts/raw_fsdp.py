"""Raw PyTorch FSDP2 training and DCP checkpoints (run with ``python -m torch.distributed.run --nproc_per_node 2``).

Usage: raw_fsdp.py RESULT.json STEPS FOLDER. Rank 0 writes the time per step over the steady-state window and
the median time of a sharded save (`dcp.save`) and load (`dcp.load`) of model + optimizer into FOLDER.
"""

import datetime
import json
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from benchmarks.fsdp_scripts.model import WIDTH, Block, make_model

WARMUP, SAVES = 10, 3


def main() -> None:
    result, steps, folder = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    model = make_model()
    for module in model.modules():
        if isinstance(module, Block):
            fully_shard(module, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    n = (WARMUP + steps + 1) * 32 * world
    data = TensorDataset(torch.randn(n, WIDTH), torch.randint(0, 10, (n,)))
    loader = DataLoader(data, batch_size=32, sampler=DistributedSampler(data, shuffle=False))
    t0 = t1 = 0.0
    for i, (x, y) in enumerate(loader):
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()
        if i == WARMUP:
            t0 = time.perf_counter()
        elif i == WARMUP + steps:
            t1 = time.perf_counter()
    saves, loads = [], []
    for k in range(SAVES):
        dist.barrier()
        begin = time.perf_counter()
        msd, osd = get_state_dict(model, optimizer)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=f"{folder}/raw{k}")
        dist.barrier()
        saves.append(time.perf_counter() - begin)
        begin = time.perf_counter()
        msd, osd = get_state_dict(model, optimizer)
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=f"{folder}/raw{k}")
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
        dist.barrier()
        loads.append(time.perf_counter() - begin)
    if rank == 0:
        with open(result, "w") as handle:
            json.dump({"per_step": (t1 - t0) / steps, "save": statistics.median(saves), "load": statistics.median(loads)}, handle)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
