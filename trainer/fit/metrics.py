"""What the Trainer logs and where it goes: the metrics it holds (``callback_metrics``, ``logged_metrics``,
``progress_bar_metrics``: the `ResultsStore` of ``self.log``), values logged outside ``self.log``
(``trainer.log_metrics``), the trackers they reach (``trainer.loggers``, ``logger``, ``log_dir``; every tracker is a
callback receiving ``on_log_metrics``), the logging accumulators a checkpoint saves, and the watch on non-finite losses
(``on_nonfinite``, `trainer.fit.loss_health`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from trainer.fit.dispatch import HookDispatcher
from trainer.fit.module import TrainModule

if TYPE_CHECKING:
    from callbacks.base import Callback
    from callbacks.trackers.base import GeneralTracker
    from trainer.fit.args import TrainerArgs
    from trainer.fit.results import ResultsStore
    from trainer.fit.run_state import RunState
    from trainer.fit.trainer import Trainer


class TrainerMetrics:
    """The logging part of the `Trainer`: its metrics, its trackers, and what it hands them."""

    _args: TrainerArgs
    _results: ResultsStore
    _dispatch: HookDispatcher
    run_state: RunState
    callbacks: list[Callback]
    project_dir: str

    @property
    def results(self) -> ResultsStore:
        """What ``self.log`` records this run (`trainer.fit.results.ResultsStore`): the step values the loops flush to
        the trackers, the epoch accumulators they reduce, and the metrics below."""
        return self._results

    @property
    def callback_metrics(self) -> dict[str, Any]:
        return self._results.callback_metrics

    @property
    def logged_metrics(self) -> dict[str, Any]:
        return self._results.logged_metrics

    @property
    def progress_bar_metrics(self) -> dict[str, Any]:
        return self._results.progress_bar_metrics

    @property
    def loggers(self) -> list[GeneralTracker]:
        """The trackers among the callbacks (Lightning's ``trainer.loggers``: ``CSVLogger``, ``TensorBoardLogger``, ...)."""
        from callbacks.trackers import GeneralTracker  # lazy: `from trainer import Trainer` loads no tracker module

        return [cb for cb in self.callbacks if isinstance(cb, GeneralTracker)]

    @property
    def logger(self) -> GeneralTracker | None:
        """The first tracker (Lightning's ``trainer.logger``), or None without trackers."""
        loggers = self.loggers
        return loggers[0] if loggers else None

    @property
    def log_dir(self) -> str:
        """The directory of the first file-based tracker's run (``<project_dir>/logs`` before it starts)."""
        for cb in self.callbacks:
            run_dir = getattr(cb, "run_dir", None)
            if run_dir is not None:
                return str(run_dir)
        return str(Path(self.project_dir) / "logs")

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        """Log values computed outside ``self.log`` (a callback's learning rates, throughput, ...).

        They go into `callback_metrics` and `logged_metrics` and to every tracker (each callback's
        ``on_log_metrics``) at `step`; without a `step`, at `logging_step` with the current ``"epoch"`` added (as
        Lightning's logger connector does). Nothing reaches the trackers while sanity checking, as for ``self.log``.

        Raises:
            TypeError: `metrics` is not a dict of numbers (or one-element tensors).
        """
        if not isinstance(metrics, dict):
            raise TypeError(f"log_metrics needs a dict of name -> number, got {type(metrics).__name__}; pass e.g. {{'lr': 0.1}}")
        values: dict[str, float] = {}
        for name, value in metrics.items():
            try:
                values[name] = float(value)
            except (TypeError, ValueError, RuntimeError):
                raise TypeError(f"log_metrics got {name}={value!r:.100}, which is not a number; log numbers or one-element tensors") from None
        self.callback_metrics.update(values)
        self.logged_metrics.update(values)
        self.send_to_trackers(values, None if step is None else int(step), epoch=step is None)

    def results_state_dict(self) -> dict[str, Any]:
        """The epoch accumulators of ``self.log(..., on_epoch=True)``, saved in checkpoints so epoch values stay exact on resume."""
        return self._results.state_dict()

    def load_results_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `results_state_dict` returned."""
        self._results.load_state_dict(state)

    def send_to_trackers(self, metrics: dict[str, float], step: int | None = None, *, epoch: bool = True) -> None:
        """Hand `metrics` (plus ``"epoch"`` unless `epoch` is False) to every callback's ``on_log_metrics`` at `step`
        (default: `logging_step`); nothing while sanity checking. The loops hand over what `results` recorded this way;
        values computed elsewhere go through `log_metrics`, which records them first."""
        state = self.run_state
        if not metrics or state.sanity_checking:
            return
        step = state.logging_step if step is None else step
        values = {**metrics, "epoch": state.current_epoch} if epoch else dict(metrics)
        self.warn_if_nonfinite(values)
        dispatch = self._dispatch if self._dispatch.module is not None else HookDispatcher(None, TrainModule, self.callbacks, cast("Trainer", self))
        dispatch.call_callbacks("on_log_metrics", values, step)

    @property
    def nonfinite_skipped(self) -> int:
        """Batches skipped this fit for a non-finite loss (``on_nonfinite="skip"``)."""
        return self.run_state.loss_health.skipped

    def watch_loss(self, loss: torch.Tensor) -> None:
        """Add a loss trained on to the device-side total a non-finite loss is found in (`LossHealth.watch`)."""
        self.run_state.loss_health.watch(loss)

    def warn_if_nonfinite(self, values: dict[str, float], *, synchronized: bool = False) -> None:
        """Warn once per fit when a training value the loop already read to the host (a logged value going to the
        trackers, one the progress bar shows) is NaN or inf and no ``on_nonfinite`` policy watches the loss; where values
        were read, or where the loop synchronizes anyway (``synchronized``), the device-side total of the losses trained
        on is read too (`LossHealth.check`). Costs no synchronization of its own."""
        state = self.run_state
        if state.loss_health.policy is None and state.training and not state.sanity_checking:
            state.loss_health.check(values, synchronized=synchronized, step=state.global_step, epoch=state.current_epoch)
