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
        lr = finder.settings
        found = lr_find(
            trainer, module, min_lr=lr.min_lr, max_lr=lr.max_lr, num_training=lr.num_training_steps, mode=lr.mode,
            early_stop_threshold=lr.early_stop_threshold, update_attr=lr.update_attr, attr_name=lr.attr_name,
        )
        if finder.early_exit:
            finder.optimal_lr = found
            raise TunerExit
        return found
    if isinstance(finder, BatchSizeFinder):
        bs = finder.settings
        size = scale_batch_size(
            trainer, module, mode=bs.mode, steps_per_trial=bs.steps_per_trial, init_val=bs.init_val, max_trials=bs.max_trials,
            batch_arg_name=bs.batch_arg_name, margin=bs.margin, max_val=bs.max_val,
        )
        if finder.early_exit:
            finder.optimal_batch_size = size
            raise TunerExit
        return size
    raise TypeError(f"trainer.run_tuner() runs a LearningRateFinder or a BatchSizeFinder, got {type(finder).__name__}")
