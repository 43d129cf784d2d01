"""Raw DeepSpeed ZeRO-2 training and engine checkpoints (run with ``python -m torch.distributed.run --nproc_per_node 2``).

Usage: raw_deepspeed.py RESULT.json STEPS FOLDER. Rank 0 writes the time per step over the steady-state window and
the median time of the engine's ``save_checkpoint`` and ``load_checkpoint`` of model + optimizer into FOLDER.
"""

import datetime
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from benchmarks.fsdp_scripts.model import WIDTH, make_model

WARMUP, SAVES = 10, 3
CONFIG = {"train_micro_batch_size_per_gpu": 32, "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 2},
          "steps_per_print": 2**31 - 1}


def main() -> None:
    result, steps, folder = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    import deepspeed

    rank, world = dist.get_rank(), dist.get_world_size()
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=CONFIG, dist_init_required=False)
    n = (WARMUP + steps + 1) * 32 * world
    data = TensorDataset(torch.randn(n, WIDTH), torch.randint(0, 10, (n,)))
    loader = DataLoader(data, batch_size=32, sampler=DistributedSampler(data, shuffle=False))
    t0 = t1 = 0.0
    for i, (x, y) in enumerate(loader):
        engine.backward(F.cross_entropy(engine(x), y))
        engine.step()
        if i == WARMUP:
            t0 = time.perf_counter()
        elif i == WARMUP + steps:
            t1 = time.perf_counter()
    saves, loads = [], []
    for k in range(SAVES):
        dist.barrier()
        begin = time.perf_counter()
        engine.save_checkpoint(f"{folder}/raw{k}", tag="state")
        dist.barrier()
        saves.append(time.perf_counter() - begin)
        begin = time.perf_counter()
        engine.load_checkpoint(f"{folder}/raw{k}", tag="state")
        dist.barrier()
        loads.append(time.perf_counter() - begin)
    if rank == 0:
        with open(result, "w") as handle:
            json.dump({"per_step": (t1 - t0) / steps, "save": statistics.median(saves), "load": statistics.median(loads)}, handle)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
