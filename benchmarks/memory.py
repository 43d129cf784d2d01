"""Peak host memory per process of FSDP2 on 2 processes, ~100 M parameters: empty (meta) init against building whole.

Each phase runs in a fresh torchrun process pair (``ru_maxrss`` is a high-water mark, so an earlier phase would mask
a later one) and is measured inside each process, above that process's own baseline (after imports, joining the
process group and a warm-up of the same code path on a tiny model; `benchmarks/scale_scripts/memory_worker.py`):

* *build and shard*: ``with accelerator.init_module(): model = TinyLM(...)`` (meta device), ``prepare`` (shards, then
  each process initializes only its shards) — against today's path, the model built whole on every process, then
  prepared. Stopped before the first step. Compared with the full fp32 model (params × 4 B).
* *after AdamW steps*: the same, then a few AdamW steps. Compared with the full training state (weights + gradients +
  two AdamW moments, 16 B per parameter).

The CPU allocator matters here. glibc keeps freed memory of its heap resident (the mmap threshold rises after a large
free), so FSDP2's all-gathered parameters, freed after each block, leave holes that later allocations of other sizes
do not fill, and resident memory grows past the live tensors. The first table runs with
``MALLOC_MMAP_THRESHOLD_=131072`` (a fixed threshold: every allocation of 128 KiB or more gets its own mapping and is
returned on free), so resident memory follows the live tensors, as a GPU's caching allocator would; the full run
repeats everything with glibc's defaults.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import Row, Section, repo_env
from benchmarks.ddp import _free_port
from benchmarks.scale_scripts.tiny_lm import MEMORY

TARGET = 0.6
FIXED_MMAP = {"MALLOC_MMAP_THRESHOLD_": "131072"}
CONTENDERS = {"meta": "ours: init_module() (meta), prepare", "full": "today: built whole on each process, prepare"}


def measure(init: str, phase: str, steps: int, env: dict[str, str], folder: Path) -> list[dict[str, float]]:
    """Launch one process pair for one phase; return each process's measurements (rank order)."""
    prefix = folder / f"{init}-{phase}"
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(_free_port()),
               "-m", "benchmarks.scale_scripts.memory_worker", str(prefix), init, phase, str(steps)]
    done = subprocess.run(command, env=repo_env(OMP_NUM_THREADS="1", TRAINWRIGHT_PG_TIMEOUT="300", **env), cwd="/",
                          capture_output=True, text=True, timeout=1200)
    files = [Path(f"{prefix}.{rank}.json") for rank in range(2)]
    if done.returncode != 0 or not all(f.exists() for f in files):
        raise RuntimeError(f"{' '.join(command)} failed with exit code {done.returncode}:\n{done.stderr[-3000:]}")
    values = [json.loads(f.read_text()) for f in files]
    for f in files:
        f.unlink()
    return values


def run(*, quick: bool) -> list[Section]:
    steps = 2 if quick else 3
    allocators = {"fixed mmap threshold": FIXED_MMAP} if quick else {"fixed mmap threshold": FIXED_MMAP, "glibc defaults": {}}
    folder = Path(tempfile.mkdtemp(prefix="bench-memory-"))
    sections = []
    try:
        for allocator, env in allocators.items():
            results = {(init, phase): measure(init, phase, steps, env, folder) for phase in ("build", "steps") for init in CONTENDERS}
            sections += _sections(results, allocator, steps)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return sections


def _sections(results: dict[tuple[str, str], list[dict[str, float]]], allocator: str, steps: int) -> list[Section]:
    params = int(results["meta", "build"][0]["params"])
    model_bytes, state_bytes = 4 * params, 16 * params
    tables = {
        "build": Section(f"Peak host memory per process, build and shard ({allocator})", "full fp32 model"),
        "steps": Section(f"Peak host memory per process, after {steps} AdamW steps ({allocator})", "full training state"),
    }
    for phase, section in tables.items():
        full = model_bytes if phase == "build" else state_bytes
        for init, label in CONTENDERS.items():
            for rank, values in enumerate(results[init, phase]):
                grown = values["peak"] - values["baseline"]
                row = Row(f"{label}, process {rank}", "MB", times=[grown / 1e6], ratios=[grown / full])
                row.target = f"≤ {TARGET}" if init == "meta" else ""
                section.rows.append(row)
    warm = statistics.median(v["baseline"] - v["cold"] for values in results.values() for v in values)
    base = statistics.median(v["baseline"] for values in results.values() for v in values)
    local = int(results["meta", "build"][0]["local_params"])
    tables["build"].notes += [
        (f"{MEMORY.describe()}; 2 processes (gloo, FSDP2, each block its own unit, 1 thread each). Full fp32 model "
        f"{model_bytes / 1e6:.0f} MB; each process's shard {local / 1e6:.1f} M params ({4 * local / 1e6:.0f} MB)."),
        (f"MB above each process's baseline ({base / 1e6:.0f} MB resident after imports, the process group and a warm-up of the "
        f"same path on a tiny model; the warm-up itself, mostly modules FSDP2/DTensor import on first use, {warm / 1e6:.0f} MB). "
        "Each phase is a fresh process pair."),
        _checksum_note(results),
    ]
    tables["steps"].notes += [
        (f"Full training state {state_bytes / 1e6:.0f} MB (16 B/param: weights, gradients, AdamW's two moments); each process "
        f"holds half of it when sharded, plus its own activations (batch {MEMORY.batch} × {MEMORY.seq} tokens, no activation "
        "checkpointing) and one block's gathered parameters and gradients at a time."),
        _loss_note(results),
    ]
    return [tables["build"], tables["steps"]]


def _checksum_note(results: dict[tuple[str, str], list[dict[str, float]]]) -> str:
    ours, today = results["meta", "build"][0]["checksum"], results["full", "build"][0]["checksum"]
    if ours == today:
        return ("The meta-initialized, sharded weights equal the seeded whole-model build's: per-tensor checksums of the "
                "shards, summed over the processes, identical (checked).")
    return "CHECK FAILED: the meta-initialized weights differ from the seeded whole-model build's (per-tensor checksums differ)."


def _loss_note(results: dict[tuple[str, str], list[dict[str, float]]]) -> str:
    ours = [v["losses"] for v in results["meta", "steps"]]
    today = [v["losses"] for v in results["full", "steps"]]
    if ours == today:
        return "Both paths give the same losses at every step on every process (checked)."
    return f"CHECK FAILED: the losses differ between the two paths: ours {ours}, today {today}."
