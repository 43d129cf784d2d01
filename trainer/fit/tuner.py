"""Lightning's tuners on the `Trainer`: `Tuner` (``lr_find``, ``scale_batch_size``).

    tuner = Tuner(trainer)                   # (``from trainer.tuner import Tuner``: Lightning's path, renamed)
    lr_finder = tuner.lr_find(module, datamodule=dm)      # runs trainer.fit with a LearningRateFinder in front;
    lr_finder.suggestion(), lr_finder.results             #   the search ends that fit, the module keeps the lr
    tuner.scale_batch_size(module, datamodule=dm)         # the same with a BatchSizeFinder
    trainer.fit(module, datamodule=dm)                    # the real run, on the same Trainer

The search runs inside the run it tunes and puts the run back as it was (`trainer.fit.search`); through the `Tuner`
it then ends that run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainer.fit.module import TrainModule
from trainer.fit.trainer import Trainer

if TYPE_CHECKING:
    from callbacks.base import Callback
    from trainer.fit.datamodule import DataModule
    from trainer.fit.lr_finder import LRFinder

METHODS = ("fit", "validate", "test", "predict")


class Tuner:
    """Lightning's ``Tuner``: finds a learning rate or a batch size by running `trainer`'s own fit."""

    def __init__(self, trainer: Trainer) -> None:
        if not isinstance(trainer, Trainer):
            raise TypeError(f"Tuner(trainer) needs a trainer.Trainer, got {type(trainer).__name__}")
        self._trainer = trainer

    def lr_find(
        self, model: TrainModule, train_dataloaders: Any = None, val_dataloaders: Any = None, dataloaders: Any = None,
        datamodule: DataModule | None = None, method: str = "fit", min_lr: float = 1e-8, max_lr: float = 1, num_training: int = 100,
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
        finder.early_exit = True
        self._run(finder, model, "fit", train_dataloaders, val_dataloaders, None, datamodule)
        found: LRFinder | None = finder.optimal_lr
        return found

    def scale_batch_size(
        self, model: TrainModule, train_dataloaders: Any = None, val_dataloaders: Any = None, dataloaders: Any = None,
        datamodule: DataModule | None = None, method: str = "fit", mode: str = "power", steps_per_trial: int = 3, init_val: int = 2,
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
        finder.early_exit = True
        self._run(finder, model, method, train_dataloaders, val_dataloaders, dataloaders, datamodule)
        return finder.optimal_batch_size

    def _run(self, finder: Callback, model: TrainModule, method: str, train: Any, val: Any, loaders: Any, datamodule: DataModule | None) -> None:
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
