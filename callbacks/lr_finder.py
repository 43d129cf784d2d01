"""`LearningRateFinder`: Lightning's learning-rate range test as a callback (run at ``on_fit_start``).

The search itself is the Trainer's (``trainer.run_tuner``, see `trainer.fit.lr_finder`); this callback holds its
settings and says when it runs. Subclass it and call ``self.lr_find(trainer, module)`` from another hook to search
again later (say, at chosen epochs while fine-tuning), as in Lightning.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from callbacks.base import Callback

if TYPE_CHECKING:
    from callbacks.view import TrainerView
    from trainer.fit.module import TrainModule


@dataclass(frozen=True)
class LRFinderSettings:
    """What a `LearningRateFinder` searches (its checked arguments; ``trainer.run_tuner`` reads them)."""

    min_lr: float = 1e-8
    max_lr: float = 1.0
    num_training_steps: int = 100
    mode: str = "exponential"
    early_stop_threshold: float | None = 4.0
    update_attr: bool = True
    attr_name: str = ""


class LearningRateFinder(Callback):
    """Find a starting learning rate before training (Lightning 2.6's ``LearningRateFinder``).

    Args:
        min_lr: the learning rate the search starts from.
        max_lr: the learning rate it ends at.
        num_training_steps: optimizer steps of the search (one learning rate each).
        mode: ``"exponential"`` (the lr grows geometrically) or ``"linear"``.
        early_stop_threshold: stop once the smoothed loss exceeds this times its best (None: never).
        update_attr: write the suggestion to the module's learning rate attribute and to the optimizer.
        attr_name: that attribute (default: ``lr`` or ``learning_rate`` on the module or in its hparams).

    After the search ``self.optimal_lr`` is the `trainer.fit.lr_finder.LRFinder` (``suggestion()``, ``results``,
    ``plot()``). The model, optimizer, schedulers, loop and loader positions are restored afterwards.

    Attributes:
        settings: the arguments above, checked (`LRFinderSettings`, frozen).
        early_exit: True when a `Tuner` made this finder: the run ends after the search (Lightning's ``_early_exit``).
    """

    SUPPORTED_MODES = ("linear", "exponential")

    def __init__(
        self, min_lr: float = 1e-8, max_lr: float = 1, num_training_steps: int = 100, mode: str = "exponential",
        early_stop_threshold: float | None = 4.0, update_attr: bool = True, attr_name: str = "",
    ) -> None:
        if not isinstance(mode, str) or mode.lower() not in self.SUPPORTED_MODES:
            raise ValueError(f"mode={mode!r} is not supported; choose one of {self.SUPPORTED_MODES}")
        mode = mode.lower()
        if isinstance(num_training_steps, bool) or not isinstance(num_training_steps, int) or num_training_steps < 1:
            raise ValueError(f"num_training_steps={num_training_steps!r} must be an int >= 1 (the steps of the search)")
        for name, value in (("min_lr", min_lr), ("max_lr", max_lr)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name}={value!r} must be a finite number >= 0")
        if mode == "exponential" and min_lr <= 0:
            raise ValueError(f"min_lr={min_lr!r}: an exponential search starts from a learning rate > 0; pass e.g. min_lr=1e-8")
        if max_lr <= min_lr:
            raise ValueError(f"max_lr={max_lr!r} must be greater than min_lr={min_lr!r}")
        threshold = early_stop_threshold
        if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or threshold <= 0):
            raise ValueError(f"early_stop_threshold={threshold!r} must be a number > 0, or None to never stop early")
        if not isinstance(update_attr, bool):
            raise TypeError(f"update_attr={update_attr!r} must be True or False")
        if not isinstance(attr_name, str):
            raise TypeError(f"attr_name={attr_name!r} must be a str (empty: find 'lr' or 'learning_rate')")
        self.settings = LRFinderSettings(
            min_lr=float(min_lr), max_lr=float(max_lr), num_training_steps=num_training_steps, mode=mode,
            early_stop_threshold=None if threshold is None else float(threshold), update_attr=update_attr, attr_name=attr_name,
        )
        self.early_exit = False  # set by the Tuner: the run ends after the search
        self.optimal_lr: Any = None

    def lr_find(self, trainer: TrainerView, pl_module: TrainModule) -> None:
        """Run the search now (in a hook of a running ``fit``); the result is ``self.optimal_lr``."""
        self.optimal_lr = trainer.run_tuner(self, pl_module)

    def on_fit_start(self, trainer: TrainerView, pl_module: TrainModule) -> None:
        self.lr_find(trainer, pl_module)
