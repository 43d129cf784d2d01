"""Sharded checkpoints against raw DCP in the same job (run with ``trainer launch --num_processes 2 --cpu``).

Usage: checkpoint_rounds.py RESULT.json ROUNDS FOLDER. Each round saves the same FSDP2 model and AdamW state with
raw ``dcp.save`` and with ``save_state``, then loads it with raw ``dcp.load`` and with ``load_state`` (every file's
digest checked), the order alternating between rounds; every timing ends at a barrier. Rank 0 writes the times.
Measured in one job, both sides see the same machine load, which separate jobs on a busy machine do not.
"""

import json
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from benchmarks.fsdp_scripts.model import WIDTH, Block, make_model
from strategies import FSDPStrategy
from trainer import Accelerator


def main() -> None:
    result, rounds, folder = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    accelerator = Accelerator(strategy=FSDPStrategy(wrap_classes=[Block], timeout=60))
    model = make_model()
    prepared_optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, prepared_optimizer = accelerator.prepare(model, prepared_optimizer)
    optimizer = prepared_optimizer.optimizer
    x, y = torch.randn(32, WIDTH), torch.randint(0, 10, (32,))
    for _ in range(3):  # the optimizer state exists
        prepared_optimizer.zero_grad()
        accelerator.backward(F.cross_entropy(model(x), y))
        prepared_optimizer.step()

    def timed(work: object) -> float:
        dist.barrier()
        begin = time.perf_counter()
        work()  # type: ignore[operator]
        dist.barrier()
        return time.perf_counter() - begin

    def raw_save(path: str) -> None:
        msd, osd = get_state_dict(model, optimizer)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=path)

    def raw_load(path: str) -> None:
        msd, osd = get_state_dict(model, optimizer)
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=path)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])

    times: dict[str, list[float]] = {"raw_save": [], "ours_save": [], "raw_load": [], "ours_load": []}
    for r in range(rounds):
        sides = [("raw", raw_save, raw_load), ("ours", accelerator.save_state, accelerator.load_state)]
        for name, save, load in sides if r % 2 == 0 else sides[::-1]:
            path = f"{folder}/{name}{r}"
            times[f"{name}_save"].append(timed(lambda: save(path)))  # noqa: B023  (called at once)
            times[f"{name}_load"].append(timed(lambda: load(path)))  # noqa: B023
    if accelerator.is_main_process:
        with open(result, "w") as handle:
            json.dump(times, handle)
    accelerator.end_training()


if __name__ == "__main__":
    main()
