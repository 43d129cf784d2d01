"""The same FSDP2 training written for the Accelerator (run with ``trainer launch --num_processes 2 --strategy fsdp``).

Usage: accelerator_fsdp.py RESULT.json STEPS FOLDER. Rank 0 writes the time per step over the steady-state
window and the median time of `save_state` (sharded, with the manifest) and `load_state` into FOLDER.
"""

import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.fsdp_scripts.model import WIDTH, Block, make_model
from strategies import FSDPStrategy, Strategy
from trainer import Accelerator

WARMUP, SAVES = 10, 3


def main(strategy: Strategy | None = None) -> None:
    """Train, save and load with `strategy` (default: FSDP2, each block its own unit); the DeepSpeed benchmark reuses it."""
    result, steps, folder = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    accelerator = Accelerator(strategy=strategy or FSDPStrategy(wrap_classes=[Block], timeout=60))
    world = accelerator.num_processes
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    n = (WARMUP + steps + 1) * 32 * world
    data = TensorDataset(torch.randn(n, WIDTH), torch.randint(0, 10, (n,)))
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data, batch_size=32))
    t0 = t1 = 0.0
    for i, (x, y) in enumerate(loader):
        optimizer.zero_grad()
        accelerator.backward(F.cross_entropy(model(x), y))
        optimizer.step()
        if i == WARMUP:
            t0 = time.perf_counter()
        elif i == WARMUP + steps:
            t1 = time.perf_counter()
    saves, loads = [], []
    for k in range(SAVES):
        accelerator.wait_for_everyone()
        begin = time.perf_counter()
        accelerator.save_state(f"{folder}/ours{k}")
        saves.append(time.perf_counter() - begin)
        begin = time.perf_counter()
        accelerator.load_state(f"{folder}/ours{k}")
        accelerator.wait_for_everyone()
        loads.append(time.perf_counter() - begin)
    if accelerator.is_main_process:
        with open(result, "w") as handle:
            json.dump({"per_step": (t1 - t0) / steps, "save": statistics.median(saves), "load": statistics.median(loads)}, handle)
    accelerator.end_training()
    accelerator.teardown()


if __name__ == "__main__":
    main()
