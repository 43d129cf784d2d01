"""A search inside the run it tunes: the plumbing `trainer.fit.lr_finder` and `trainer.fit.batch_size_scaling` share.

A search runs from a finder callback's start hook (``on_fit_start``, ...), on the Trainer's own loops
(`trainer.fit.loops`), as Lightning's does: `state_kept` saves the run's state to a hidden checkpoint under
``project_dir`` first (weights, optimizers, schedulers, loop position, loader positions, RNG states), `run_training`
trains with only the search's own callback (no trackers, checkpoints or progress bar), and the checkpoint is restored
after it, so the run continues (or a later ``fit`` starts) exactly as if no search had run, except for what the search
sets on purpose (the lr, the batch size). Started through the `Tuner` (`trainer.fit.tuner`), the search then ends the
run (`TunerExit`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from trainer.fit import loops
from trainer.fit.checkpointing import restore_checkpoint, save_checkpoint
from trainer.fit.dispatch import HookDispatcher
from trainer.fit.module import TrainModule

if TYPE_CHECKING:
    from callbacks.base import Callback
    from trainer.fit.trainer import Trainer


class TunerExit(Exception):
    """Raised by a search started from the `Tuner`: the run it ran in ends there (`Trainer` returns normally)."""


@contextlib.contextmanager
def state_kept(trainer: Trainer, name: str) -> Iterator[SimpleNamespace]:
    """Save the run's state to a hidden checkpoint under ``project_dir``, and after the block restore it and the
    Trainer's settings a search changes (callbacks, schedulers, ``max_steps``, the metrics shown), then delete it."""
    acc = trainer.accelerator
    path = str(Path(trainer.project_dir).absolute() / f".{name}_{uuid.uuid4().hex}")
    if trainer.world_size > 1:
        path = acc.broadcast_object(path)
    save_checkpoint(trainer, path)
    metrics = [trainer.callback_metrics, trainer.logged_metrics, trainer.progress_bar_metrics]
    saved = SimpleNamespace(
        callbacks=trainer.callbacks, dispatch=trainer.dispatch, configs=trainer.lr_scheduler_configs,
        max_steps=trainer.max_steps, training=trainer.training, metrics=[dict(m) for m in metrics], batch_idx=0,
        args=trainer._args, loss_health=trainer.loss_health.snapshot(),
    )
    # a search drives the loss to diverge on purpose: no on_nonfinite policy stops it (its suggestion skips such points)
    trainer._args = dataclasses.replace(trainer._args, on_nonfinite=None)
    trainer.loss_health.warned_nonfinite = True  # (nor is it warned about)
    try:
        yield saved
    finally:
        trainer.callbacks, trainer._dispatch, trainer._args = saved.callbacks, saved.dispatch, saved.args
        trainer.lr_scheduler_configs, trainer.max_steps, trainer.training = saved.configs, saved.max_steps, saved.training
        trainer.loss_health.restore(saved.loss_health)
        trainer.should_stop = False
        for target, values in zip(metrics, saved.metrics):
            target.clear()
            target.update(values)
        try:
            restore_checkpoint(trainer, path)
        finally:
            acc.wait_for_everyone()
            if acc.is_main_process:
                shutil.rmtree(path, ignore_errors=True)


def run_training(trainer: Trainer, callbacks: list[Callback], *, max_steps: int, val_loaders: list[Any] | None) -> None:
    """Train from the current position until `max_steps` (or a stop, or ``max_epochs``) with only `callbacks`."""
    trainer.callbacks = list(callbacks)
    trainer._dispatch = HookDispatcher(trainer.attached_module, TrainModule, trainer.callbacks, trainer)
    trainer.max_steps = max_steps
    trainer.training, trainer.should_stop = True, False
    while not loops.fit_done(trainer):
        loops.train_epoch(trainer, val_loaders)
