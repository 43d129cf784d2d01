"""The learning-rate range test (Lightning 2.6's ``lr_find``), run on the `Trainer`'s own loop.

    save a checkpoint of the run (weights, optimizer, schedulers, loop position, loader positions, RNG states)
    every param group's lr = min_lr; a per-step schedule raises it to max_lr over num_training steps
    train up to num_training steps with only the finder's callback: each boundary batch records the lr it ran
    with and the smoothed loss (beta=0.98, bias-corrected); a smoothed loss above early_stop_threshold x the best
    stops the search
    restore the checkpoint (everything as it was before the search), suggest the lr of the steepest descent

`LRFinder` holds the results (``results["lr"]``, ``results["loss"]``), ``suggestion()`` and ``plot()``. The numbers are
Lightning's (``tests/fixtures/lr_find_lightning.json`` records what Lightning 2.6.6 gives for a seeded problem).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import torch
from torch.optim.lr_scheduler import LRScheduler

from callbacks.base import Callback
from trainer.fit.module import LRSchedulerConfig
from trainer.fit.search import run_training, state_kept

if TYPE_CHECKING:
    from callbacks.view import TrainerView
    from trainer.fit.datamodule import DataModule
    from trainer.fit.module import TrainModule
    from trainer.fit.trainer import Trainer

log = logging.getLogger(__name__)

MODES = ("linear", "exponential")


class LRFinder:
    """The results of a learning-rate range test (Lightning's ``_LRFinder``).

    Attributes:
        results: ``{"lr": [...], "loss": [...]}``, one entry per optimizer step of the search (the loss smoothed;
            NaN where ``training_step`` returned nothing).
        mode, lr_min, lr_max, num_training: the search's settings.
    """

    def __init__(self, mode: str, lr_min: float, lr_max: float, num_training: int) -> None:
        self.mode = mode
        self.lr_min = lr_min
        self.lr_max = lr_max
        self.num_training = num_training
        self.results: dict[str, Any] = {}
        self._optimal_idx: int | None = None
        self._total_batch_idx = 0

    def suggestion(self, skip_begin: int = 10, skip_end: int = 1) -> float | None:
        """The lr where the (finite) smoothed loss falls fastest with respect to the lr, skipping the first
        `skip_begin` and last `skip_end` points; None (with a logged error) when fewer than 2 points remain."""
        losses = torch.tensor(self.results["loss"][skip_begin:-skip_end])
        lrs = torch.tensor(self.results["lr"][skip_begin:-skip_end])
        finite = torch.isfinite(losses)
        losses, lrs = losses[finite], lrs[finite]
        if len(losses) < 2:
            log.error(
                "Failed to compute suggestion for learning rate because there are not enough points. Increase the loop"
                " iteration limits or the size of your dataset/dataloader."
            )
            self._optimal_idx = None
            return None
        gradients = torch.gradient(losses, spacing=[lrs])[0]
        steepest = int(torch.argmin(gradients).item())
        kept = torch.arange(len(self.results["loss"]))[skip_begin:-skip_end][finite]
        self._optimal_idx = int(kept[steepest].item())
        lr: float = self.results["lr"][self._optimal_idx]
        return lr

    def plot(self, suggest: bool = False, show: bool = False, ax: Any = None) -> Any:
        """Plot the loss against the lr (log scale in exponential mode) with matplotlib; `suggest` marks the
        suggestion in red, `show` shows the figure, `ax` draws into those axes. Returns the figure."""
        try:
            import matplotlib.pyplot as plt
        except ImportError:
            raise ImportError(
                "LRFinder.plot() needs matplotlib, which is not installed: pip install matplotlib "
                "(the numbers are in lr_finder.results['lr'] and ['loss'] without it)"
            ) from None
        lrs, losses = self.results["lr"], self.results["loss"]
        if ax is None:
            fig, ax = plt.subplots()
        else:
            fig = ax.figure
        ax.plot(lrs, losses)
        if self.mode == "exponential":
            ax.set_xscale("log")
        ax.set_xlabel("Learning rate")
        ax.set_ylabel("Loss")
        if suggest:
            self.suggestion()
            if self._optimal_idx:
                ax.plot(lrs[self._optimal_idx], losses[self._optimal_idx], markersize=10, marker="o", color="red")
        if show:
            plt.show()
        return fig


class _RangeSchedule(LRScheduler):
    """Raises every group's lr from its base (min_lr) towards `end_lr` over `num_iter` steps, linearly or
    exponentially (Lightning's ``_LinearLR``/``_ExponentialLR``, step for step)."""

    def __init__(self, optimizer: torch.optim.Optimizer, end_lr: float, num_iter: int, exponential: bool) -> None:
        self.end_lr = end_lr
        self.num_iter = num_iter
        self.exponential = exponential
        self._lr: list[float | torch.Tensor] = []
        super().__init__(optimizer)

    def get_lr(self) -> list[float | torch.Tensor]:
        r = (self.last_epoch + 1) / self.num_iter
        values: list[float | torch.Tensor]
        if self.last_epoch <= 0:
            values = list(self.base_lrs)
        elif self.exponential:
            values = [base * (self.end_lr / base) ** r for base in self.base_lrs]
        else:
            values = [base + r * (self.end_lr - base) for base in self.base_lrs]
        self._lr = values
        return values

    @property
    def lr(self) -> list[float | torch.Tensor]:
        return self._lr


class _LRCallback(Callback):
    """The only callback during the search: the lr before each boundary batch, the smoothed loss after it, and the
    stop once that loss passes ``early_stop_threshold`` x the best so far (Lightning's ``_LRCallback``)."""

    def __init__(self, schedule: _RangeSchedule, early_stop_threshold: float | None, beta: float = 0.98) -> None:
        self.schedule = schedule
        self.early_stop_threshold = early_stop_threshold
        self.beta = beta
        self.losses: list[float] = []
        self.lrs: list[float] = []
        self.avg_loss = 0.0
        self.best_loss = 0.0
        self.stopped = False  # with several processes the loop stops at the next agreement; later batches are not recorded

    def on_train_batch_start(self, trainer: TrainerView, module: TrainModule, batch: Any, batch_idx: int) -> None:
        if (batch_idx + 1) % trainer.accumulate_grad_batches != 0 or self.stopped:
            return
        self.lrs.append(float(self.schedule.lr[0]))

    def on_train_batch_end(self, trainer: TrainerView, module: TrainModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        if (batch_idx + 1) % trainer.accumulate_grad_batches != 0 or self.stopped:
            return
        loss = outputs if isinstance(outputs, torch.Tensor) or outputs is None else outputs.get("loss")
        if loss is None:  # the batch was skipped: NaN is left out of the suggestion
            self.losses.append(float("nan"))
            return
        current, step = float(loss.item()), trainer.global_step
        self.avg_loss = self.beta * self.avg_loss + (1 - self.beta) * current
        smoothed = self.avg_loss / (1 - self.beta ** (step + 1))
        stop = self.early_stop_threshold is not None and step > 1 and smoothed > self.early_stop_threshold * self.best_loss
        if trainer.world_size > 1:  # rank 0 decides, as Lightning's broadcast
            stop = bool(trainer.strategy.broadcast_object(stop))
        if stop:
            self.stopped = trainer.should_stop = True
        if smoothed < self.best_loss or step == 1:
            self.best_loss = smoothed
        self.losses.append(smoothed)


def lr_attr_name(module: TrainModule, attr_name: str = "", *, datamodule: DataModule | None) -> str:
    """Where the module keeps its lr: `attr_name`, else ``lr`` or ``learning_rate``, on the module or in its hparams."""
    if attr_name:
        if not has_attr(module, attr_name, datamodule=datamodule):
            raise AttributeError(
                f"lr_find(attr_name={attr_name!r}): neither {type(module).__name__} nor its hparams has {attr_name!r}; "
                "name the attribute that holds the learning rate, or pass update_attr=False"
            )
        return attr_name
    for name in ("lr", "learning_rate"):
        if has_attr(module, name, datamodule=datamodule):
            return name
    raise AttributeError(
        f"lr_find(update_attr=True) needs the learning rate on {type(module).__name__} or its hparams as 'lr' or "
        "'learning_rate'; name another attribute with attr_name=..., or pass update_attr=False"
    )


def has_attr(module: TrainModule, name: str, *, datamodule: DataModule | None) -> bool:
    """Lightning's ``lightning_hasattr``: an attribute of the module, a key of its hparams, or of `datamodule` (the
    run's, ``trainer.datamodule``)."""
    hparams = getattr(module, "hparams", {})
    return hasattr(module, name) or name in hparams or (datamodule is not None and hasattr(datamodule, name))


def get_attr(module: TrainModule, name: str, *, datamodule: DataModule | None) -> Any:
    """Lightning's ``lightning_getattr`` (the module, its hparams, then `datamodule`)."""
    if hasattr(module, name):
        return getattr(module, name)
    hparams = getattr(module, "hparams", {})
    if name in hparams:
        return hparams[name]
    if datamodule is not None and hasattr(datamodule, name):
        return getattr(datamodule, name)
    raise AttributeError(f"{name!r} is neither an attribute of {type(module).__name__}, a key of its hparams, nor an attribute of the datamodule")


def set_attr(module: TrainModule, name: str, value: Any, *, datamodule: DataModule | None) -> None:
    """Lightning's ``lightning_setattr``: set `name` everywhere it is found (module, hparams, `datamodule`)."""
    found = False
    if hasattr(module, name):
        setattr(module, name, value)
        found = True
    hparams = getattr(module, "hparams", {})
    if name in hparams:
        hparams[name] = value
        found = True
    if datamodule is not None and hasattr(datamodule, name):
        setattr(datamodule, name, value)
        found = True
    if not found:
        raise AttributeError(f"{name!r} is neither an attribute of {type(module).__name__}, a key of its hparams, nor an attribute of the datamodule")


def lr_find(
    trainer: Trainer, module: TrainModule, *, min_lr: float, max_lr: float, num_training: int, mode: str,
    early_stop_threshold: float | None, update_attr: bool, attr_name: str,
) -> LRFinder | None:
    """Run the range test inside `trainer`'s fit (from ``on_fit_start`` or a later hook) and put everything back.

    With `update_attr` the suggestion is written to the module's lr attribute and to the optimizer's param groups
    after the restore, so the training that follows uses it (Lightning 2.6).
    """
    if trainer.args.fast_dev_run:
        log.warning("Skipping learning rate finder since `fast_dev_run` is enabled.")
        return None
    if update_attr:
        attr_name = lr_attr_name(module, attr_name, datamodule=trainer.datamodule)
    if not module.automatic_optimization:
        raise ValueError(
            f"the learning rate finder raises the lr through a schedule stepped after each automatic optimizer step; "
            f"{type(module).__name__} uses manual optimization, where nothing would step it. Find the lr with automatic "
            "optimization, or sweep the lr in training_step yourself"
        )
    state = trainer.run_state
    if len(state.optimizers) != 1:
        raise ValueError(
            f"the learning rate finder needs exactly one optimizer; configure_optimizers returned {len(state.optimizers)}. "
            "Run it on a module with one optimizer"
        )
    finder = LRFinder(mode, min_lr, max_lr, num_training)
    optimizer = state.optimizers[0]
    inner = getattr(optimizer, "optimizer", optimizer)
    with state_kept(trainer, "lr_find") as saved:
        start = state.global_step
        for group in inner.param_groups:
            group["lr"] = min_lr
            group["initial_lr"] = min_lr
        schedule = _RangeSchedule(inner, max_lr, num_training, exponential=mode == "exponential")
        recorder = _LRCallback(schedule, early_stop_threshold)
        state.lr_scheduler_configs = [LRSchedulerConfig(scheduler=schedule, interval="step")]
        run_training(trainer, [recorder], max_steps=start + num_training, val_loaders=None)
        if state.global_step != start + num_training:
            log.info(f"LR finder stopped early after {state.global_step} steps due to diverging loss.")
        results = {"lr": recorder.lrs, "loss": recorder.losses}
        finder.results = trainer.strategy.broadcast_object(results) if trainer.world_size > 1 else results
        saved.batch_idx = state.progress.batches_done_in_epoch
    finder._total_batch_idx = saved.batch_idx
    if update_attr:
        lr = finder.suggestion()
        if lr is not None:
            set_attr(module, attr_name, lr, datamodule=trainer.datamodule)
            for opt in state.optimizers:
                for group in opt.param_groups:
                    group["lr"] = lr
            log.info(f"Learning rate set to {lr}")
    return finder
