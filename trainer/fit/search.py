"""A search inside the run it tunes: the plumbing `trainer.fit.lr_finder` and `trainer.fit.batch_size_scaling` share.

A search runs from a finder callback's start hook (``on_fit_start``, ...), on the Trainer's own loops
(`trainer.fit.loops`), as Lightning's does: `state_kept` takes a snapshot of the run's state (``trainer.run_state``,
one `RunState`: position, limits, stage and flags, optimizers and schedulers) and saves the tensors to a hidden
checkpoint under ``project_dir`` (weights, optimizers, schedulers, loader positions, RNG states), `run_training`
trains with only the search's own callback (no trackers, checkpoints or progress bar), and both are put back after
it, so the run continues (or a later ``fit`` starts) exactly as if no search had run, except for what the search
sets on purpose (the lr, the batch size). Started through the `Tuner` (`trainer.fit.tuner`), the search then ends the
run (`TunerExit`).
"""

from __future__ import annotations

import contextlib
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
    """Take a snapshot of the run's state and save its tensors to a hidden checkpoint under ``project_dir``; after
    the block put back the run state (one unit: position, limits, flags, optimizers, schedulers, the loss checks),
    the checkpoint and what else a search changes on the Trainer (its callbacks and dispatcher, its arguments, the
    metrics shown), then delete the checkpoint."""
    acc = trainer.accelerator
    path = str(Path(trainer.project_dir).absolute() / f".{name}_{uuid.uuid4().hex}")
    if trainer.world_size > 1:
        path = acc.broadcast_object(path)
    save_checkpoint(trainer, path)
    metrics = [trainer.callback_metrics, trainer.logged_metrics, trainer.progress_bar_metrics]
    saved = SimpleNamespace(
        run=trainer.run_state.snapshot(), callbacks=trainer.callbacks, dispatch=trainer.dispatch,
        metrics=[dict(m) for m in metrics], batch_idx=0,
    )
    # a search drives the loss to diverge on purpose: no on_nonfinite policy stops it (its suggestion skips such points),
    # nor is it warned about; the run state's restore below puts the policy back
    trainer.run_state.loss_health.policy, trainer.run_state.loss_health.warned_nonfinite = None, True
    try:
        yield saved
    finally:
        trainer.callbacks, trainer.dispatch = saved.callbacks, saved.dispatch
        trainer.run_state.restore(saved.run)
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
    trainer.dispatch = HookDispatcher(trainer.attached_module, TrainModule, trainer.callbacks, trainer)
    state = trainer.run_state
    state.max_steps, state.training, state.should_stop = max_steps, True, False
    while not loops.fit_done(trainer):
        loops.train_epoch(trainer, val_loaders)
