"""`BatchSizeFinder`: Lightning's batch-size search as a callback (run when the run starts).

The search itself is the Trainer's (``trainer.run_tuner``, see `trainer.fit.batch_size_scaling`); this callback holds
its settings and says when it runs: at ``on_fit_start`` in ``fit``; in ``validate``/``test``/``predict`` through
``Tuner(trainer).scale_batch_size(method=...)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from callbacks.base import Callback

if TYPE_CHECKING:
    from callbacks.view import TrainerView
    from trainer.fit.module import TrainModule


@dataclass(frozen=True)
class BatchSizeFinderSettings:
    """What a `BatchSizeFinder` searches (its checked arguments; ``trainer.run_tuner`` reads them)."""

    mode: str = "power"
    steps_per_trial: int = 3
    init_val: int = 2
    max_trials: int = 25
    batch_arg_name: str = "batch_size"
    margin: float = 0.05
    max_val: int = 8192


class BatchSizeFinder(Callback):
    """Find the largest batch size that fits in memory (Lightning 2.6's ``BatchSizeFinder``).

    Args:
        mode: ``"power"`` (double until out of memory) or ``"binsearch"`` (then bisect).
        steps_per_trial: steps (or evaluation batches) each trial runs.
        init_val: the size the search starts from.
        max_trials: the most sizes tried.
        batch_arg_name: where the size lives: an attribute of the module, a key of its hparams, or an attribute of
            the datamodule; its ``*_dataloader()`` must build the loader with it.
        margin: ``"binsearch"`` keeps this fraction below the size found (0 <= margin < 1).
        max_val: the largest size tried.

    ``self.optimal_batch_size`` is the size found (``init_val`` before the search); the module (or datamodule) keeps it.

    Attributes:
        settings: the arguments above, checked (`BatchSizeFinderSettings`, frozen).
        early_exit: True when a `Tuner` made this finder: the run ends after the search (Lightning's ``_early_exit``).
    """

    SUPPORTED_MODES = ("power", "binsearch")

    def __init__(
        self, mode: str = "power", steps_per_trial: int = 3, init_val: int = 2, max_trials: int = 25,
        batch_arg_name: str = "batch_size", margin: float = 0.05, max_val: int = 8192,
    ) -> None:
        if not isinstance(mode, str) or mode.lower() not in self.SUPPORTED_MODES:
            raise ValueError(f"mode={mode!r} is not supported; choose one of {self.SUPPORTED_MODES}")
        for name, value in (("steps_per_trial", steps_per_trial), ("init_val", init_val), ("max_trials", max_trials), ("max_val", max_val)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r} must be an int >= 1")
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not 0.0 <= margin < 1.0:
            raise ValueError(f"margin={margin!r} must be a number in [0, 1): the fraction binsearch keeps below the size found")
        if not isinstance(batch_arg_name, str) or not batch_arg_name:
            raise ValueError(f"batch_arg_name={batch_arg_name!r} must name the attribute that holds the batch size")
        self.optimal_batch_size: int | None = init_val
        self.settings = BatchSizeFinderSettings(
            mode=mode.lower(), steps_per_trial=steps_per_trial, init_val=init_val, max_trials=max_trials,
            batch_arg_name=batch_arg_name, margin=float(margin), max_val=max_val,
        )
        self.early_exit = False  # set by the Tuner: the run ends after the search

    def scale_batch_size(self, trainer: TrainerView, pl_module: TrainModule) -> None:
        """Run the search now (from a start hook); the result is ``self.optimal_batch_size``."""
        self.optimal_batch_size = trainer.run_tuner(self, pl_module)

    def on_fit_start(self, trainer: TrainerView, pl_module: TrainModule) -> None:
        self.scale_batch_size(trainer, pl_module)

    def on_validation_start(self, trainer: TrainerView, pl_module: TrainModule) -> None:
        if trainer.sanity_checking or trainer.stage != "validate":
            return
        self._evaluation_search(trainer, pl_module)

    def on_test_start(self, trainer: TrainerView, pl_module: TrainModule) -> None:
        self._evaluation_search(trainer, pl_module)

    def on_predict_start(self, trainer: TrainerView, pl_module: TrainModule) -> None:
        self._evaluation_search(trainer, pl_module)

    def _evaluation_search(self, trainer: TrainerView, pl_module: TrainModule) -> None:
        if not self.early_exit:  # the evaluation's loaders are built before its start hook, so they would keep the old size
            raise NotImplementedError(
                f"BatchSizeFinder as a callback of trainer.{trainer.stage}() is not supported: that run's loaders are built "
                f"before the search. Run Tuner(trainer).scale_batch_size(module, method={trainer.stage!r}) first, then "
                f"trainer.{trainer.stage}(module)"
            )
        self.scale_batch_size(trainer, pl_module)
