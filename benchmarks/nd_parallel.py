"""FSDP × tensor parallel on 4 processes (a 2×2 mesh): the Accelerator's step against a raw ``parallelize_module`` +
``fully_shard`` loop with the same plan, model and batches, in the same job (`benchmarks/nd_scripts/tp_rounds.py`)."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

from benchmarks.common import Row, Section, repo_env
from benchmarks.ddp import _trainer_command


def run(*, quick: bool) -> list[Section]:
    rounds, steps = (4, 10) if quick else (8, 30)
    folder = Path(tempfile.mkdtemp(prefix="bench-nd-"))
    result = folder / "result.json"
    command = [*_trainer_command(), "launch", "--num_processes", "4", "--cpu", "-m", "benchmarks.nd_scripts.tp_rounds",
               str(result), str(rounds), str(steps)]
    try:
        done = subprocess.run(command, env=repo_env(OMP_NUM_THREADS="1"), cwd="/", capture_output=True, text=True, timeout=900)
        if done.returncode != 0 or not result.exists():
            raise RuntimeError(f"{' '.join(command)} failed with exit code {done.returncode}:\n{done.stderr[-3000:]}")
        measured = json.loads(result.read_text())
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    raw, ours = [t * 1e3 for t in measured["times"]["raw"]], [t * 1e3 for t in measured["times"]["ours"]]
    rows = [Row("raw parallelize_module + fully_shard", "ms/step", raw, [1.0] * len(raw)),
            Row("Accelerator(parallelism_config=ParallelismConfig(dp_shard_size=2, tp_size=2))", "ms/step", ours,
                [o / r for o, r in zip(ours, raw)], target="≤ 1.05")]
    first = measured["first_loss"]
    note = (f"4 processes (gloo, 1 thread each) on a 2×2 mesh: 4 residual MLP blocks 256→1024→256 (up column-wise, down "
            f"row-wise, each block its own FSDP unit), AdamW, batch 16 per data-parallel process; {rounds} rounds of {steps} "
            f"steps alternating which goes first. First loss: ours {first['ours']:.7f}, raw {first['raw']:.7f}.")
    return [Section("FSDP × tensor parallel, 4 processes — time per step", "raw", rows, [note])]
