"""Resume after ``kill -9`` on 2 processes under the sharding strategies (FSDP, DeepSpeed ZeRO 2 and 3): a rank
SIGKILLed mid-epoch, the job restarted with ``fit(ckpt_path="last")``, ends with the same weights, bit for bit,
as a run never interrupted. The killed and the resumed run are jobs of two real processes (``python -m
tests.distributed.test_sharded_resume_kill``, forked as torchrun would start them by `tests.helpers.scripts.run_python`);
the uninterrupted reference runs through ``run_distributed``.
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

from tests.helpers.multiprocess import run_distributed
from tests.helpers.scripts import run_python

pytestmark = [pytest.mark.distributed, pytest.mark.faults]

REPO = Path(__file__).resolve().parents[2]
TOTAL_STEPS, EVERY, KILL_AT = 9, 3, 5


def _phase(root: Path, kill_at_step: int, strategy: str) -> subprocess.CompletedProcess:
    """One job on two real processes, started as ``torchrun --nproc_per_node 2`` starts them (forked from the tests'
    warm server: the kill and the resume are the subject, not the launch; when rank 0 is killed the other is stopped,
    as torchrun's agent stops it)."""
    cmd = [sys.executable, "-m", "tests.distributed.test_sharded_resume_kill", str(root), str(kill_at_step), strategy]
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), "TRAINWRIGHT_PG_TIMEOUT": "60"}
    return run_python(cmd, cwd=root, env=env, timeout=240, nprocs=2)


# each rank's own files in the checkpoint: FSDP's DCP shards, DeepSpeed's optimizer partitions
SHARD_FILES = {
    "fsdp": {"sharded/__0_0.distcp", "sharded/__1_0.distcp"},
    "deepspeed_stage_2": {f"deepspeed/state/bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in (0, 1)},
    "deepspeed_stage_3": {f"deepspeed/state/bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in (0, 1)},
}


def _uninterrupted(root: Path, strategy: str) -> None:
    """The run never killed, on two ``run_distributed`` processes, with the one thread ``torchrun`` gives each, so its
    weights compare bit for bit with the resumed run's."""
    import torch

    torch.set_num_threads(1)
    os.chdir(root)
    main(root, 0, strategy)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("strategy", sorted(SHARD_FILES))
def test_kill_mid_epoch_then_resume_is_bit_exact(strategy: str, tmp_path: Path) -> None:
    if strategy.startswith("deepspeed"):
        pytest.importorskip("deepspeed", reason="the deepspeed extra is not installed: pip install -e '.[deepspeed]'")
    import torch
    from safetensors.torch import load_file

    from trainer.fit.checkpointing import find_last_checkpoint, verify_checkpoint

    straight, run = tmp_path / "straight", tmp_path / "run"
    straight.mkdir(), run.mkdir()
    run_distributed(_uninterrupted, straight, strategy)  # the reference (the launch is not its subject)
    killed = _phase(run, KILL_AT, strategy)
    assert killed.returncode != 0 and not (run / "final.safetensors").exists(), killed.stderr[-3000:]
    last = find_last_checkpoint(run / "ckpts")
    assert last is not None and verify_checkpoint(last)["global_step"] == 3
    assert SHARD_FILES[strategy] <= set(verify_checkpoint(last)["files"])
    resumed = _phase(run, 0, strategy)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    report = json.loads((run / "report.json").read_text())
    assert report == {"global_step": TOTAL_STEPS, "first_step_resumed": 4}
    want, got = load_file(str(straight / "final.safetensors")), load_file(str(run / "final.safetensors"))
    assert want.keys() == got.keys() and [k for k in want if not torch.equal(want[k], got[k])] == []


# ------------------------------------------------------------------------------- the training job
def main(root: Path, kill_at_step: int, strategy: str) -> None:
    """Train to TOTAL_STEPS with `strategy` and a checkpoint every EVERY steps, resuming from "last"; rank 0 may die."""
    from safetensors.torch import save_file

    from callbacks.base import Callback
    from tests.unit.test_checkpoint_resume import run_fit

    class Killer(Callback):
        """SIGKILLs rank 0 between backward and the optimizer step after step `kill_at_step`."""

        def on_after_backward(self, trainer: Any, module: Any) -> None:
            if trainer.global_step == kill_at_step and trainer.global_rank == 0:
                os.kill(os.getpid(), signal.SIGKILL)

    class FirstStep(Callback):
        def __init__(self) -> None:
            self.first: int | None = None

        def on_before_optimizer_step(self, trainer: Any, module: Any, optimizer: Any) -> None:
            self.first = trainer.global_step + 1 if self.first is None else self.first  # the number of the step it takes

    first = FirstStep()
    resuming = (root / "ckpts").is_dir()
    module, trainer, _ = run_fit(
        root, TOTAL_STEPS, ckpt_path="last", every_n_train_steps=EVERY, init_seed=99 if resuming else 1, strategy=strategy,
        extra_callbacks=(Killer(), first) if kill_at_step else (first,),
    )
    full = trainer.strategy.module_state_dict(module)
    if trainer.is_global_zero:
        save_file({k: v.contiguous() for k, v in full.items()}, str(root / "final.safetensors"))
        (root / "report.json").write_text(json.dumps({"global_step": trainer.global_step, "first_step_resumed": first.first}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
