"""Where the GPU tests run, chosen once at collection.

- On a CUDA machine: on ``cuda`` (NCCL for several processes). ``bash tests/gpu/run.sh`` runs them and
  ``benchmarks/gpu_check.py`` and writes one results file.
- With ``TRAINWRIGHT_GPU_TESTS_ON_CPU=1``: the device-independent parts on CPU (gloo, bf16), to check the tests' own
  logic; the CUDA-only checks (fp16 with GradScaler, NCCL, peak device memory) are skipped with the reason.
- Otherwise every test here is skipped, with the command as the reason. A skipped test is not a passed one.

``TRAINWRIGHT_GPU_RESULTS=path`` appends the tables the tests measure (step times, peak memory) to that file.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

ON_CPU = os.environ.get("TRAINWRIGHT_GPU_TESTS_ON_CPU", "") == "1"
HAVE_CUDA = torch.cuda.is_available()
DEVICE = torch.device("cpu") if ON_CPU or not HAVE_CUDA else torch.device("cuda", 0)
CPU = DEVICE.type == "cpu"
GPUS = 0 if CPU else torch.cuda.device_count()
ENABLED = HAVE_CUDA or ON_CPU
SKIP_REASON = (
    "needs CUDA: run `bash tests/gpu/run.sh` (or `pytest -m gpu tests/gpu`) on a GPU machine; "
    "TRAINWRIGHT_GPU_TESTS_ON_CPU=1 runs the device-independent parts on CPU"
)
RESULTS = os.environ.get("TRAINWRIGHT_GPU_RESULTS")  # read here: the test fixtures clear TRAINWRIGHT_* variables
# the processes of a multi-process check: 2 where there are 2 GPUs (and on CPU, with gloo), else 1
PROCS = 2 if CPU or GPUS >= 2 else 1


def cuda_only(what: str) -> pytest.MarkDecorator:
    """Skip `what` when the tests run on CPU: it exists on CUDA only."""
    return pytest.mark.skipif(CPU, reason=f"{what} is CUDA-only: not run on CPU (run `bash tests/gpu/run.sh` on a GPU machine)")


def two_processes(what: str) -> pytest.MarkDecorator:
    """Skip `what` on a machine with one GPU: it needs two processes, one per GPU."""
    return pytest.mark.skipif(PROCS < 2, reason=f"{what} needs 2 GPUs; this machine has {GPUS}")


def report(title: str, header: list[str], rows: list[list[str]]) -> str:
    """Print a markdown table (and append it to ``TRAINWRIGHT_GPU_RESULTS`` when set); return its text."""
    where = f"{torch.cuda.get_device_name(DEVICE)} × {GPUS}" if not CPU else "CPU (TRAINWRIGHT_GPU_TESTS_ON_CPU=1)"
    lines = [f"\n### {title} — {where}, torch {torch.__version__}\n", "| " + " | ".join(header) + " |",
             "|" + "---|" * len(header)] + ["| " + " | ".join(row) + " |" for row in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if RESULTS:
        with Path(RESULTS).open("a") as fh:
            fh.write(text)
    return text
