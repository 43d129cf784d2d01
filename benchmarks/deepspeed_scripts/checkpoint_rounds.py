"""DeepSpeed checkpoints against the engine's own, in the same job (run with ``trainer launch --num_processes 2 --cpu``).

Usage: checkpoint_rounds.py RESULT.json ROUNDS FOLDER [WIDTH LAYERS]. Without WIDTH and LAYERS the model is the FSDP
benchmark's (~2.1 M parameters, a ~35 MB checkpoint, where fixed costs dominate); with them, LAYERS Linear(WIDTH, WIDTH)
layers (1024 and 24: 25 M parameters, a ~400 MB checkpoint: the model states and the fp32 partitions with Adam's two
moments). Each round saves the same ZeRO-2 engine four ways: with the
engine's own ``save_checkpoint`` (which flushes nothing to disk), the same followed by an fsync of its files, with ``save_state`` of ``DeepSpeedStrategy(export_weights=False)`` (the engine's files,
hashed while written, plus RNG states, data positions and the manifest) and with the default ``save_state`` (also the
consolidated ``model.safetensors``); then loads each the same way (``load_checkpoint``; ``load_state`` with every file's
digest checked). The order rotates between rounds; every timing ends at a barrier. Rank 0 writes the times.
"""

import json
import os
import shutil
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from benchmarks.fsdp_scripts.model import WIDTH, make_model
from strategies import DeepSpeedStrategy
from trainer import Accelerator

SIDES = ("raw", "synced", "lean", "full")  # the engine's own, then with its files flushed; save_state without and with
# the consolidated weights


def _flush(folder: str) -> None:
    """fsync every file under `folder`, then the folders (what ours does before it commits), each process its own files."""
    rank = dist.get_rank()
    for root, _dirs, files in os.walk(folder):
        for name in files:
            mine = f"pp_rank_{rank}_" in name if "pp_rank_" in name else rank == 0  # (as ours: each its own)
            if not mine:
                continue
            with open(os.path.join(root, name), "rb") as handle:
                os.fsync(handle.fileno())
        descriptor = os.open(root, os.O_RDONLY)
        os.fsync(descriptor)
        os.close(descriptor)


def _layers(width: int, layers: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(*(nn.Linear(width, width) for _ in range(layers)))


def main() -> None:
    result, rounds, folder = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    strategy = DeepSpeedStrategy(zero_stage=2, timeout=60)
    accelerator = Accelerator(strategy=strategy)
    width = int(sys.argv[4]) if len(sys.argv) > 4 else WIDTH
    model = make_model() if len(sys.argv) <= 4 else _layers(width, int(sys.argv[5]))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, optimizer = accelerator.prepare(model, optimizer)
    x, y = torch.randn(32, width), torch.randint(0, 10, (32,))
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
        if side in ("raw", "synced"):
            engine.save_checkpoint(path, tag="state")
            if side == "synced":
                _flush(path)
        else:
            strategy.export_weights = side == "full"
            accelerator.save_state(path)

    def load(side: str, path: str) -> None:
        if side in ("raw", "synced"):
            engine.load_checkpoint(path, tag="state")
        else:
            accelerator.load_state(path)

    times: dict[str, list[float]] = {f"{side}_{kind}": [] for side in SIDES for kind in ("save", "load")}
    for r in range(rounds):
        for side in SIDES[r % len(SIDES) :] + SIDES[: r % len(SIDES)]:
            path = f"{folder}/{side}{r}"
            times[f"{side}_save"].append(timed(lambda: save(side, path)))  # noqa: B023  (called at once)
            times[f"{side}_load"].append(timed(lambda: load(side, path)))  # noqa: B023
            dist.barrier()
            if accelerator.is_main_process:  # (a large state: one checkpoint on disk at a time)
                shutil.rmtree(path)
    if accelerator.is_main_process:
        with open(result, "w") as handle:
            json.dump(times, handle)
    accelerator.end_training()


if __name__ == "__main__":
    main()
