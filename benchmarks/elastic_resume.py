"""Resume on another number of processes: ``load_state`` + the first batch of a 2-process DDP checkpoint, resumed on
2 processes (the same number), on 3 (a process the checkpoint had no RNG states for) and on 1.

A 2-process job saves a mid-epoch checkpoint (an 8-layer MLP of 8.4 M parameters with AdamW, a shuffled loader of
65,536 samples and a global batch of 48, 1,000 steps in); then each round starts one job per contender (order rotated)
that times, inside the job, ``load_state`` and the first batch on every process (the slowest process counts; the
fastest of 3 such resumes), so the launch itself is not in the time. Each job checks that the first global step after
resuming holds the samples the uninterrupted run takes there.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import Row, Section, repo_env

GLOBAL_BATCH, SAMPLES, POSITION, WIDTH, LAYERS = 48, 65536, 1000, 1024, 8


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _job(processes: int, *args: str) -> None:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes), "--master_port",
               str(_free_port()), "-m", "benchmarks.elastic_resume", *args]
    done = subprocess.run(command, env=repo_env(OMP_NUM_THREADS="1", TRAINWRIGHT_PG_TIMEOUT="120"), cwd="/",
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed with exit code {done.returncode}:\n{done.stderr[-3000:]}")


def run(*, quick: bool) -> list[Section]:
    rounds = 2 if quick else 4
    folder = Path(tempfile.mkdtemp(prefix="bench-elastic-"))
    contenders = {"2 → 2 processes (the same number)": 2, "2 → 3 processes": 3, "2 → 1 process": 1}
    rows = {name: Row(name, "ms") for name in contenders}
    checks: list[str] = []
    try:
        _job(2, "save", str(folder))
        names = list(contenders)
        for r in range(rounds):
            order = names[r % len(names):] + names[: r % len(names)]
            measured = {}
            for name in order:
                result = folder / f"result-{contenders[name]}.json"
                _job(contenders[name], "resume", str(folder), str(result))
                values = json.loads(result.read_text())
                measured[name] = values["seconds"] * 1e3
                if not values["same_samples"]:
                    checks.append(f"CHECK FAILED: resumed on {contenders[name]} process(es), the first step's samples differ.")
            for name in names:
                rows[name].times.append(measured[name])
                rows[name].ratios.append(measured[name] / measured[names[0]])
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    notes = [
        (f"A 2-process DDP checkpoint ({LAYERS} × Linear({WIDTH}, {WIDTH}), AdamW: {LAYERS * (WIDTH * WIDTH + WIDTH) / 1e6:.1f} M "
        f"parameters) written {POSITION} steps into an epoch of {SAMPLES} shuffled samples, global batch {GLOBAL_BATCH}; "
        f"{rounds} interleaved rounds, one job per contender each, timing in the job the fastest of 3 resumes "
        "(load_state + first batch, the slowest process)."),
        *(checks or ["After each resume the first global step holds the samples of the uninterrupted run (checked)."]),
    ]
    return [Section("Resume on another number of processes", "2 → 2 processes (the same number)", list(rows.values()), notes)]


# ----------------------------------------------------------------------------------------------- the jobs
def _prepared() -> tuple[Any, Any, Any, Any]:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from trainer import Accelerator

    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    data = TensorDataset(torch.arange(SAMPLES), torch.zeros(SAMPLES, WIDTH))
    loader = DataLoader(data, batch_size=GLOBAL_BATCH // accelerator.num_processes, shuffle=True)
    return accelerator, *accelerator.prepare(model, optimizer, loader)


def save(folder: Path) -> None:
    """Train the first step (so the optimizer has states), go to POSITION, save, and record the next step's samples."""
    accelerator, model, optimizer, loader = _prepared()
    batches = iter(loader)
    _, x = next(batches)
    model(x).square().mean().backward()
    optimizer.step()
    for _ in range(POSITION - 1):
        next(batches)
    accelerator.save_state(folder / "checkpoint")
    index, _ = next(batches)
    expected = sorted(i for part in accelerator.gather_object([index.tolist()]) for i in part)
    if accelerator.is_main_process:
        (folder / "expected.json").write_text(json.dumps(expected))
    accelerator.end_training()


def resume(folder: Path, result: Path) -> None:
    """Time load_state + the first batch, 3 times; the slowest process's time of the fastest try."""
    accelerator, _model, _optimizer, loader = _prepared()
    times, same = [], True
    for _ in range(3):
        accelerator.wait_for_everyone()
        begin = time.perf_counter()
        accelerator.load_state(folder / "checkpoint")
        index, _ = next(iter(loader))
        seconds = time.perf_counter() - begin
        slowest = max(accelerator.gather_object([seconds]))
        samples = sorted(i for part in accelerator.gather_object([index.tolist()]) for i in part)
        times.append(slowest)
        same = same and samples == json.loads((folder / "expected.json").read_text())
    if accelerator.is_main_process:
        result.write_text(json.dumps({"seconds": min(times), "same_samples": same}))
    accelerator.end_training()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if sys.argv[1] == "save":
        save(Path(sys.argv[2]))
    else:
        resume(Path(sys.argv[2]), Path(sys.argv[3]))
