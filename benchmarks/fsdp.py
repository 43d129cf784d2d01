"""FSDP2 on 2 processes: step time and sharded checkpoints, a raw FSDP2 + DCP loop against the Accelerator.

Each round launches both jobs (order rotated): raw ``fully_shard`` + ``dcp.save``/``dcp.load`` under torchrun,
and the same training through ``trainer launch`` + ``Accelerator(strategy=FSDPStrategy(...))`` with
``save_state``/``load_state`` (which add RNG states, data positions and the hashed manifest).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import Row, Section, repo_env
from benchmarks.ddp import _free_port, _trainer_command

SCRIPTS = Path(__file__).resolve().parent / "fsdp_scripts"


def _launch(command: list[str], result: Path, timeout: float) -> dict[str, float]:
    done = subprocess.run(command, env=repo_env(OMP_NUM_THREADS="1"), cwd="/", capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0 or not result.exists():
        raise RuntimeError(f"{' '.join(command)} failed with exit code {done.returncode}:\n{done.stderr[-3000:]}")
    values = json.loads(result.read_text())
    result.unlink()
    return values


def run(*, quick: bool) -> list[Section]:
    rounds = 2 if quick else 4
    steps = 100 if quick else 300
    rows = interleaved_rounds("fsdp", {"raw FSDP2, torchrun": "raw_fsdp", "Accelerator FSDP, trainer launch": "accelerator_fsdp"}, rounds, steps)
    setup = (f"2 processes (gloo, 1 thread each), 4 residual MLP blocks of width 256 (each its own FSDP unit, ~2.1 M params), "
             f"AdamW, batch 32 per process; {rounds} interleaved rounds of {steps} timed steps after 10 warm-up steps.")
    ckpt = ("Median of 3 saves and 3 loads of model + AdamW state (~25 MB) per round. Ours also writes RNG states and data "
            "positions and hashes every file into manifest.json; DCP's shard files are hashed by the rank that wrote them.")
    return [
        Section("FSDP2, 2 processes — time per step", "raw FSDP2", list(rows["per_step"].values()), [setup]),
        Section("FSDP2, 2 processes — sharded checkpoint save", "raw dcp.save", list(rows["save"].values()), [ckpt]),
        Section("FSDP2, 2 processes — sharded checkpoint load", "raw dcp.load", list(rows["load"].values()), [ckpt]),
    ]


def interleaved_rounds(kind: str, scripts: dict[str, str], rounds: int, steps: int) -> dict[str, dict[str, Row]]:
    """Run the raw script (first) and ours (second, through `trainer launch`) `rounds` times in rotated order.

    `scripts` maps a row name to a module in ``benchmarks/<kind>_scripts``; returns per-step, save and load rows.
    """
    folder = Path(tempfile.mkdtemp(prefix=f"bench-{kind}-"))
    result = folder / "result.json"
    (raw_name, raw_script), (our_name, our_script) = scripts.items()
    commands = {
        raw_name: [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "{port}",
                   "-m", f"benchmarks.{kind}_scripts.{raw_script}", str(result), str(steps), "{dir}"],
        our_name: [*_trainer_command(), "launch", "--num_processes", "2", "--cpu", "-m",
                   f"benchmarks.{kind}_scripts.{our_script}", str(result), str(steps), "{dir}"],
    }
    names = list(commands)
    rows = {kind: {name: Row(name, unit) for name in names} for kind, unit in (("per_step", "µs/step"), ("save", "s"), ("load", "s"))}
    try:
        for r in range(rounds):
            measured = {}
            for name in names[r % 2:] + names[: r % 2]:
                target = folder / f"r{r}-{names.index(name)}"
                command = [arg.replace("{port}", str(_free_port())).replace("{dir}", str(target)) for arg in commands[name]]
                measured[name] = _launch(command, result, timeout=600)
                shutil.rmtree(target, ignore_errors=True)
            for kind, table in rows.items():
                scale = 1e6 if kind == "per_step" else 1.0
                for name in names:
                    table[name].times.append(measured[name][kind] * scale)
                    table[name].ratios.append(measured[name][kind] / measured[names[0]][kind])
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    rows["per_step"][names[1]].target = "≤ 1.05"
    rows["save"][names[1]].target = "≤ 1.20"
    rows["load"][names[1]].target = "≤ 1.20"
    return rows
