"""`LearningRateMonitor`: log each optimizer's learning rate (and momentum) through the trackers."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

from callbacks.base import Callback

if TYPE_CHECKING:
    import torch

    from callbacks.view import TrainerView
    from trainer.fit.module import LRSchedulerConfig, TrainModule

_INTERVALS = (None, "step", "epoch")


def _momentum(group: dict[str, Any]) -> float | None:
    """The momentum of a parameter group: ``momentum`` (SGD, RMSprop) or ``betas[0]`` (Adam family)."""
    if "betas" in group:
        return float(group["betas"][0])
    if "momentum" in group:
        return float(group["momentum"])
    return None


class LearningRateMonitor(Callback):
    """Log the learning rate of every optimizer, and optionally its momentum.

    Names follow Lightning: ``lr-<OptimizerClass>`` (``lr-Adam``); a second optimizer of the same
    class gets ``lr-Adam-1``; a scheduler config with a ``name`` is the metric name itself (``"name": "my_lr"``
    logs ``my_lr``); an optimizer with several parameter groups logs ``lr-Adam/pg1``, ``lr-Adam/pg2``, ...
    (1-based), or ``lr-Adam/<name>`` for a group with a ``"name"``. Momentum is logged as ``<lr name>-momentum``
    (``lr-Adam-momentum``) from ``momentum`` (SGD) or ``betas[0]`` (Adam family).

    The values go through ``trainer.log_metrics`` to every tracker at ``trainer.run_state.logging_step`` (the step of the
    ``self.log`` values of the same batch), without an ``epoch`` value, as Lightning's monitor writes them.

    Args:
        logging_interval: ``"step"`` logs at the start of every ``log_every_n_steps``-th optimizer step,
            ``"epoch"`` at the start of every epoch, ``None`` follows each optimizer's scheduler interval
            (optimizers without a scheduler are logged per step).
        log_momentum: also log momentum.
        log_weight_decay: also log each group's ``weight_decay`` as ``<lr name>-weight_decay`` (Lightning's).

    Raises:
        ValueError: ``logging_interval`` is not ``None``, ``"step"`` or ``"epoch"``.

    Example::

        trainer = Trainer(max_epochs=5, callbacks=[LearningRateMonitor(logging_interval="step")])
    """

    def __init__(self, logging_interval: str | None = None, log_momentum: bool = False, log_weight_decay: bool = False) -> None:
        if logging_interval not in _INTERVALS:
            raise ValueError(
                f"LearningRateMonitor(logging_interval={logging_interval!r}) is invalid; "
                "choose 'step', 'epoch' or None (follow each scheduler's interval)."
            )
        self.logging_interval = logging_interval
        self.log_momentum = bool(log_momentum)
        self.log_weight_decay = bool(log_weight_decay)
        self.names: list[list[str]] = []
        self._intervals: list[str] = []
        self._last_step_logged: int | None = None

    def on_train_start(self, trainer: TrainerView, module: TrainModule) -> None:
        optimizers = trainer.optimizers
        if not optimizers:
            warnings.warn(
                "LearningRateMonitor found no optimizers on the Trainer, so it logs nothing; "
                "return an optimizer from configure_optimizers() or remove the callback.",
                stacklevel=2,
            )
        configs = trainer.lr_scheduler_configs
        self.names = self._names(optimizers, configs)
        self._intervals = [self._interval_of(i, opt, configs) for i, opt in enumerate(optimizers)]
        self._last_step_logged = None
        if self.log_momentum:
            missing = [type(_unwrap(opt)).__name__ for opt in optimizers if _momentum(opt.param_groups[0]) is None]
            if missing:
                warnings.warn(
                    f"LearningRateMonitor(log_momentum=True): {', '.join(missing)} has no momentum or betas, "
                    "so no momentum is logged for it.",
                    stacklevel=2,
                )

    def _names(self, optimizers: list[torch.optim.Optimizer], configs: list[LRSchedulerConfig]) -> list[list[str]]:
        """One list of learning-rate metric names per optimizer (one per parameter group), as Lightning names them."""
        seen: dict[str, int] = {}
        names = []
        for index, optimizer in enumerate(optimizers):
            config = _config_for(index, optimizer, configs)
            custom = getattr(config, "name", None)
            stem = custom or type(_unwrap(optimizer)).__name__
            count = seen.get(stem, 0)
            seen[stem] = count + 1
            if count:
                stem = f"{stem}-{count}"
            groups = optimizer.param_groups
            stem = stem if custom else f"lr-{stem}"
            if len(groups) == 1:
                names.append([f"{stem}/{groups[0]['name']}" if groups[0].get("name") else stem])
            else:
                names.append([f"{stem}/{group.get('name', f'pg{i + 1}')}" for i, group in enumerate(groups)])
        return names

    def _interval_of(self, index: int, optimizer: torch.optim.Optimizer, configs: list[LRSchedulerConfig]) -> str:
        if self.logging_interval is not None:
            return self.logging_interval
        config = _config_for(index, optimizer, configs)
        return "step" if config is None else str(getattr(config, "interval", "epoch"))

    def learning_rates(self, trainer: TrainerView, interval: str) -> dict[str, float]:
        """The current values of every optimizer logged at ``interval``, keyed by metric name."""
        values: dict[str, float] = {}
        for optimizer, stems, opt_interval in zip(trainer.optimizers, self.names, self._intervals):
            if opt_interval != interval:
                continue
            for stem, group in zip(stems, optimizer.param_groups):
                values[stem] = float(group["lr"])
                momentum = _momentum(group) if self.log_momentum else None
                if momentum is not None:
                    values[f"{stem}-momentum"] = momentum
                if self.log_weight_decay and "weight_decay" in group:
                    values[f"{stem}-weight_decay"] = float(group["weight_decay"])
        return values

    def on_train_batch_start(self, trainer: TrainerView, module: TrainModule, batch: Any, batch_idx: int) -> None:
        if "step" not in self._intervals:
            return
        step = int(trainer.run_state.logging_step)
        every = max(trainer.log_every_n_steps, 1)
        # Several batches share one optimizer step under gradient accumulation: log each step once.
        if step == self._last_step_logged or (step + 1) % every:
            return
        self._last_step_logged = step
        values = self.learning_rates(trainer, "step")
        if values:
            trainer.log_metrics(values, step)

    def on_train_epoch_start(self, trainer: TrainerView, module: TrainModule) -> None:
        values = self.learning_rates(trainer, "epoch")
        if values:
            trainer.log_metrics(values, int(trainer.run_state.logging_step))


def _config_for(index: int, optimizer: torch.optim.Optimizer, configs: list[LRSchedulerConfig]) -> LRSchedulerConfig | None:
    """The scheduler config of the ``index``-th optimizer (by ``opt_idx``, else by identity), or None."""
    for config in configs:
        opt_idx = getattr(config, "opt_idx", None)
        if opt_idx is not None and opt_idx == index:
            return config
        if opt_idx is None and _optimizer_of(config.scheduler) is _unwrap(optimizer):
            return config
    return None


def _optimizer_of(scheduler: object) -> object:
    """The torch optimizer a scheduler drives, looking through wrappers (``.scheduler``, ``.optimizer``)."""
    scheduler = getattr(scheduler, "scheduler", scheduler)
    return _unwrap(getattr(scheduler, "optimizer", None))


def _unwrap(optimizer: object) -> object:
    """The torch optimizer inside a wrapper that keeps it as ``.optimizer``."""
    while optimizer is not None and hasattr(optimizer, "optimizer"):
        optimizer = optimizer.optimizer
    return optimizer
