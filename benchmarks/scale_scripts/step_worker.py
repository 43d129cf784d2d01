"""FSDP2 + activation checkpointing + regional compile, ours against the raw torchtitan-style loop, in one process pair.

Usage (2 processes): python -m torch.distributed.run --nproc_per_node 2 -m benchmarks.scale_scripts.step_worker
RESULT.json BACKEND ROUNDS STEPS WARMUP. Both setups, and a second raw one (the noise control), live in the same processes
(so each compiles once): after WARMUP steps of each (compilation), every round times STEPS steps of each, the order
rotating from round to round.
Rank 0 writes the seconds per step of each per round (wall clock and its CPU time), the warm-up losses, and how many
of ours' blocks run a compiled forward.
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

from benchmarks.scale_scripts.tiny_lm import (
    SMALL,
    accelerator_setup,
    accelerator_step,
    compiled_blocks,
    make_batches,
    raw_setup,
    raw_step,
    timed_rounds,
    warm_up,
)


def main() -> None:
    result, backend, rounds, steps, warmup = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    torch.set_num_threads(1)
    accelerator, model, optimizer = accelerator_setup(SMALL, cpu=True, compile_backend=backend)
    raw_model, raw_optimizer = raw_setup(SMALL, accelerator.strategy.mesh, compile_backend=backend)
    again_model, again_optimizer = raw_setup(SMALL, accelerator.strategy.mesh, compile_backend=backend)  # the noise control
    batches = make_batches(SMALL, warmup + steps, rank=dist.get_rank())
    contenders = {
        "ours": lambda x, y: accelerator_step(accelerator, model, optimizer, x, y),
        "raw": lambda x, y: raw_step(raw_model, raw_optimizer, x, y),
        "raw_again": lambda x, y: raw_step(again_model, again_optimizer, x, y),
    }
    losses, warmup_s = warm_up(contenders, batches[:warmup])
    times, cpu = timed_rounds(contenders, batches[warmup:], rounds, sync=dist.barrier)
    if dist.get_rank() == 0:
        with open(result, "w") as handle:
            json.dump({"times": times, "cpu": cpu, "losses": losses, "warmup_s": warmup_s, "compiled": compiled_blocks(model), "blocks": SMALL.layers}, handle)
    accelerator.end_training()
    accelerator.teardown()


if __name__ == "__main__":
    main()
