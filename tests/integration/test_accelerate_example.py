"""The Accelerate-style example runs end to end, on one process and on two through the real launcher."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.helpers.scripts import launch_environment, run_python

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "accelerate_loop.py"


def _check_outputs(project: Path, out: str, epochs: int) -> None:
    assert out.count("accuracy") == epochs
    assert "on 397 test samples" in out  # every test sample counted once
    assert sorted(p.name for p in (project / "checkpoints").iterdir()) == [f"checkpoint_{i}" for i in range(max(0, epochs - 2), epochs)]
    weights = load_file(str(project / "model" / "model.safetensors"))
    assert set(weights) == {"0.weight", "0.bias", "2.weight", "2.bias"}


@pytest.mark.timeout(300)
def test_single_process(tmp_path):
    proc = run_python([sys.executable, str(EXAMPLE), "--epochs", "1", "--project_dir", str(tmp_path / "run")], timeout=280)
    assert proc.returncode == 0, proc.stderr
    _check_outputs(tmp_path / "run", proc.stdout, 1)


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_two_processes_through_the_launcher(tmp_path):
    cmd = [sys.executable, "-m", "trainer", "launch", "--num_processes", "2", "--main_process_port", "0",
           str(EXAMPLE), "--epochs", "2", "--project_dir", str(tmp_path / "run")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _check_outputs(tmp_path / "run", proc.stdout, 2)


@pytest.mark.distributed
@pytest.mark.timeout(300)
def test_the_same_script_sharded_with_fsdp_matches_ddp(tmp_path):
    """Unchanged script, `--strategy fsdp`: same accuracies as DDP, sharded checkpoints, full exported weights.

    Both run on two processes started as ``trainer launch --num_processes 2 --strategy ...`` starts them (its variables,
    made by its own code), forked from the tests' warm server: the launch itself is the test above's subject."""
    runs = {}
    for strategy in ("ddp", "fsdp"):
        env = {**os.environ, **launch_environment("--num_processes", "2", "--strategy", strategy)}
        cmd = [sys.executable, str(EXAMPLE), "--epochs", "2", "--project_dir", str(tmp_path / strategy)]
        proc = run_python(cmd, env=env, timeout=280, nprocs=2)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        _check_outputs(tmp_path / strategy, proc.stdout, 2)
        runs[strategy] = [line for line in proc.stdout.splitlines() if "accuracy" in line]
    assert runs["fsdp"] == runs["ddp"]
    assert (tmp_path / "fsdp" / "checkpoints" / "checkpoint_1" / "sharded" / ".metadata").is_file()
    assert not (tmp_path / "fsdp" / "checkpoints" / "checkpoint_1" / "model.safetensors").exists()
