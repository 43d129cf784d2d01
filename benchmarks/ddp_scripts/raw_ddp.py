"""Raw PyTorch DDP training (run with ``python -m torch.distributed.run --nproc_per_node 2``).

Usage: raw_ddp.py RESULT.json STEPS. Rank 0 writes the wall-clock time of its first finished step and the
time per step over the steady-state window.
"""

import datetime
import json
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

WARMUP = 10


def main() -> None:
    result, steps = sys.argv[1], int(sys.argv[2])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    n = (WARMUP + steps + 1) * 32 * world
    data = TensorDataset(torch.randn(n, 32), torch.randint(0, 10, (n,)))
    loader = DataLoader(data, batch_size=32, sampler=DistributedSampler(data, shuffle=False))
    first = t0 = t1 = 0.0
    for i, (x, y) in enumerate(loader):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        if i == 0:
            first = time.time()
        elif i == WARMUP:
            t0 = time.perf_counter()
        elif i == WARMUP + steps:
            t1 = time.perf_counter()
    if rank == 0:
        with open(result, "w") as handle:
            json.dump({"first_step": first, "per_step": (t1 - t0) / steps}, handle)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
