"""Resume after ``kill -9``: a training process that dies (at a step drawn from a seed, during validation,
or in the middle of writing a checkpoint) is restarted with ``fit(ckpt_path="last")`` and ends with the same
weights as a run that was never interrupted. Each phase runs in its own process (``python -m
tests.integration.test_resume_kill``, forked from the tests' warm server by `tests.helpers.scripts.run_python`). Part of the fault-injection suite (``pytest -m faults``).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.scripts import run_python

pytestmark = pytest.mark.faults

REPO = Path(__file__).resolve().parents[2]
TOTAL_STEPS, EVERY, VALIDATE_EVERY = 11, 2, 3
CURRICULUM_STEPS, CURRICULUM_EVERY = 25, 3


def _phase(root: Path, *, kill_at_step: int = 0, kill_in_save_at_step: int = 0, kill_in_val_at_step: int = 0,
           curriculum: bool = False) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "tests.integration.test_resume_kill", str(root), str(kill_at_step), str(kill_in_save_at_step),
           str(kill_in_val_at_step), "curriculum" if curriculum else "plain"]
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return run_python(cmd, cwd=root, env=env, timeout=240)  # (a real process, forked from the warm server, really killed)


def _straight_weights(root: Path, validate_every: int = 0) -> dict[str, Any]:
    from tests.unit.test_checkpoint_resume import run_fit

    module, _, _ = run_fit(root, TOTAL_STEPS, validate_every=validate_every)
    return module.state_dict()


def _assert_equal_to(final: Path, expected: dict[str, Any]) -> None:
    import torch
    from safetensors.torch import load_file

    got = load_file(str(final))
    assert got.keys() == expected.keys()
    assert [k for k in got if not torch.equal(got[k], expected[k])] == [], "weights differ from the uninterrupted run"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kill_at_a_random_step_then_resume_matches_an_uninterrupted_run(tmp_path: Path, seed: int) -> None:
    from trainer.fit.checkpointing import find_last_checkpoint, verify_checkpoint

    kill_at = random.Random(seed).randint(EVERY, TOTAL_STEPS - 1)  # after the first checkpoint, before the end
    first = _phase(tmp_path, kill_at_step=kill_at)
    assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]
    assert not (tmp_path / "final.safetensors").exists()
    saved = kill_at // EVERY * EVERY
    assert verify_checkpoint(find_last_checkpoint(tmp_path / "ckpts"))["global_step"] == saved, f"killed after step {kill_at}"
    second = _phase(tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["first_step_resumed"] == saved + 1 and report["global_step"] == TOTAL_STEPS
    _assert_equal_to(tmp_path / "final.safetensors", _straight_weights(tmp_path / "straight"))


@pytest.mark.timeout(600)
def test_kill_during_validation_then_resume_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    first = _phase(tmp_path, kill_in_val_at_step=7)
    assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]
    assert (tmp_path / "killed_in_validation").exists()
    second = _phase(tmp_path, kill_in_val_at_step=-1)  # validates like the first, without dying
    assert second.returncode == 0, second.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["global_step"] == TOTAL_STEPS
    _assert_equal_to(tmp_path / "final.safetensors", _straight_weights(tmp_path / "straight", validate_every=VALIDATE_EVERY))


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


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("kill_at", "saved"), [(8, 6), (17, 15)], ids=["mid-epoch-1", "epoch-3"])
def test_kill_with_reloaded_dataloaders_then_resume_matches_an_uninterrupted_run(tmp_path: Path, kill_at: int, saved: int) -> None:
    # the loaders are rebuilt every 2 epochs (a curriculum: 5 steps per epoch); the resumed process must rebuild them at
    # the same epochs as the uninterrupted run (before, it counted 2 epochs from the restored one)
    from tests.unit.test_checkpoint_resume import fit_curriculum
    from trainer.fit.checkpointing import find_last_checkpoint, verify_checkpoint

    first = _phase(tmp_path, kill_at_step=kill_at, curriculum=True)
    assert first.returncode == -signal.SIGKILL, first.stderr[-3000:]
    assert verify_checkpoint(find_last_checkpoint(tmp_path / "ckpts"))["global_step"] == saved
    second = _phase(tmp_path, curriculum=True)
    assert second.returncode == 0, second.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    straight, _ = fit_curriculum(tmp_path / "straight", CURRICULUM_STEPS, stop_step=CURRICULUM_EVERY)
    assert report["global_step"] == CURRICULUM_STEPS and report["loads"][-1] == 4 and 3 not in report["loads"]
    _assert_equal_to(tmp_path / "final.safetensors", straight.state_dict())


# ------------------------------------------------------------------------------- the training process
def curriculum_main(root: Path, kill_at_step: int) -> None:
    """Train the curriculum (loaders rebuilt every 2 epochs) to CURRICULUM_STEPS, resuming from "last"; optionally die."""
    from safetensors.torch import save_file

    from callbacks.base import Callback
    from tests.unit.test_checkpoint_resume import fit_curriculum

    class Killer(Callback):
        def on_after_backward(self, trainer: Any, module: Any) -> None:
            if trainer.global_step == kill_at_step:
                os.kill(os.getpid(), signal.SIGKILL)

    module, trainer = fit_curriculum(root, CURRICULUM_STEPS, stop_step=CURRICULUM_EVERY, init_seed=1 if kill_at_step else 99,
                                     ckpt_path="last", extra_callbacks=(Killer(),) if kill_at_step else ())
    save_file({k: v.contiguous() for k, v in module.state_dict().items()}, str(root / "final.safetensors"))
    (root / "report.json").write_text(json.dumps({"global_step": trainer.global_step, "loads": module.loads}))



def main(root: Path, kill_at_step: int, kill_in_save_at_step: int, kill_in_val_at_step: int) -> None:
    """Train to TOTAL_STEPS with a checkpoint every EVERY steps, resuming from "last"; optionally die.

    ``kill_in_val_at_step`` > 0 validates every VALIDATE_EVERY batches and dies in the middle of the first
    validation at or after that step; -1 validates the same way without dying.
    """
    from safetensors.torch import save_file

    from callbacks.base import Callback
    from strategies.checkpoint_io import CheckpointWriter
    from tests.unit.test_checkpoint_resume import run_fit

    class Killer(Callback):
        """SIGKILLs this process in the middle of the accumulation window after step `kill_at_step`."""

        def on_after_backward(self, trainer: Any, module: Any) -> None:
            if trainer.global_step == kill_at_step:
                os.kill(os.getpid(), signal.SIGKILL)

    class ValidationKiller(Callback):
        def on_validation_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
            if trainer.global_step >= kill_in_val_at_step > 0 and batch_idx == 1:
                (root / "killed_in_validation").write_text(str(trainer.global_step))
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
    killers = (Killer(),) if kill_at_step else (ValidationKiller(),) if kill_in_val_at_step > 0 else ()
    dies = bool(kill_at_step or kill_in_save_at_step or kill_in_val_at_step > 0)
    module, trainer, _ = run_fit(
        # the first process starts like the uninterrupted run; the resuming one from other weights, which "last" replaces
        root, TOTAL_STEPS, ckpt_path="last", every_n_train_steps=EVERY, init_seed=1 if dies else 99,
        extra_callbacks=(*killers, first), validate_every=VALIDATE_EVERY if kill_in_val_at_step else 0,
    )
    save_file({k: v.contiguous() for k, v in module.state_dict().items()}, str(root / "final.safetensors"))
    (root / "report.json").write_text(json.dumps({"global_step": trainer.global_step, "first_step_resumed": first.first}))


if __name__ == "__main__":
    if sys.argv[5] == "curriculum":
        curriculum_main(Path(sys.argv[1]), int(sys.argv[2]))
    else:
        main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
