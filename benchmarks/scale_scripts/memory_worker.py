"""Peak host memory of one phase of FSDP2 training on 2 processes, measured inside each process.

Usage: python -m torch.distributed.run --nproc_per_node 2 -m benchmarks.scale_scripts.memory_worker RESULT_PREFIX
INIT PHASE STEPS, where INIT is ``meta`` (ours: built inside ``accelerator.init_module()`` on the meta device, sharded
by ``prepare``, each process initializing only its shards) or ``full`` (today's path: the model built whole on every
process, then prepared), and PHASE is ``build`` (stop after ``prepare``, before the first step) or ``steps`` (then STEPS
AdamW steps). Each process writes RESULT_PREFIX.<rank>.json: its baseline, its peak at the end, its current RSS and a
checksum of the weights after ``prepare``. ``ru_maxrss`` only rises, so each phase runs in a fresh process pair.

The baseline is ``ru_maxrss`` after imports and joining the process group, before the model is built. "Imports"
includes those the path makes on first use: FSDP2, DTensor and the meta device import about 800 modules (~80 MB)
the first time a model is prepared. So before the baseline each process builds, prepares and steps a tiny model of the
same class through the same path (`load_lazy_imports`); its cost (``baseline - cold``) is reported apart from the model's.
"""

from __future__ import annotations

import gc
import json
import resource
import sys

import torch

from benchmarks.scale_scripts.tiny_lm import MEMORY, Block, LMConfig, TinyLM, accelerator_step, local_checksum, make_batches
from strategies import FSDPStrategy
from trainer import Accelerator


def peak_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux


def current_bytes() -> int:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * resource.getpagesize()


def build(accelerator: Accelerator, cfg: LMConfig, empty: bool) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    with accelerator.init_module(empty_init=empty):
        model = TinyLM(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return accelerator.prepare(model, optimizer)


def load_lazy_imports(accelerator: Accelerator, empty: bool) -> None:
    """One step of a tiny model through the same path: the modules imported on first use are loaded before the baseline."""
    tiny = LMConfig(vocab=8, dim=8, layers=2, heads=2, seq=4, batch=2)
    model, optimizer = build(accelerator, tiny, empty)
    x, y = make_batches(tiny, 1, rank=accelerator.process_index)[0]
    accelerator_step(accelerator, model, optimizer, x, y)
    accelerator.free_memory()  # the accelerator keeps what it prepared; this model is not wanted after the warm-up


def main() -> None:
    prefix, init, phase, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    if init not in ("meta", "full") or phase not in ("build", "steps"):
        raise SystemExit(f"INIT must be meta or full and PHASE build or steps, got {init!r} {phase!r}")
    torch.set_num_threads(1)
    accelerator = Accelerator(strategy=FSDPStrategy(cpu=True, wrap_classes=[Block]))
    batches = make_batches(MEMORY, max(steps, 1), rank=accelerator.process_index)
    accelerator.wait_for_everyone()
    gc.collect()
    cold = peak_bytes()
    load_lazy_imports(accelerator, init == "meta")
    gc.collect()
    baseline = peak_bytes()
    model, optimizer = build(accelerator, MEMORY, init == "meta")
    gc.collect()
    built = peak_bytes()
    losses = []
    if phase == "steps":
        for x, y in batches[:steps]:
            losses.append(float(accelerator_step(accelerator, model, optimizer, x, y)))
        gc.collect()
    peak, current = peak_bytes(), current_bytes()
    checksum = local_checksum(model) if phase == "build" else torch.zeros(1, 3, dtype=torch.float64)
    torch.distributed.all_reduce(checksum)
    local = sum(p.to_local().numel() for p in model.parameters())
    with open(f"{prefix}.{accelerator.process_index}.json", "w") as handle:
        json.dump({"cold": cold, "baseline": baseline, "built": built, "peak": peak, "current": current, "params": MEMORY.params,
                   "local_params": local, "checksum": checksum.tolist(), "losses": losses}, handle)
    accelerator.end_training()
    accelerator.teardown()


if __name__ == "__main__":
    main()
