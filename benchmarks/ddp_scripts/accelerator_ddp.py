"""The same DDP training written for the Accelerator (run with ``trainer launch --num_processes 2``).

Usage: accelerator_ddp.py RESULT.json STEPS. Rank 0 writes the wall-clock time of its first finished step
and the time per step over the steady-state window.
"""

import json
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainer import Accelerator

WARMUP = 10


def main() -> None:
    result, steps = sys.argv[1], int(sys.argv[2])
    accelerator = Accelerator(process_group_timeout=60)
    world = accelerator.num_processes
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    n = (WARMUP + steps + 1) * 32 * world
    data = TensorDataset(torch.randn(n, 32), torch.randint(0, 10, (n,)))
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data, batch_size=32))
    first = t0 = t1 = 0.0
    for i, (x, y) in enumerate(loader):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        accelerator.backward(loss)
        optimizer.step()
        if i == 0:
            first = time.time()
        elif i == WARMUP:
            t0 = time.perf_counter()
        elif i == WARMUP + steps:
            t1 = time.perf_counter()
    if accelerator.is_main_process:
        with open(result, "w") as handle:
            json.dump({"first_step": first, "per_step": (t1 - t0) / steps}, handle)
    accelerator.end_training()
    accelerator.teardown()


if __name__ == "__main__":
    main()
