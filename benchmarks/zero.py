"""DeepSpeed ZeRO-2 on 2 processes: step time and engine checkpoints, a raw ``deepspeed.initialize`` loop against
the Accelerator with ``DeepSpeedStrategy`` (the same model and data as the FSDP benchmark).

Ours saves more than the raw loop: the consolidated float32 weights (``model.safetensors``, gathered from the
optimizer's partitions), RNG states, data positions and a manifest with every file's SHA-256.
"""

from __future__ import annotations

from benchmarks.common import Section
from benchmarks.fsdp import interleaved_rounds


def run(*, quick: bool) -> list[Section]:
    rounds = 2 if quick else 4
    steps = 100 if quick else 300
    scripts = {"raw deepspeed.initialize, torchrun": "raw_deepspeed", "Accelerator DeepSpeed, trainer launch": "accelerator_deepspeed"}
    rows = interleaved_rounds("deepspeed", scripts, rounds, steps)
    for kind in ("save", "load"):  # no ratio target: ours does more work than the raw engine call (below)
        rows[kind]["Accelerator DeepSpeed, trainer launch"].target = ""
    setup = (f"2 processes (gloo, DS_ACCELERATOR=cpu, 1 thread each), ZeRO stage 2, 4 residual MLP blocks of width 256 "
             f"(~2.1 M params), torch AdamW, batch 32 per process; {rounds} interleaved rounds of {steps} timed steps after 10 warm-up steps.")
    ckpt = ("Median of 3 saves and 3 loads per round. Raw: the engine's save_checkpoint/load_checkpoint. Ours: the same engine "
            "files plus the consolidated float32 weights (gathered from the optimizer's partitions and written as "
            "model.safetensors, so any strategy and plain PyTorch load them), RNG states, data positions and the manifest with "
            "every file's SHA-256; loading first checks every hash (load_state(verify=False) skips that). No ratio target: "
            "the difference is that work, tens of milliseconds here.")
    return [
        Section("DeepSpeed ZeRO-2, 2 processes — time per step", "raw DeepSpeed", list(rows["per_step"].values()), [setup]),
        Section("DeepSpeed ZeRO-2, 2 processes — checkpoint save", "raw save_checkpoint", list(rows["save"].values()), [ckpt]),
        Section("DeepSpeed ZeRO-2, 2 processes — checkpoint load", "raw load_checkpoint", list(rows["load"].values()), [ckpt]),
    ]
