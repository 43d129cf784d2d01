"""DeepSpeed checkpoints against the engine's own, in the same job (run with ``trainer launch --num_processes 2 --cpu``).

Usage: checkpoint_rounds.py RESULT.json ROUNDS FOLDER. Each round saves the same ZeRO-2 engine three ways: with the
engine's own ``save_checkpoint``, with ``save_state`` of ``DeepSpeedStrategy(export_weights=False)`` (the engine's files,
hashed while written, plus RNG states, data positions and the manifest) and with the default ``save_state`` (also the
consolidated ``model.safetensors``); then loads each the same way (``load_checkpoint``; ``load_state`` with every file's
digest checked). The order rotates between rounds; every timing ends at a barrier. Rank 0 writes the times.
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

SIDES = ("raw", "lean", "full")  # the engine's own; save_state without and with the consolidated weights


def main() -> None:
    result, rounds, folder = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    strategy = DeepSpeedStrategy(zero_stage=2, timeout=60)
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

    def save(side: str, path: str) -> None:
        if side == "raw":
            engine.save_checkpoint(path, tag="state")
        else:
            strategy.export_weights = side == "full"
            accelerator.save_state(path)

    def load(side: str, path: str) -> None:
        if side == "raw":
            engine.load_checkpoint(path, tag="state")
        else:
            accelerator.load_state(path)

    times: dict[str, list[float]] = {f"{side}_{kind}": [] for side in SIDES for kind in ("save", "load")}
    for r in range(rounds):
        for side in SIDES[r % 3 :] + SIDES[: r % 3]:
            path = f"{folder}/{side}{r}"
            times[f"{side}_save"].append(timed(lambda: save(side, path)))  # noqa: B023  (called at once)
            times[f"{side}_load"].append(timed(lambda: load(side, path)))  # noqa: B023
    if accelerator.is_main_process:
        with open(result, "w") as handle:
            json.dump(times, handle)
    accelerator.end_training()


if __name__ == "__main__":
    main()
