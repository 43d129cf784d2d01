"""``trainer.run_tuner(finder, module)``: the search a `LearningRateFinder` or `BatchSizeFinder` callback asks for."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainer.fit.batch_size_scaling import scale_batch_size
from trainer.fit.lr_finder import lr_find
from trainer.fit.search import TunerExit

if TYPE_CHECKING:
    from callbacks.batch_size_finder import BatchSizeFinder
    from callbacks.lr_finder import LearningRateFinder
    from trainer.fit.lr_finder import LRFinder
    from trainer.fit.module import TrainModule
    from trainer.fit.trainer import Trainer


def run_finder(trainer: Trainer, finder: LearningRateFinder | BatchSizeFinder, module: TrainModule) -> LRFinder | int | None:
    """``trainer.run_tuner(finder, module)``: the search a `LearningRateFinder`/`BatchSizeFinder` asks for, with its
    settings; raises `TunerExit` after it when the `Tuner` started it."""
    # lazy: the finders load only when one runs
    from callbacks.batch_size_finder import BatchSizeFinder
    from callbacks.lr_finder import LearningRateFinder

    if isinstance(finder, LearningRateFinder):
        found = lr_find(
            trainer, module, min_lr=finder._min_lr, max_lr=finder._max_lr, num_training=finder._num_training_steps,
            mode=finder._mode, early_stop_threshold=finder._early_stop_threshold, update_attr=finder._update_attr,
            attr_name=finder._attr_name,
        )
        if getattr(finder, "_early_exit", False):
            finder.optimal_lr = found
            raise TunerExit
        return found
    if isinstance(finder, BatchSizeFinder):
        size = scale_batch_size(
            trainer, module, mode=finder._mode, steps_per_trial=finder._steps_per_trial, init_val=finder._init_val,
            max_trials=finder._max_trials, batch_arg_name=finder._batch_arg_name, margin=finder._margin, max_val=finder._max_val,
        )
        if getattr(finder, "_early_exit", False):
            finder.optimal_batch_size = size
            raise TunerExit
        return size
    raise TypeError(f"trainer.run_tuner() runs a LearningRateFinder or a BatchSizeFinder, got {type(finder).__name__}")
