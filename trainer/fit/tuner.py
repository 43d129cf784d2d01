"""Lightning's tuners on the `Trainer`: `Tuner` (``lr_find``, ``scale_batch_size``) and the run plumbing the
`LearningRateFinder`/`BatchSizeFinder` callbacks reach through ``trainer.run_tuner``.

    tuner = Tuner(trainer)                   # (``from trainer.tuner import Tuner``: Lightning's path, renamed)
    lr_finder = tuner.lr_find(module, datamodule=dm)      # runs trainer.fit with a LearningRateFinder in front;
    lr_finder.suggestion(), lr_finder.results             #   the search ends that fit, the module keeps the lr
    tuner.scale_batch_size(module, datamodule=dm)         # the same with a BatchSizeFinder
    trainer.fit(module, datamodule=dm)                    # the real run, on the same Trainer

A search runs inside the run it tunes, from the callback's start hook (``on_fit_start``, ...), on the Trainer's own
loops (`trainer.fit.loops`), as Lightning's does: the run's state is saved to a hidden checkpoint under
``project_dir`` first (weights, optimizers, schedulers, loop position, loader positions, RNG states), the search
trains with only its own callback (no trackers, checkpoints or progress bar), and the checkpoint is restored after
it, so the run continues (or a later ``fit`` starts) exactly as if no search had run, except for what the search
sets on purpose (the lr, the batch size). Through the `Tuner` the search then ends the run (`TunerExit`).
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
    from trainer.fit.lr_finder import LRFinder
    from trainer.fit.trainer import Trainer

METHODS = ("fit", "validate", "test", "predict")


class TunerExit(Exception):
    """Raised by a search started from the `Tuner`: the run it ran in ends there (`Trainer` returns normally)."""


class Tuner:
    """Lightning's ``Tuner``: finds a learning rate or a batch size by running `trainer`'s own fit."""

    def __init__(self, trainer: Trainer) -> None:
        from trainer.fit.trainer import Trainer  # lazy: import cycle (the Trainer imports this module's TunerExit)

        if not isinstance(trainer, Trainer):
            raise TypeError(f"Tuner(trainer) needs a trainer.Trainer, got {type(trainer).__name__}")
        self._trainer = trainer

    def lr_find(
        self, model: TrainModule, train_dataloaders: Any = None, val_dataloaders: Any = None, dataloaders: Any = None,
        datamodule: Any = None, method: str = "fit", min_lr: float = 1e-8, max_lr: float = 1, num_training: int = 100,
        mode: str = "exponential", early_stop_threshold: float | None = 4.0, update_attr: bool = True, attr_name: str = "",
    ) -> LRFinder | None:
        """The learning-rate range test (Lightning 2.6's): `num_training` steps from `min_lr` to `max_lr`, stopped
        early once the smoothed loss passes `early_stop_threshold` x its best; returns the `LRFinder` (None under
        ``fast_dev_run``). With `update_attr` the suggestion is written to the module's ``lr``/``learning_rate`` (or
        `attr_name`), on the module or in its hparams. Everything else is as before the call."""
        from callbacks.lr_finder import LearningRateFinder  # lazy: `trainer.fit` loads no built-in callback until used

        if method != "fit":
            raise ValueError(f"lr_find(method={method!r}): the learning rate finder runs in fit only; pass method='fit'")
        _check_configuration(train_dataloaders, val_dataloaders, dataloaders, method)
        if any(isinstance(cb, LearningRateFinder) for cb in self._trainer.callbacks):
            raise ValueError("the Trainer already has a LearningRateFinder callback; remove it to use Tuner.lr_find")
        finder = LearningRateFinder(min_lr=min_lr, max_lr=max_lr, num_training_steps=num_training, mode=mode,
                                    early_stop_threshold=early_stop_threshold, update_attr=update_attr, attr_name=attr_name)
        finder._early_exit = True
        self._run(finder, model, "fit", train_dataloaders, val_dataloaders, None, datamodule)
        found: LRFinder | None = finder.optimal_lr
        return found

    def scale_batch_size(
        self, model: TrainModule, train_dataloaders: Any = None, val_dataloaders: Any = None, dataloaders: Any = None,
        datamodule: Any = None, method: str = "fit", mode: str = "power", steps_per_trial: int = 3, init_val: int = 2,
        max_trials: int = 25, batch_arg_name: str = "batch_size", margin: float = 0.05, max_val: int = 8192,
    ) -> int | None:
        """The largest batch size that runs without running out of memory (Lightning 2.6's search): ``"power"``
        doubles from `init_val` until a trial fails, ``"binsearch"`` then bisects (and keeps `margin` below the
        result). Each trial runs `steps_per_trial` steps of `method`. The size is read from and written to
        `batch_arg_name` on the module, its hparams or the datamodule, whose ``*_dataloader()`` must use it."""
        from callbacks.batch_size_finder import BatchSizeFinder  # lazy: `trainer.fit` loads no built-in callback until used

        _check_configuration(train_dataloaders, val_dataloaders, dataloaders, method)
        if self._trainer.world_size > 1:
            raise ValueError(f"scale_batch_size runs in one process (this Trainer has {self._trainer.world_size}), as Lightning's")
        if any(isinstance(cb, BatchSizeFinder) for cb in self._trainer.callbacks):
            raise ValueError("the Trainer already has a BatchSizeFinder callback; remove it to use Tuner.scale_batch_size")
        finder = BatchSizeFinder(mode=mode, steps_per_trial=steps_per_trial, init_val=init_val, max_trials=max_trials,
                                 batch_arg_name=batch_arg_name, margin=margin, max_val=max_val)
        finder._early_exit = True
        self._run(finder, model, method, train_dataloaders, val_dataloaders, dataloaders, datamodule)
        return finder.optimal_batch_size

    def _run(self, finder: Callback, model: TrainModule, method: str, train: Any, val: Any, loaders: Any, datamodule: Any) -> None:
        trainer = self._trainer
        trainer.callbacks = [finder, *trainer.callbacks]
        try:
            if method == "fit":
                trainer.fit(model, train, val, datamodule)
            elif method == "predict":
                trainer.predict(model, loaders, datamodule=datamodule)
            else:  # the run ends at the search: there are no results to print
                getattr(trainer, method)(model, loaders, datamodule=datamodule, verbose=False)
        finally:
            trainer.callbacks = [cb for cb in trainer.callbacks if cb is not finder]


def _check_configuration(train_dataloaders: Any, val_dataloaders: Any, dataloaders: Any, method: str) -> None:
    if method not in METHODS:
        raise ValueError(f"method={method!r} is not one of {METHODS}")
    if method == "fit" and dataloaders is not None:
        raise ValueError("with method='fit' pass train_dataloaders= and val_dataloaders=, not dataloaders=")
    if method != "fit" and (train_dataloaders is not None or val_dataloaders is not None):
        raise ValueError(f"with method={method!r} pass dataloaders=, not train_dataloaders=/val_dataloaders=")


def run_finder(trainer: Trainer, finder: Any, module: TrainModule) -> Any:
    """``trainer.run_tuner(finder, module)``: the search a `LearningRateFinder`/`BatchSizeFinder` asks for, with its
    settings; raises `TunerExit` after it when the `Tuner` started it."""
    # lazy: the finders load only when one runs
    from callbacks.batch_size_finder import BatchSizeFinder
    from callbacks.lr_finder import LearningRateFinder

    if isinstance(finder, LearningRateFinder):
        from trainer.fit.lr_finder import lr_find  # lazy: import cycle (it reads this module's run plumbing)

        result: Any = lr_find(
            trainer, module, min_lr=finder._min_lr, max_lr=finder._max_lr, num_training=finder._num_training_steps,
            mode=finder._mode, early_stop_threshold=finder._early_stop_threshold, update_attr=finder._update_attr,
            attr_name=finder._attr_name,
        )
    elif isinstance(finder, BatchSizeFinder):
        from trainer.fit.batch_size_scaling import scale_batch_size  # lazy: import cycle (it reads this module's run plumbing)

        result = scale_batch_size(
            trainer, module, mode=finder._mode, steps_per_trial=finder._steps_per_trial, init_val=finder._init_val,
            max_trials=finder._max_trials, batch_arg_name=finder._batch_arg_name, margin=finder._margin, max_val=finder._max_val,
        )
    else:
        raise TypeError(f"trainer.run_tuner() runs a LearningRateFinder or a BatchSizeFinder, got {type(finder).__name__}")
    if getattr(finder, "_early_exit", False):
        if isinstance(finder, LearningRateFinder):
            finder.optimal_lr = result
        else:
            finder.optimal_batch_size = result
        raise TunerExit
    return result


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
        callbacks=trainer.callbacks, dispatch=trainer._dispatch, configs=trainer.lr_scheduler_configs,
        max_steps=trainer.max_steps, training=trainer.training, metrics=[dict(m) for m in metrics], batch_idx=0,
        args=trainer._args, warned=(trainer._warned_skip, trainer._warned_nonfinite, trainer.nonfinite_skipped),
    )
    # a search drives the loss to diverge on purpose: no on_nonfinite policy stops it (its suggestion skips such points)
    trainer._args = dataclasses.replace(trainer._args, on_nonfinite=None)
    trainer._warned_nonfinite = True  # (nor is it warned about)
    try:
        yield saved
    finally:
        trainer.callbacks, trainer._dispatch, trainer._args = saved.callbacks, saved.dispatch, saved.args
        trainer.lr_scheduler_configs, trainer.max_steps, trainer.training = saved.configs, saved.max_steps, saved.training
        trainer._warned_skip, trainer._warned_nonfinite, trainer.nonfinite_skipped = saved.warned
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
