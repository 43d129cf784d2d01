"""Pipeline stages on 2 processes: the Accelerator's ``pipeline_step`` against a raw `torch.distributed.pipelining` loop
(the same blocks, schedule and batches) in the same job, for 1F1B and ZBVZeroBubble (`benchmarks/pipeline_scripts/pp_rounds.py`)."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

from benchmarks.common import Row, Section, repo_env
from benchmarks.ddp import _trainer_command


def _measure(schedule: str, rounds: int, steps: int, folder: Path) -> dict:
    result = folder / f"{schedule}.json"
    command = [*_trainer_command(), "launch", "--num_processes", "2", "--cpu", "-m", "benchmarks.pipeline_scripts.pp_rounds",
               str(result), schedule, str(rounds), str(steps)]
    done = subprocess.run(command, env=repo_env(OMP_NUM_THREADS="1"), cwd="/", capture_output=True, text=True, timeout=900)
    if done.returncode != 0 or not result.exists():
        raise RuntimeError(f"{' '.join(command)} failed with exit code {done.returncode}:\n{done.stderr[-3000:]}")
    return json.loads(result.read_text())


def run(*, quick: bool) -> list[Section]:
    rounds, steps = (4, 10) if quick else (8, 30)
    folder = Path(tempfile.mkdtemp(prefix="bench-pp-"))
    rows, notes = [], []
    try:
        for schedule in ("1F1B", "ZBVZeroBubble"):
            measured = _measure(schedule, rounds, steps, folder)
            raw, ours = [t * 1e3 for t in measured["times"]["raw"]], [t * 1e3 for t in measured["times"]["ours"]]
            rows += [Row(f"raw torch.distributed.pipelining, {schedule}", "ms/step", raw, [1.0] * len(raw)),
                     Row(f"accelerator.pipeline_step, {schedule}", "ms/step", ours, [o / r for o, r in zip(ours, raw)], target="≤ 1.05")]
            first = measured["first_loss"]
            notes.append(f"{schedule}: first loss ours {first['ours']:.7f}, raw {first['raw']:.7f}.")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    note = (f"2 processes (gloo, 1 thread each), pp=2: 8 residual MLP blocks 256→1024→256, AdamW, batch 32 in 4 microbatches; "
            f"{rounds} rounds of {steps} steps alternating which goes first. Ours also broadcasts the batch's loss from the "
            "last stage every step (the raw loop has it on the last stage only). " + " ".join(notes))
    return [Section("Pipeline stages, 2 processes — time per step", "raw", rows, [note])]
