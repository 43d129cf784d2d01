"""Resume after ``kill -9``: a training process that dies (mid-run, or in the middle of writing a
checkpoint) is restarted with ``fit(ckpt_path="last")`` and ends with the same weights as a run that was
never interrupted. Each phase runs in its own Python process (``python -m tests.integration.test_resume_kill``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
TOTAL_STEPS, EVERY = 11, 2


def _phase(root: Path, *, kill_at_step: int = 0, kill_in_save_at_step: int = 0) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "tests.integration.test_resume_kill", str(root), str(kill_at_step), str(kill_in_save_at_step)]
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=240)


def _straight_weights(root: Path) -> dict[str, Any]:
    from tests.unit.test_checkpoint_resume import run_fit

    module, _, _ = run_fit(root, TOTAL_STEPS)
    return module.state_dict()


def _assert_equal_to(final: Path, expected: dict[str, Any]) -> None:
    import torch
    from safetensors.torch import load_file

    got = load_file(str(final))
    assert got.keys() == expected.keys()
    assert [k for k in got if not torch.equal(got[k], expected[k])] == [], "weights differ from the uninterrupted run"


@pytest.mark.timeout(600)
def test_kill_mid_run_then_resume_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    from trainer.fit.checkpointing import find_last_checkpoint

    first = _phase(tmp_path, kill_at_step=7)
    assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]
    assert not (tmp_path / "final.safetensors").exists()
    assert find_last_checkpoint(tmp_path / "ckpts") == tmp_path / "ckpts" / "epoch=1-step=6"
    second = _phase(tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["first_step_resumed"] == 7 and report["global_step"] == TOTAL_STEPS
    _assert_equal_to(tmp_path / "final.safetensors", _straight_weights(tmp_path / "straight"))


@pytest.mark.timeout(600)
def test_kill_while_saving_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    from trainer.fit.checkpointing import find_last_checkpoint, verify_checkpoint

    first = _phase(tmp_path, kill_in_save_at_step=6)
    assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]
    root = tmp_path / "ckpts"
    partial = root / ".epoch=1-step=6.partial"
    assert partial.is_dir() and (partial / "model.safetensors").is_file() and not (partial / "manifest.json").exists()
    assert not (root / "epoch=1-step=6").exists()
    assert verify_checkpoint(root / "epoch=0-step=4")["global_step"] == 4  # the previous checkpoint is intact
    assert find_last_checkpoint(root) == root / "epoch=0-step=4"
    second = _phase(tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["first_step_resumed"] == 5 and report["global_step"] == TOTAL_STEPS
    assert not partial.exists() and verify_checkpoint(root / "epoch=1-step=6")["global_step"] == 6
    _assert_equal_to(tmp_path / "final.safetensors", _straight_weights(tmp_path / "straight"))


# ------------------------------------------------------------------------------- the training process
def main(root: Path, kill_at_step: int, kill_in_save_at_step: int) -> None:
    """Train to TOTAL_STEPS with a checkpoint every EVERY steps, resuming from "last"; optionally die."""
    from safetensors.torch import save_file

    from callbacks.base import Callback
    from strategies.checkpoint_io import CheckpointWriter
    from tests.unit.test_checkpoint_resume import run_fit

    class Killer(Callback):
        """SIGKILLs this process in the middle of the accumulation window after step `kill_at_step`."""

        def on_after_backward(self, trainer: Any, module: Any) -> None:
            if trainer.global_step == kill_at_step:
                os.kill(os.getpid(), signal.SIGKILL)

    class FirstStep(Callback):
        def __init__(self) -> None:
            self.first: int | None = None

        def on_before_optimizer_step(self, trainer: Any, module: Any, optimizer: Any) -> None:
            self.first = trainer.global_step + 1 if self.first is None else self.first  # the number of the step it takes

    if kill_in_save_at_step:
        commit = CheckpointWriter.commit

        def dying_commit(self: CheckpointWriter, meta: dict[str, Any], others: Any = ()) -> Path:
            if meta["global_step"] == kill_in_save_at_step:  # every other file of the checkpoint is written
                os.kill(os.getpid(), signal.SIGKILL)
            return commit(self, meta, others)

        CheckpointWriter.commit = dying_commit  # type: ignore[method-assign]
    first = FirstStep()
    module, trainer, _ = run_fit(
        # the first process starts like the uninterrupted run; the resuming one from other weights, which "last" replaces
        root, TOTAL_STEPS, ckpt_path="last", every_n_train_steps=EVERY, init_seed=1 if kill_at_step or kill_in_save_at_step else 99,
        extra_callbacks=(Killer(), first) if kill_at_step else (first,),
    )
    save_file({k: v.contiguous() for k, v in module.state_dict().items()}, str(root / "final.safetensors"))
    (root / "report.json").write_text(json.dumps({"global_step": trainer.global_step, "first_step_resumed": first.first}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
