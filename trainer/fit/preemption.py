"""Preemption: SIGTERM (spot instances, Kubernetes) or SIGUSR1 (SLURM's ``--signal=USR1@90``) during ``fit``.

The handler only records the signal. The processes agree on it with the per-batch flags they already
exchange, train on to the next optimizer-step boundary, write one complete checkpoint
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
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer.fit.trainer import Trainer

SIGNALS = tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGUSR1", None)) if s is not None)


class Preempted(SystemExit):
    """Raised (on every process) after the preemption checkpoint is written; its code is ``128 + signal``."""

    def __init__(self, signum: int, checkpoint: Path) -> None:
        super().__init__(128 + signum)
        self.signum, self.checkpoint = signum, checkpoint


def install(trainer: Trainer) -> dict[int, Any]:
    """Record SIGTERM/SIGUSR1 in ``trainer.received_signal`` (main thread only; handlers the user set are kept)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    previous = {}
    for signum in SIGNALS:
        current = signal.getsignal(signum)
        if current is not signal.SIG_DFL:
            continue  # the user's own handler wins

        def record(received: int, frame: Any) -> None:
            trainer.received_signal = trainer.received_signal or received

        previous[signum] = signal.signal(signum, record)
    return previous


def restore(previous: dict[int, Any]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def due(trainer: Trainer) -> bool:
    """True when the processes agreed on a signal and the loop is at an optimizer-step boundary."""
    return bool(trainer.agreed_signal) and trainer.fit_loop_state["accumulation_position"] == 0


def checkpoint_and_exit(trainer: Trainer) -> None:
    """Write the preemption checkpoint (every process), point ``last.json`` at it, and raise `Preempted`."""
    from callbacks.checkpoint import ModelCheckpoint
    from trainer.fit.checkpointing import default_checkpoint_dir, write_last_pointer

    callback = next((cb for cb in trainer.callbacks if isinstance(cb, ModelCheckpoint)), None)
    folder = callback.resolve_dirpath(trainer) if callback is not None else default_checkpoint_dir(trainer)
    path = folder / f"preempted-epoch={trainer.current_epoch}-step={trainer.global_step}"
    trainer.save_checkpoint(path)
    signum = int(trainer.agreed_signal)
    if trainer.is_global_zero:
        write_last_pointer(folder, path)
        name = signal.Signals(signum).name
        print(f"Trainer: {name} received; saved {path} at step {trainer.global_step}; exiting with code {128 + signum}. "
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
