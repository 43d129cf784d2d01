"""A rank that hangs alive before a collective, or a collective called on one rank only, under ``trainer launch``:
the waiting rank names the rank that never arrived and the timeout setting, and the hung rank's Python stack is
printed (faulthandler). Before, the job ended with gloo's bare "Timed out waiting 300000ms for recv" on rank 0.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.distributed, pytest.mark.faults, pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parents[2]

HUNG = """
import time
import torch
from trainer import Accelerator

def stuck_before_the_collective():
    time.sleep(20)  # far past the 6 s timeout; the launcher stops this rank long before

acc = Accelerator(cpu=True, process_group_timeout=6)
if acc.process_index == 1:
    stuck_before_the_collective()
acc.reduce(torch.ones(1))
"""

ONE_RANK_ONLY = """
import torch
from trainer import Accelerator

acc = Accelerator(cpu=True, process_group_timeout=6)
if acc.process_index == 0:
    acc.reduce(torch.ones(1))
"""


def _launch(tmp_path: Path, code: str) -> subprocess.CompletedProcess:
    script = tmp_path / "job.py"
    script.write_text(code)
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "trainer", "launch", "--num_processes", "2", "--cpu", str(script)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=150)


def test_a_rank_hung_before_a_collective_is_named_with_its_stack(tmp_path: Path) -> None:
    done = _launch(tmp_path, HUNG)
    assert done.returncode == 1
    assert "trainwright: rank 0 waited in a collective (timeout 6 s) and failed: rank(s) [1] never reached it; still running: [1]" in done.stderr
    assert "in stuck_before_the_collective" in done.stderr  # rank 1's stack, where it hangs
    assert "TRAINWRIGHT_PG_TIMEOUT" in done.stderr and "process_group_timeout" in done.stderr


def test_a_collective_called_on_one_rank_only_is_named(tmp_path: Path) -> None:
    done = _launch(tmp_path, ONE_RANK_ONLY)
    assert done.returncode == 1
    assert "rank(s) [1] never reached it; already exited: [1] (a collective called on some ranks only?)" in done.stderr
