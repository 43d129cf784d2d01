"""DeepSpeed checkpoints against the engine's own in the same job (run with ``trainer launch --num_processes 2 --cpu``).

Usage: checkpoint_rounds.py RESULT.json ROUNDS FOLDER [--no-export]. Each round saves the same ZeRO-2 engine with
its own ``save_checkpoint`` and with ``save_state``, then loads it with the engine's ``load_checkpoint`` and with
``load_state`` (every file's digest checked), the order alternating between rounds; every timing ends at a barrier.
``--no-export`` saves without the consolidated ``model.safetensors`` (``DeepSpeedStrategy(export_weights=False)``).
Rank 0 writes the times.
"""

import json
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from benchmarks.fsdp_scripts.model import WIDTH, make_model
from strategies import DeepSpeedStrategy
from trainer import Accelerator


def main() -> None:
    result, rounds, folder = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    export = "--no-export" not in sys.argv[4:]
    strategy = DeepSpeedStrategy(zero_stage=2, timeout=60, **({} if export else {"export_weights": False}))
    accelerator = Accelerator(strategy=strategy)
    model = make_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    x, y = torch.randn(32, WIDTH), torch.randint(0, 10, (32,))
    for _ in range(3):  # the optimizer state exists
        optimizer.zero_grad()
        accelerator.backward(F.cross_entropy(model(x), y))
        optimizer.step()
    engine = strategy.engine

    def timed(work: object) -> float:
        dist.barrier()
        begin = time.perf_counter()
        work()  # type: ignore[operator]
        dist.barrier()
        return time.perf_counter() - begin

    def raw_save(path: str) -> None:
        engine.save_checkpoint(path, tag="state")

    def raw_load(path: str) -> None:
        engine.load_checkpoint(path, tag="state")

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
