"""Preemption: a real SIGTERM or SIGUSR1 mid-epoch makes ``fit`` finish the optimizer step, write a complete
checkpoint, and exit with 128 + the signal; ``fit(ckpt_path="last")`` then ends with the same weights, bit for
bit, as a run never interrupted. One process (``python -m``) and two (``torchrun``, the signal sent to the agent
as a scheduler does). Each phase is its own process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.multiprocess import free_port

pytestmark = pytest.mark.faults

REPO = Path(__file__).resolve().parents[2]
TOTAL_STEPS, SIGNAL_AT = 11, 5


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), "TRAINWRIGHT_PG_TIMEOUT": "60"}


def _one_process(root: Path, signame: str, **env: str) -> subprocess.CompletedProcess:
    from tests.helpers.scripts import run_python  # (a real process forked from the warm server: its signals are the subject)

    cmd = [sys.executable, "-m", "tests.integration.test_preemption", str(root), signame]
    return run_python(cmd, cwd=root, env={**_env(), **env}, timeout=240)


def _two_processes(root: Path, signame: str) -> subprocess.CompletedProcess:
    """2 workers; with `signame`, a real torchrun whose agent gets it once rank 0 reached SIGNAL_AT (a scheduler's
    stop: the agent's handling is the subject). Without, the uninterrupted and the resumed runs start as torchrun starts
    its workers, forked from the tests' warm server (their training is the subject, not the launch)."""
    if signame == "none":
        from tests.helpers.scripts import run_python

        cmd = [sys.executable, "-m", "tests.integration.test_preemption", str(root), "none"]
        return run_python(cmd, cwd=root, env=_env(), timeout=240, nprocs=2)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           "-m", "tests.integration.test_preemption", str(root), "external"]
    marker = root / "reached.txt"
    agent = subprocess.Popen(cmd, cwd=root, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 200
    while not marker.exists() and agent.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    agent.send_signal(getattr(signal, signame))
    out, err = agent.communicate(timeout=240)
    return subprocess.CompletedProcess(cmd, agent.returncode, out, err)


def _final(root: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(root / "final.safetensors"))


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("signame", ["SIGTERM", "SIGUSR1"])
def test_one_process_preempted_mid_epoch_resumes_bit_exactly(tmp_path: Path, signame: str) -> None:
    from trainer.fit.checkpointing import find_last_checkpoint, verify_checkpoint

    straight, run = tmp_path / "straight", tmp_path / "run"
    straight.mkdir(), run.mkdir()
    assert _one_process(straight, "none").returncode == 0
    first = _one_process(run, signame)
    signum = getattr(signal, signame)
    assert first.returncode == 128 + signum, first.stderr[-3000:]
    assert f"{signame} received; saved" in first.stdout and not (run / "final.safetensors").exists()
    # the signal came mid-accumulation after step 5: the step finished (6), then the checkpoint
    last = find_last_checkpoint(run / "checkpoints")
    assert last is not None and last.name == "preempted-epoch=1-step=6" and verify_checkpoint(last)["global_step"] == 6
    second = _one_process(run, "none")
    assert second.returncode == 0, second.stderr[-3000:]
    assert json.loads((run / "report.json").read_text()) == {"global_step": TOTAL_STEPS, "first_step_resumed": 7}
    assert _same(_final(straight), _final(run))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("requeue", ["1", "0"])
def test_slurms_warning_signal_requeues_the_job_after_the_checkpoint(tmp_path: Path, requeue: str) -> None:
    # SLURM's scontrol does not exist here: a stand-in on PATH records how it is called
    bin_dir, calls = tmp_path / "bin", tmp_path / "scontrol-calls.txt"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\nls {tmp_path / "run" / "checkpoints"} >> {calls}\necho "$@" >> {calls}\n')
    (bin_dir / "scontrol").chmod(0o755)
    run = tmp_path / "run"
    run.mkdir()
    first = _one_process(run, "SIGUSR1", SLURM_JOB_ID="4242", SLURM_JOB_NAME="train.sbatch", TRAINWRIGHT_SLURM_REQUEUE=requeue,
                         PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assert first.returncode == 138, first.stderr[-3000:]
    if requeue == "0":
        assert not calls.exists()
        return
    assert "requeued SLURM job 4242" in first.stdout
    listing, args = calls.read_text().strip().rsplit("\n", 1)
    assert args == "requeue 4242"
    assert "preempted-epoch=1-step=6" in listing  # requeued only once the checkpoint was complete


@pytest.mark.distributed
@pytest.mark.timeout(600)
def test_two_process_job_preempted_through_the_agent_resumes_bit_exactly(tmp_path: Path) -> None:
    from trainer.fit.checkpointing import find_last_checkpoint

    straight, run = tmp_path / "straight", tmp_path / "run"
    straight.mkdir(), run.mkdir()
    assert _two_processes(straight, "none").returncode == 0
    first = _two_processes(run, "SIGTERM")
    assert first.returncode != 0 and not (run / "final.safetensors").exists(), first.stderr[-3000:]
    last = find_last_checkpoint(run / "checkpoints")
    assert last is not None and last.name.startswith("preempted-"), first.stderr[-3000:]
    assert {"random_states_0.safetensors", "random_states_1.safetensors"} <= {p.name for p in last.iterdir()}
    second = _two_processes(run, "none")
    assert second.returncode == 0, second.stderr[-3000:]
    assert json.loads((run / "report.json").read_text())["global_step"] == TOTAL_STEPS
    assert _same(_final(straight), _final(run))


# ------------------------------------------------------------------------------- the training process
def main(root: Path, signame: str) -> None:
    """Train to TOTAL_STEPS resuming from "last"; with a signal name, send it to this process mid-accumulation after step SIGNAL_AT.

    ``external``: only mark that step was reached (the test signals the launcher).
    """
    from safetensors.torch import save_file

    from callbacks.base import Callback
    from tests.unit.test_checkpoint_resume import run_fit

    class Signaller(Callback):
        def on_after_backward(self, trainer: Any, module: Any) -> None:
            if trainer.global_step != SIGNAL_AT or trainer.fit_progress.accumulation_position != 0:
                return
            if signame == "external":
                if trainer.is_global_zero and not (root / "reached.txt").exists():
                    (root / "reached.txt").write_text("1")
                    time.sleep(1.0)  # the agent's signal arrives while this step is in flight
            elif signame != "none":
                os.kill(os.getpid(), getattr(signal, signame))

    class FirstStep(Callback):
        def __init__(self) -> None:
            self.first: int | None = None

        def on_before_optimizer_step(self, trainer: Any, module: Any, optimizer: Any) -> None:
            self.first = trainer.global_step + 1 if self.first is None else self.first  # the number of the step it takes

    first = FirstStep()
    resuming = (root / "checkpoints").is_dir()
    module, trainer, _ = run_fit(root, TOTAL_STEPS, ckpt_path="last", init_seed=99 if resuming else 1, extra_callbacks=(Signaller(), first))
    full = trainer.strategy.module_state_dict(module)
    if trainer.is_global_zero:
        save_file({k: v.contiguous() for k, v in full.items()}, str(root / "final.safetensors"))
        (root / "report.json").write_text(json.dumps({"global_step": trainer.global_step, "first_step_resumed": first.first}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
