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
        *run_checkpoints(quick=quick),
    ]


def run_checkpoints(*, quick: bool) -> list[Section]:
    """The checkpoint rounds alone (``--only deepspeed_checkpoint``)."""
    return checkpoints(rounds=4 if quick else 8)  # (a multiple of the 4 contenders: each in every position)


def checkpoints(*, rounds: int, width: int = 1024, layers: int = 24) -> list[Section]:
    """`save_state`/`load_state` against the engine's `save_checkpoint`/`load_checkpoint`, in one 2-process job, of
    `layers` Linear(`width`, `width`) layers (the default: 25 M parameters, a ~400 MB checkpoint, where the fixed
    milliseconds of the agreements do not dominate)."""
    from benchmarks.ddp import _trainer_command

    folder = Path(tempfile.mkdtemp(prefix="bench-ckpt-deepspeed-"))
    result = folder / "result.json"
    command = [*_trainer_command(), "launch", "--num_processes", "2", "--cpu", "-m", "benchmarks.deepspeed_scripts.checkpoint_rounds",
               str(result), str(rounds), str(folder), str(width), str(layers)]
    try:
        done = subprocess.run(command, env=repo_env(OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu"), cwd="/", capture_output=True,
                              text=True, timeout=900)
        if done.returncode != 0 or not result.exists():
            raise RuntimeError(f"{' '.join(command)} failed with exit code {done.returncode}:\n{done.stderr[-3000:]}")
        times = json.loads(result.read_text())
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    params = layers * (width * width + width)
    note = (f"2 processes (gloo, DS_ACCELERATOR=cpu), ZeRO stage 2, {layers} × Linear({width}, {width}) ({params / 1e6:.0f} M "
            f"params: a checkpoint of ~{params * 16 / 1e6:.0f} MB, the weights and each process's fp32 partition with "
            f"AdamW's two moments) and torch AdamW; {rounds} rounds in one job, the contenders' order rotating, each "
            "timed between barriers, each checkpoint removed after its load. Ours "
            "writes the engine's files through its checkpoint engine (each hashed while written, xxh3-128), plus RNG "
            "states, data positions and the manifest, flushes every file and renames the directory into place (the "
            "engine's own call flushes nothing: the row 'then its files fsynced' adds that flush to it, the baseline of "
            "the save target); loading parses each engine file weights-only and hashes it in that pass, returning it "
            "once its digest matched. 'with model.safetensors' also gathers and writes the consolidated float32 "
            "weights at each save (the default; export_weights=False leaves them out), which a resume does not read: "
            "its load hashes them too.")
    sections = []
    # a save is measured against the engine's save followed by an fsync of its files (ours flushes every file before
    # it commits; the engine's call flushes nothing), a load against the engine's load
    for kind, base, base_name, others in (
        ("save", "synced", "engine save_checkpoint, then its files fsynced", [("raw", "engine save_checkpoint (nothing flushed)", "")]),
        ("load", "raw", "engine load_checkpoint", []),
    ):
        baseline = times[f"{base}_{kind}"]
        rows = [Row(base_name, "s", baseline, [1.0] * len(baseline))]
        sides = [*others, ("lean", f"Accelerator.{kind}_state, export_weights=False", "≤ 1.10" if kind == "save" else "≤ 1.30"),
                 ("full", f"Accelerator.{kind}_state, with model.safetensors (default)", "")]
        for side, name, target in sides:
            ours = times[f"{side}_{kind}"]
            rows.append(Row(name, "s", ours, [o / r for o, r in zip(ours, baseline)], target=target))
        sections.append(Section(f"DeepSpeed ZeRO-2, 2 processes — checkpoint {kind}, same job", base_name, rows, [note]))
    return sections
