"""DDP on 2 processes: step time and launch-to-first-step, raw torchrun DDP against `trainer launch` + Accelerator.

Each round launches both jobs (order rotated). Launch to first step is the wall-clock time from just before
the launcher starts to the end of rank 0's first optimizer step; the step time is rank 0's steady-state time
per step. Jobs use a 60 s process-group timeout and a subprocess timeout, so a broken run cannot hang.
"""

from __future__ import annotations

import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import Row, Section, repo_env

SCRIPTS = Path(__file__).resolve().parent / "ddp_scripts"


def _trainer_command() -> list[str]:
    script = Path(sys.executable).with_name("trainer")
    return [str(script)] if script.exists() else [sys.executable, "-m", "trainer"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _launch(command: list[str], result: Path, timeout: float) -> tuple[float, float]:
    env = repo_env(OMP_NUM_THREADS="1")
    start = time.time()
    done = subprocess.run(command, env=env, cwd="/", capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0 or not result.exists():
        raise RuntimeError(f"{' '.join(command)} failed with exit code {done.returncode}:\n{done.stderr[-3000:]}")
    values = json.loads(result.read_text())
    result.unlink()
    return values["first_step"] - start, values["per_step"]


def run(*, quick: bool) -> list[Section]:
    rounds = 2 if quick else 4
    steps = 200 if quick else 600
    folder = Path(tempfile.mkdtemp(prefix="bench-ddp-"))
    result = folder / "result.json"
    commands = {
        "raw DDP, torchrun": [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "{port}",
                              str(SCRIPTS / "raw_ddp.py"), str(result), str(steps)],
        "Accelerator, trainer launch": [*_trainer_command(), "launch", "--num_processes", "2", "--cpu",
                                        str(SCRIPTS / "accelerator_ddp.py"), str(result), str(steps)],
    }
    names = list(commands)
    launch = {name: Row(name, "s") for name in names}
    step = {name: Row(name, "µs/step") for name in names}
    try:
        for r in range(rounds):
            measured = {}
            for name in names[r % 2:] + names[: r % 2]:
                command = [arg.replace("{port}", str(_free_port())) for arg in commands[name]]
                measured[name] = _launch(command, result, timeout=600)
            for name in names:
                launch[name].times.append(measured[name][0])
                step[name].times.append(measured[name][1] * 1e6)
                launch[name].ratios.append(measured[name][0] / measured[names[0]][0])
                step[name].ratios.append(measured[name][1] / measured[names[0]][1])
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    step[names[1]].target = "≤ 1.05"
    launch[names[1]].target = "≤ raw + 0.5 s"
    extra = statistics.median(a - b for a, b in zip(launch[names[1]].times, launch[names[0]].times))
    launch[names[1]].met = extra <= 0.5
    notes = [("Raw: `python -m torch.distributed.run --nproc_per_node 2 --master_port <free port> raw_ddp.py`; ours: "
             "`trainer launch --num_processes 2 --cpu accelerator_ddp.py` (scripts in `benchmarks/ddp_scripts/`)."),
             (f"2 processes (gloo, 1 thread each), tiny MLP 32-64-10, batch 32 per process; {rounds} interleaved rounds of "
             f"{steps} timed steps after 10 warm-up steps.")]
    return [
        Section("DDP, 2 processes — time per step", "raw DDP", list(step.values()), notes),
        Section("DDP, 2 processes — launch to first step", "raw torchrun", list(launch.values()),
                [f"Median extra launch-to-first-step time of `trainer launch` + Accelerator: {extra:+.2f} s."]),
    ]
