"""Preemption: SIGTERM (spot instances, Kubernetes) or SIGUSR1 (SLURM's ``--signal=USR1@90``) during ``fit``.

The handler only records the signal (`trainer.accelerator.signals.SignalRecorder`). The processes agree on it
at scheduled batches (`trainer.fit.agreement`: within about ``stop_check_interval`` seconds, default 1), at an
optimizer-step boundary, write one complete checkpoint
(``preempted-epoch=E-step=S`` in the checkpoint directory, named by its ``last.json``), and exit with
``128 + signal`` (143 for SIGTERM, 138 for SIGUSR1). ``fit(ckpt_path="last")`` then resumes bit-exactly.

Under SLURM, SIGUSR1 (the ``--signal=USR1@N`` warning before the time limit) also requeues the job, as
Lightning's ``SLURMEnvironment(auto_requeue=True)`` does: global rank 0 runs ``scontrol requeue <job id>``
after the checkpoint is complete. ``TRAINWRIGHT_SLURM_REQUEUE=0`` turns that off.
"""

from __future__ import annotations

import os
import signal
import subprocess
from typing import TYPE_CHECKING

from callbacks.checkpoint import ModelCheckpoint
from callbacks.view import Preempted
from strategies.checkpoint_store import write_last_pointer
from trainer.fit.checkpointing import default_checkpoint_dir

if TYPE_CHECKING:
    from trainer.fit.trainer import Trainer

def due(trainer: Trainer) -> bool:
    """True when the processes agreed on a signal and the loop is at an optimizer-step boundary."""
    return bool(trainer.agreement.signal) and trainer.run_state.progress.at_boundary


def checkpoint_and_exit(trainer: Trainer) -> None:
    """Write the preemption checkpoint (every process), point ``last.json`` at it, and raise `Preempted`."""
    callback = next((cb for cb in trainer.callbacks if isinstance(cb, ModelCheckpoint)), None)
    folder = callback.resolve_dirpath(trainer) if callback is not None else default_checkpoint_dir(trainer)
    state = trainer.run_state
    path = folder / f"preempted-epoch={state.current_epoch}-step={state.global_step}"
    trainer.save_checkpoint(path, async_save=False)  # (waits for a save in flight first; the process exits next)
    signum = int(trainer.agreement.signal)
    if trainer.is_global_zero:
        write_last_pointer(folder, path)
        name = signal.Signals(signum).name
        print(f"Trainer: {name} received; saved {path} at step {state.global_step}; exiting with code {128 + signum}. "
              'Resume with fit(..., ckpt_path="last").', flush=True)
        if signum == getattr(signal, "SIGUSR1", None):
            requeue_slurm_job()
    raise Preempted(signum, path)


def requeue_slurm_job() -> bool:
    """``scontrol requeue`` this SLURM job (batch jobs only, unless ``TRAINWRIGHT_SLURM_REQUEUE=0``); True if it was requeued."""
    job = os.environ.get("SLURM_JOB_ID")
    if not job or os.environ.get("TRAINWRIGHT_SLURM_REQUEUE", "1") == "0" or os.environ.get("SLURM_JOB_NAME") in ("bash", "interactive"):
        return False
    if os.environ.get("SLURM_ARRAY_JOB_ID"):
        job = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ.get('SLURM_ARRAY_TASK_ID', '')}"
    try:
        done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as err:
        print(f"Trainer: could not requeue SLURM job {job} ({err}); requeue it yourself: scontrol requeue {job}", flush=True)
        return False
    if done.returncode != 0:
        print(f"Trainer: `scontrol requeue {job}` failed ({done.stderr.strip() or done.returncode}); requeue it yourself", flush=True)
        return False
    print(f"Trainer: requeued SLURM job {job}", flush=True)
    return True
