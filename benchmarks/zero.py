"""DeepSpeed ZeRO-2 on 2 processes: step time, a raw ``deepspeed.initialize`` loop against the Accelerator with
``DeepSpeedStrategy`` (the same model and data as the FSDP benchmark), and checkpoints in one job: our
``save_state``/``load_state`` against the engine's own ``save_checkpoint``/``load_checkpoint`` of the same engine.

Ours saves more than the raw engine call: RNG states, data positions, a manifest with every file's digest, every
file flushed to disk and the directory renamed into place; by default also the consolidated float32 weights
(``model.safetensors``, gathered from the optimizer's partitions), which ``DeepSpeedStrategy(export_weights=False)``
leaves out.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
from pathlib import Path

from benchmarks.common import Row, Section, repo_env
from benchmarks.fsdp import interleaved_rounds


def run(*, quick: bool) -> list[Section]:
    rounds = 2 if quick else 4
    steps = 100 if quick else 300
    scripts = {"raw deepspeed.initialize, torchrun": "raw_deepspeed", "Accelerator DeepSpeed, trainer launch": "accelerator_deepspeed"}
    rows = interleaved_rounds("deepspeed", scripts, rounds, steps)
    setup = (f"2 processes (gloo, DS_ACCELERATOR=cpu, 1 thread each), ZeRO stage 2, 4 residual MLP blocks of width 256 "
             f"(~2.1 M params), torch AdamW, batch 32 per process; {rounds} interleaved rounds of {steps} timed steps after 10 warm-up steps.")
    return [
        Section("DeepSpeed ZeRO-2, 2 processes — time per step", "raw DeepSpeed", list(rows["per_step"].values()), [setup]),
        *checkpoints(rounds=8 if quick else 16),  # (a multiple of the 4 contenders: each in every position)
    ]


def checkpoints(*, rounds: int) -> list[Section]:
    """`save_state`/`load_state` against the engine's `save_checkpoint`/`load_checkpoint`, in one 2-process job."""
    from benchmarks.ddp import _trainer_command

    folder = Path(tempfile.mkdtemp(prefix="bench-ckpt-deepspeed-"))
    result = folder / "result.json"
    command = [*_trainer_command(), "launch", "--num_processes", "2", "--cpu", "-m", "benchmarks.deepspeed_scripts.checkpoint_rounds",
               str(result), str(rounds), str(folder)]
    try:
        done = subprocess.run(command, env=repo_env(OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu"), cwd="/", capture_output=True,
                              text=True, timeout=900)
        if done.returncode != 0 or not result.exists():
            raise RuntimeError(f"{' '.join(command)} failed with exit code {done.returncode}:\n{done.stderr[-3000:]}")
        times = json.loads(result.read_text())
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    note = (f"2 processes (gloo, DS_ACCELERATOR=cpu), ZeRO stage 2, the FSDP benchmark's model (~2.1 M params) and torch "
            f"AdamW; {rounds} rounds in one job, the contenders' order rotating, each timed between barriers. Ours "
            "writes the engine's files through its checkpoint engine (each hashed while written, xxh3-128), plus RNG "
            "states, data positions and the manifest, flushes every file and renames the directory into place (the "
            "engine's own call flushes nothing: the row 'then its files fsynced' adds that flush to it); loading checks each file in the pass that reads it, before DeepSpeed "
            "unpickles it. 'with model.safetensors' also gathers and writes the consolidated float32 weights at each save "
            "(the default; export_weights=False leaves them out), which a resume does not read: its load hashes them too.")
    sections = []
    for kind, raw_name in (("save", "engine save_checkpoint"), ("load", "engine load_checkpoint")):
        raw = times[f"raw_{kind}"]
        rows = [Row(raw_name, "s", raw, [1.0] * len(raw))]
        sides = [("lean", f"Accelerator.{kind}_state, export_weights=False", "≤ 1.30"),
                 ("full", f"Accelerator.{kind}_state, with model.safetensors (default)", "")]
        if kind == "save":  # (the same files as the engine's own load reads)
            sides.insert(0, ("synced", "engine save_checkpoint, then its files fsynced", ""))
        for side, name, target in sides:
            ours = times[f"{side}_{kind}"]
            rows.append(Row(name, "s", ours, [o / r for o, r in zip(ours, raw)], target=target))
        sections.append(Section(f"DeepSpeed ZeRO-2, 2 processes — checkpoint {kind}, same job", raw_name, rows, [note]))
    return sections
