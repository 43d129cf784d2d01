"""Resume after ``kill -9`` with pipeline stages on 2 processes (1F1B, Adam): process 0 (the first stage) SIGKILLed
mid-epoch, the job restarted with ``fit(ckpt_path="last")``, ends with the same weights, bit for bit, as a run never
interrupted; its sharded checkpoint (each stage's weights and optimizer state, flattened by parameter name) loads into
one plain process. The killed and the resumed run are jobs of two real processes (``python -m
tests.distributed.test_pipeline_resume_kill``, started as torchrun would by `tests.helpers.scripts.run_python`); the
uninterrupted reference runs through ``run_distributed``.
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
TOTAL_STEPS, EVERY, KILL_AT = 6, 2, 3


def _phase(root: Path, kill_at_step: int) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "tests.distributed.test_pipeline_resume_kill", str(root), str(kill_at_step)]
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), "TRAINWRIGHT_PG_TIMEOUT": "60"}
    return run_python(cmd, cwd=root, env=env, timeout=240, nprocs=2)


def _uninterrupted(root: Path) -> None:
    import torch

    torch.set_num_threads(1)  # torchrun's one thread, so the weights compare bit for bit
    os.chdir(root)
    main(root, 0)


@pytest.mark.timeout(600)
def test_kill_mid_epoch_then_resume_is_bit_exact_and_loads_into_one_process(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file

    from strategies.checkpoint_io import load_weights
    from tests.distributed.test_pipeline import _module
    from trainer.fit.checkpointing import find_last_checkpoint, verify_checkpoint

    straight, run = tmp_path / "straight", tmp_path / "run"
    straight.mkdir(), run.mkdir()
    run_distributed(_uninterrupted, straight)
    killed = _phase(run, KILL_AT)
    assert killed.returncode != 0 and not (run / "final.safetensors").exists(), killed.stderr[-3000:]
    last = find_last_checkpoint(run / "ckpts")
    assert last is not None and verify_checkpoint(last)["global_step"] == 2
    assert {"sharded/__0_0.distcp", "sharded/__1_0.distcp"} <= set(verify_checkpoint(last)["files"])
    resumed = _phase(run, 0)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert json.loads((run / "report.json").read_text()) == {"global_step": TOTAL_STEPS}
    want, got = load_file(str(straight / "final.safetensors")), load_file(str(run / "final.safetensors"))
    assert want.keys() == got.keys() and [k for k in want if not torch.equal(want[k], got[k])] == []
    plain = _module(False)  # one process, no process group: the last checkpoint's stages make the whole model
    load_weights(find_last_checkpoint(run / "ckpts"), plain)
    assert all(torch.equal(plain.state_dict()[k], want[k]) for k in want)


# ------------------------------------------------------------------------------- the training job
def main(root: Path, kill_at_step: int) -> None:
    """Train to TOTAL_STEPS on 2 pipeline stages with a checkpoint every EVERY steps, resuming from "last"."""
    import torch
    from safetensors.torch import save_file

    from callbacks import ModelCheckpoint
    from callbacks.base import Callback
    from strategies import FSDPStrategy, ParallelDims
    from tests.distributed.test_pipeline import _dataset, _module
    from trainer import Trainer

    class Killer(Callback):
        """SIGKILLs process 0 after the pipeline step of step `kill_at_step`, before the optimizer step."""

        def on_after_backward(self, trainer: Any, module: Any) -> None:
            if trainer.global_step == kill_at_step and trainer.global_rank == 0:
                os.kill(os.getpid(), signal.SIGKILL)

    module = _module(True, adam=True)
    callbacks: list[Callback] = [ModelCheckpoint(dirpath=root / "ckpts", every_n_train_steps=EVERY, save_top_k=-1)]
    trainer = Trainer(strategy=FSDPStrategy(parallel_dims=ParallelDims(world_size=2, pp=2), cpu=True), accelerator="cpu",
                      max_steps=TOTAL_STEPS, max_epochs=10, log_with=None, enable_progress_bar=False, enable_model_summary=False,
                      callbacks=[*callbacks, Killer()] if kill_at_step else callbacks, project_dir=str(root), seed=1234)
    loader = torch.utils.data.DataLoader(_dataset(), batch_size=4, shuffle=True)
    trainer.fit(module, loader, ckpt_path="last")
    full = trainer.strategy.module_state_dict(module)
    if trainer.is_global_zero:
        save_file({k: v.contiguous() for k, v in full.items()}, str(root / "final.safetensors"))
        (root / "report.json").write_text(json.dumps({"global_step": trainer.global_step}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
