"""`TrainModule`: the model, its steps, its optimizers and its hooks, in one `nn.Module`.

A `TrainModule` is what the `Trainer` runs. It is a plain ``torch.nn.Module`` with a few extra methods:
the steps (``training_step``, ``validation_step``, ``test_step``, ``predict_step``), ``configure_optimizers``,
optional ``*_dataloader`` methods, one no-op method per event of `callbacks.events`, and helpers that work
inside a run (``self.log``, ``self.device``, ``self.trainer``, ``self.all_gather``, ``self.print``, ...).
"""

from __future__ import annotations

import contextlib
import inspect
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import nn

from trainer.fit.pipelining import PipelineSteps

if TYPE_CHECKING:
    from types import FrameType

    from torch.distributed import ProcessGroup
    from torch.distributed.device_mesh import DeviceMesh

    from callbacks.base import Callback
    from callbacks.trackers.base import GeneralTracker
    from callbacks.view import ModuleTrainerView
    from trainer.fit.batch import StepOptimizer
    from trainer.fit.combined_loader import Loaders

_INTERVALS = ("step", "epoch")
_BACKWARD_ARGUMENTS = ("gradient", "retain_graph", "create_graph", "inputs")  # Tensor.backward's, in order


class AttributeDict(dict):
    """A dict whose keys are also attributes: ``hparams.lr`` is ``hparams["lr"]``."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError:
            raise AttributeError(f"no hyperparameter named {key!r}; saved ones: {sorted(self)}") from None

    def __setattr__(self, key: str, value: Any) -> None:
        self[key] = value


@dataclass
class LRSchedulerConfig:
    """One learning-rate scheduler and when the Trainer steps it.

    Attributes:
        scheduler: the scheduler.
        interval: ``"step"`` (after optimizer steps) or ``"epoch"`` (after training epochs).
        frequency: step it every `frequency` intervals.
        monitor: the logged metric a ``ReduceLROnPlateau`` scheduler reads.
        name: a display name (used by the learning-rate monitor).
        strict: raise when `monitor` was not logged (else skip the step).
        opt_idx: index of the optimizer it belongs to.
    """

    scheduler: Any
    interval: str = "epoch"
    frequency: int = 1
    monitor: str | None = None
    name: str | None = None
    strict: bool = True
    opt_idx: int = 0


def _is_optimizer(obj: Any) -> bool:
    return isinstance(obj, torch.optim.Optimizer) or (hasattr(obj, "step") and hasattr(obj, "param_groups"))


def _is_plateau(scheduler: object) -> bool:
    return isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)


def _scheduler_config(item: Any, optimizers: Sequence[Any], default_monitor: str | None = None) -> LRSchedulerConfig:
    """Build one `LRSchedulerConfig` from a scheduler or a Lightning-style dict."""
    if isinstance(item, Mapping):
        if "scheduler" not in item:
            raise ValueError(f"an lr_scheduler dict needs a 'scheduler' key, got keys {sorted(item)}; e.g. {{'scheduler': sched, 'interval': 'step'}}")
        unknown = set(item) - {"scheduler", "interval", "frequency", "monitor", "name", "strict", "reduce_on_plateau"}
        if unknown:
            raise ValueError(f"unknown lr_scheduler key(s) {sorted(unknown)}; supported: scheduler, interval, frequency, monitor, name, strict")
        config = LRSchedulerConfig(
            scheduler=item["scheduler"],
            interval=item.get("interval", "epoch"),
            frequency=item.get("frequency", 1),
            monitor=item.get("monitor", default_monitor),
            name=item.get("name"),
            strict=item.get("strict", True),
        )
    else:
        config = LRSchedulerConfig(scheduler=item, monitor=default_monitor)
    if config.interval not in _INTERVALS:
        raise ValueError(f"lr_scheduler interval={config.interval!r} is not supported; use 'step' or 'epoch'")
    if not isinstance(config.frequency, int) or isinstance(config.frequency, bool) or config.frequency < 1:
        raise ValueError(f"lr_scheduler frequency={config.frequency!r} must be a positive int")
    if not hasattr(config.scheduler, "step"):
        raise TypeError(f"lr_scheduler {config.scheduler!r} has no step() method; pass a torch.optim.lr_scheduler scheduler")
    if _is_plateau(config.scheduler) and not config.monitor:
        raise ValueError(
            "ReduceLROnPlateau needs a metric to monitor; return "
            "{'optimizer': opt, 'lr_scheduler': {'scheduler': sched, 'monitor': 'val_loss'}} from configure_optimizers"
        )
    owner = getattr(config.scheduler, "optimizer", None)
    config.opt_idx = next((i for i, opt in enumerate(optimizers) if opt is owner), 0)
    return config


def parse_optimizers(result: Any) -> tuple[list[Any], list[LRSchedulerConfig]]:
    """Normalize whatever ``configure_optimizers`` returned into ``(optimizers, scheduler configs)``.

    Accepted forms: one optimizer; a list/tuple of optimizers; ``(optimizers, schedulers)``; a dict
    ``{"optimizer": opt, "lr_scheduler": sched_or_dict, "monitor": name}``; a list of such dicts; None
    (no optimizer, e.g. for manual optimization that builds its own).

    Raises:
        ValueError, TypeError: naming the form that was not understood.
    """
    if result is None:
        return [], []
    if _is_optimizer(result):
        return [result], []
    if isinstance(result, Mapping):
        return _parse_dicts([result])
    if isinstance(result, (list, tuple)):
        items = list(result)
        if items and all(isinstance(i, Mapping) for i in items):
            return _parse_dicts(items)
        if len(items) == 2 and isinstance(items[0], (list, tuple)) and isinstance(items[1], (list, tuple)):
            optimizers = list(items[0])
            _check_optimizers(optimizers)
            return optimizers, [_scheduler_config(s, optimizers) for s in items[1]]
        if all(_is_optimizer(i) for i in items):
            return items, []
    raise TypeError(
        f"configure_optimizers returned {type(result).__name__} {result!r:.200}, which is not understood; return an optimizer, "
        "a list of optimizers, (optimizers, schedulers), or {'optimizer': opt, 'lr_scheduler': sched}"
    )


def _check_optimizers(optimizers: Sequence[Any]) -> None:
    for opt in optimizers:
        if not _is_optimizer(opt):
            raise TypeError(f"configure_optimizers returned {opt!r:.200} where an optimizer was expected")


def _parse_dicts(items: Sequence[Mapping[str, Any]]) -> tuple[list[Any], list[LRSchedulerConfig]]:
    optimizers: list[Any] = []
    configs: list[LRSchedulerConfig] = []
    for item in items:
        if "optimizer" not in item:
            raise ValueError(f"a configure_optimizers dict needs an 'optimizer' key, got keys {sorted(item)}")
        unknown = set(item) - {"optimizer", "lr_scheduler", "monitor", "frequency"}
        if unknown:
            raise ValueError(f"unknown configure_optimizers key(s) {sorted(unknown)}; supported: optimizer, lr_scheduler, monitor")
        _check_optimizers([item["optimizer"]])
        optimizers.append(item["optimizer"])
    configs.extend(_scheduler_config(item["lr_scheduler"], optimizers, item.get("monitor")) for item in items if item.get("lr_scheduler") is not None)
    return optimizers, configs


class ManualOptimizer:
    """What ``self.optimizers()`` returns in manual optimization: the prepared optimizer, counting steps.

    Every ``step()`` call advances ``trainer.global_step``, as in Lightning.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, trainer: ModuleTrainerView) -> None:
        self.optimizer = optimizer
        self._trainer = trainer

    def step(self, closure: Callable[[], Any] | None = None) -> None:
        """Step the optimizer (loss scaling and skipped fp16 steps are handled by the Accelerator).

        Calls ``on_before_optimizer_step(optimizer)`` on the callbacks and the module first, as Lightning does;
        with a `closure`, after the closure ran (inside the optimizer's step), as Lightning's precision plugin does.
        """
        self._trainer.step_manual_optimizer(self, closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)

    def __repr__(self) -> str:
        return f"ManualOptimizer({self.optimizer!r})"


class TrainModule(PipelineSteps, nn.Module):
    """Base class of the modules the `Trainer` runs.

    Override ``training_step`` and ``configure_optimizers`` (and optionally the evaluation steps, the
    ``*_dataloader`` methods and any hook). Set ``automatic_optimization = False`` to drive the
    optimizers yourself with ``self.optimizers()``, ``self.manual_backward(loss)`` and ``opt.step()``.
    """

    automatic_optimization: bool = True
    # Lightning's: True, ``prepare_data`` runs on local rank 0 of each machine; False, on global rank 0 only
    prepare_data_per_node: bool = True
    # properties TorchScript must not compile (`to_torchscript`): they read the run or Python-only state
    __jit_unused_properties__: ClassVar[list[str]] = [
        "trainer", "device", "global_step", "logger", "loggers", "global_rank", "local_rank", "current_epoch",
        "example_input_array", "strict_loading", "device_mesh",
    ]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._trainer: ModuleTrainerView | None = None
        self.hparams: AttributeDict = AttributeDict()
        self._toggled: dict[int, bool] = {}
        self._example_input_array: Any = None
        self._strict_loading: bool | None = None
        self.jit_is_scripting = False  # True while `to_torchscript` reads every attribute: `trainer` is None then, not an error
        self.hparams_to_trackers = True  # `save_hyperparameters(logger=False)` keeps them from the trackers

    @property
    def example_input_array(self) -> Any:
        """An input of ``forward`` (a tensor, or a tuple of positional arguments, or a dict of keyword arguments): what
        `to_onnx` and `to_torchscript` (``method="trace"``) use when no input is given (Lightning's attribute)."""
        return self._example_input_array

    @example_input_array.setter
    def example_input_array(self, example: Any) -> None:
        self._example_input_array = example

    @property
    def strict_loading(self) -> bool:
        """Whether loading weights requires the checkpoint's keys to match the module's exactly (default True; set
        ``self.strict_loading = False`` for a module that saves only some of its weights, as in Lightning)."""
        return True if self._strict_loading is None else self._strict_loading

    @strict_loading.setter
    def strict_loading(self, strict: bool) -> None:
        self._strict_loading = strict

    # run context
    @property
    def trainer(self) -> ModuleTrainerView:
        """The `Trainer` running this module (raises outside a run); what it offers is `callbacks.view.ModuleTrainerView`."""
        if self._trainer is None and not self.jit_is_scripting:
            raise RuntimeError(f"{type(self).__name__} is not attached to a Trainer; call trainer.fit(module) (or validate/test/predict) first")
        return self._trainer  # type: ignore[return-value]  # None only while TorchScript reads the attributes

    @trainer.setter
    def trainer(self, trainer: ModuleTrainerView | None) -> None:
        object.__setattr__(self, "_trainer", trainer)

    @property
    def device(self) -> torch.device:
        """The device this module's parameters live on (the Trainer's device during a run)."""
        if self._trainer is not None:
            return torch.device(self._trainer.accelerator.device)
        param = next(iter(self.parameters()), None)
        return param.device if param is not None else torch.device("cpu")

    @property
    def device_mesh(self) -> DeviceMesh | None:
        """The strategy's device mesh (Lightning's): ``ModelParallelStrategy``'s ``"data_parallel"`` × ``"tensor_parallel"``,
        or FSDP's named mesh; None outside a run or for a strategy without one. ``configure_model`` parallelizes with it."""
        return self._trainer.accelerator.strategy.device_mesh if self._trainer is not None else None

    @property
    def global_step(self) -> int:
        """Optimizer steps taken so far (0 outside a run)."""
        return self._trainer.global_step if self._trainer is not None else 0

    @property
    def logger(self) -> GeneralTracker | None:
        """The trainer's first tracker (Lightning's ``self.logger``), or None."""
        return self._trainer.logger if self._trainer is not None else None

    @property
    def loggers(self) -> list[GeneralTracker]:
        """The trainer's trackers (Lightning's ``self.loggers``)."""
        return self._trainer.loggers if self._trainer is not None else []

    @property
    def global_rank(self) -> int:
        """This process's rank among all processes (0 outside a run), as in Lightning."""
        return int(self._trainer.global_rank) if self._trainer is not None else 0

    @property
    def local_rank(self) -> int:
        """This process's rank on its machine (0 outside a run)."""
        return int(self._trainer.local_rank) if self._trainer is not None else 0

    @property
    def current_epoch(self) -> int:
        """The current epoch (0 outside a run)."""
        return self._trainer.current_epoch if self._trainer is not None else 0

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Define it: what ``self(...)`` computes (``nn.Module``'s error when it is not defined)."""
        return super().forward(*args, **kwargs)

    # steps: the Trainer calls them as ``(batch, batch_idx)``, plus ``dataloader_idx`` with several evaluation loaders
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        """``training_step(batch, batch_idx)``: return the loss (a tensor), a dict with a ``"loss"`` key, or None to skip this batch."""
        raise NotImplementedError(f"{type(self).__name__} must implement training_step(batch, batch_idx) to be fitted")

    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        """``validation_step(batch, batch_idx)``: compute and ``self.log`` validation metrics for one batch."""
        raise NotImplementedError(f"{type(self).__name__} must implement validation_step(batch, batch_idx) to be validated")

    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        """``test_step(batch, batch_idx)``: compute and ``self.log`` test metrics for one batch."""
        raise NotImplementedError(f"{type(self).__name__} must implement test_step(batch, batch_idx) to be tested")

    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        """``predict_step(batch, batch_idx)``: return the predictions for one batch (default: ``self(batch)``, or
        ``self(batch[0])`` for (x, y) pairs)."""
        batch = kwargs["batch"] if "batch" in kwargs else args[0]
        if isinstance(batch, (list, tuple)) and len(batch) >= 1:
            return self(batch[0])
        return self(batch)

    # data: the Trainer uses loaders passed to it, else the datamodule's, else these (None: none)
    def prepare_data(self) -> None:
        """Download or write data to disk: once per machine (local rank 0, the others wait), before ``setup``."""

    def train_dataloader(self) -> Loaders | None:
        return None

    def val_dataloader(self) -> Loaders | None:
        return None

    def test_dataloader(self) -> Loaders | None:
        return None

    def predict_dataloader(self) -> Loaders | None:
        return None

    def configure_model(self) -> None:
        """Build the layers here instead of in ``__init__`` to have them built where the strategy wants (Lightning's hook).

        Called once per ``fit``/``validate``/``test``/``predict``, after ``setup`` and before the module is set up and
        ``configure_optimizers`` runs, inside the strategy's init context (`Trainer.init_module`): under FSDP2 on the
        meta device, so each process then initializes only its shards. It may run again on the same module (a later
        ``test`` after ``fit``): return early when the layers exist (``if self.model is not None: return``).
        """

    def configure_sharded_model(self) -> None:
        """Lightning's deprecated name of `configure_model`: called in its place, with a ``DeprecationWarning``."""

    def configure_optimizers(self) -> Any:
        """Return the optimizer(s) and scheduler(s); see `parse_optimizers` for the accepted forms."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement configure_optimizers(), e.g. return torch.optim.AdamW(self.parameters(), lr=1e-3)"
        )

    def configure_callbacks(self) -> Sequence[Callback] | Callback:
        """Callbacks this module brings (Lightning's hook): called when ``fit``/``validate``/``test``/``predict`` starts,
        before ``setup``. One of a class the Trainer already holds (or a subclass of it) replaces the Trainer's;
        checkpointing callbacks run last, as ever."""
        return []

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: StepOptimizer,
                       optimizer_closure: Callable[[], torch.Tensor | None] | None = None) -> None:
        """Step `optimizer` at the end of each accumulation window (automatic optimization; Lightning's hook).

        `optimizer_closure` runs ``training_step``, ``zero_grad`` (on a window's first batch) and backward: hand it to
        ``optimizer.step(closure=optimizer_closure)``, which then runs ``on_before_optimizer_step``, gradient clipping
        and the update. Override it to change the update, e.g. Lightning's learning-rate warm-up::

            def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure):
                optimizer.step(closure=optimizer_closure)
                if self.trainer.global_step < 500:
                    for group in optimizer.param_groups:
                        group["lr"] = min(1.0, (self.trainer.global_step + 1) / 500) * self.hparams.lr

        ``trainer.global_step`` counts this hook's calls. A module that does not override it (nor
        `configure_gradient_clipping`) is stepped by the Trainer directly, without the closure.
        """
        optimizer.step(closure=optimizer_closure)

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: torch.optim.Optimizer) -> None:
        """Zero the gradients, on the first batch of each accumulation window after ``training_step`` (automatic
        optimization). Override it to change how (Lightning's hook)::

            def optimizer_zero_grad(self, epoch, batch_idx, optimizer):
                optimizer.zero_grad(set_to_none=False)

        A module that does not override it keeps the Trainer's own zeroing (to None).
        """
        optimizer.zero_grad()

    def configure_gradient_clipping(self, optimizer: torch.optim.Optimizer, gradient_clip_val: float | None = None,
                                    gradient_clip_algorithm: str | None = None) -> None:
        """Clip gradients before each optimizer step (automatic optimization; Lightning's hook), after
        ``on_before_optimizer_step``; it gets the Trainer's ``gradient_clip_val``/``gradient_clip_algorithm``. The
        default clips with them (`clip_gradients`); an override may clip differently, e.g. per parameter group."""
        self.clip_gradients(optimizer, gradient_clip_val=gradient_clip_val, gradient_clip_algorithm=gradient_clip_algorithm)

    def lr_scheduler_step(self, scheduler: Any, metric: float | None) -> None:
        """Step one scheduler (override for schedulers with another ``step`` signature)."""
        if metric is None:
            scheduler.step()
        else:
            scheduler.step(metric)

    # logging
    def log(
        self,
        name: str,
        value: Any,
        prog_bar: bool = False,
        logger: bool | None = None,
        on_step: bool | None = None,
        on_epoch: bool | None = None,
        reduce_fx: str | Callable[..., object] = "mean",
        enable_graph: bool = False,
        sync_dist: bool = False,
        sync_dist_group: ProcessGroup | None = None,
        add_dataloader_idx: bool = True,
        batch_size: int | None = None,
        metric_attribute: str | None = None,
        rank_zero_only: bool = False,
    ) -> None:
        """Log a scalar (number, one-element tensor) or a torchmetrics ``Metric``; Lightning's arguments, in its order.

        Defaults follow Lightning: in training steps and batch hooks values are logged per step; in
        validation/test and epoch hooks they are aggregated per epoch (a mean weighted by batch size,
        or ``reduce_fx`` "sum"/"max"/"min"). With both ``on_step`` and ``on_epoch`` the names become
        ``name_step`` and ``name_epoch``. ``sync_dist=True`` reduces across processes; a ``Metric`` is
        computed (with its own distributed sync) and reset at epoch end. With several evaluation loaders a
        name logged in their steps becomes ``name/dataloader_idx_<i>`` unless ``add_dataloader_idx=False``.

        Args:
            logger: send the value to the trackers (None: True).
            enable_graph: keep the autograd graph of a tensor value (in ``callback_metrics``); by default it is detached.
                Epoch accumulators always hold detached values.
            sync_dist_group: the group ``sync_dist`` reduces over: None (or ``torch.distributed.group.WORLD``) for all
                processes; another group raises ``NotImplementedError`` (no strategy reduces over a sub-group).
            metric_attribute: accepted for Lightning's sake and not needed: a ``Metric``'s state stays in the module
                (Lightning uses the name to restore the state it keeps outside the module).
            rank_zero_only: the call may run on some processes only (typically ``if self.global_rank == 0:``): the value
                is never synchronized (``sync_dist`` is ignored), so no process waits for the others. Such a value is each
                process's own; don't monitor it in callbacks (another process would not find it). Trackers write rank 0's.
        """
        trainer = self._trainer  # not the property: this runs every step
        if trainer is None:
            trainer = self.trainer  # raises: not attached
        # positional: keyword passing costs
        trainer.log_value(name, value, on_step, on_epoch, prog_bar, True if logger is None else logger, sync_dist, reduce_fx, batch_size,
                          add_dataloader_idx, enable_graph, sync_dist_group, metric_attribute, rank_zero_only)

    def log_dict(
        self,
        dictionary: Mapping[str, Any],
        prog_bar: bool = False,
        logger: bool | None = None,
        on_step: bool | None = None,
        on_epoch: bool | None = None,
        reduce_fx: str | Callable[..., object] = "mean",
        enable_graph: bool = False,
        sync_dist: bool = False,
        sync_dist_group: ProcessGroup | None = None,
        add_dataloader_idx: bool = True,
        batch_size: int | None = None,
        rank_zero_only: bool = False,
    ) -> None:
        """``self.log`` every item of `dictionary` (a dict or a torchmetrics ``MetricCollection``) with the same arguments."""
        for name, value in dictionary.items():
            self.log(name, value, prog_bar, logger, on_step, on_epoch, reduce_fx, enable_graph, sync_dist, sync_dist_group,
                     add_dataloader_idx, batch_size, None, rank_zero_only)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on the main process only."""
        if self._trainer is None or self._trainer.is_global_zero:
            print(*args, **kwargs)

    def all_gather(self, data: Any, group: ProcessGroup | None = None, sync_grads: bool = False) -> Any:
        """Gather tensors from every process, stacked along a new dim 0 (unchanged in one process).

        `group` and `sync_grads` are Lightning's: only the default group (None) is offered, and ``sync_grads=True``
        (gradients flowing back through the gather) only in one process, where nothing is gathered.
        """
        trainer = self.trainer
        if group is not None:
            raise NotImplementedError(
                f"all_gather(..., group={group!r}): gathering over a sub-group is not offered; leave group=None (every process)"
            )
        if trainer.world_size == 1:
            return data
        if sync_grads:
            raise NotImplementedError(
                "all_gather(..., sync_grads=True) on several processes is not offered: the gathered tensors carry no gradient. "
                "Use torch.distributed.nn.functional.all_gather for a differentiable gather"
            )
        from strategies.collectives import apply_to_tensors  # lazy: `from trainer import TrainModule` loads no strategies module

        return apply_to_tensors(lambda t: trainer.accelerator.gather(t.unsqueeze(0)), data)

    # optimizers
    def optimizers(self, use_pl_optimizer: bool = True) -> torch.optim.Optimizer | ManualOptimizer | list[torch.optim.Optimizer] | list[ManualOptimizer]:
        """The prepared optimizer (or a list, when there are several); in manual optimization each wrapped so that
        ``opt.step()`` runs the step hooks and counts `global_step` (``use_pl_optimizer=False``: the prepared optimizers
        themselves, as Lightning)."""
        trainer = self.trainer
        if use_pl_optimizer and not self.automatic_optimization:
            wrapped = [ManualOptimizer(o, trainer) for o in trainer.optimizers]
            return wrapped[0] if len(wrapped) == 1 else wrapped
        opts = trainer.optimizers
        return opts[0] if len(opts) == 1 else opts

    def lr_schedulers(self) -> Any:
        """The scheduler (or a list when there are several; None when there is none)."""
        scheds = [c.scheduler for c in self.trainer.lr_scheduler_configs]
        if not scheds:
            return None
        return scheds[0] if len(scheds) == 1 else scheds

    def manual_backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Backward for manual optimization (through the Accelerator: loss scaling, DDP sync); `args` and `kwargs` are
        ``Tensor.backward``'s (``gradient``, ``retain_graph``, ``create_graph``, ``inputs``)."""
        if self.automatic_optimization:
            raise RuntimeError("manual_backward is for manual optimization; set self.automatic_optimization = False in __init__")
        if len(args) > len(_BACKWARD_ARGUMENTS):
            raise TypeError(f"manual_backward(loss, *{args!r}): Tensor.backward takes at most {_BACKWARD_ARGUMENTS} after the loss")
        for name, value in zip(_BACKWARD_ARGUMENTS, args):
            if name in kwargs:
                raise TypeError(f"manual_backward got {name!r} both by position and by name")
            kwargs[name] = value
        self.trainer.manual_backward(loss, **kwargs)

    def clip_gradients(self, optimizer: torch.optim.Optimizer | ManualOptimizer, gradient_clip_val: float | None = None, gradient_clip_algorithm: str | None = None) -> None:
        """Clip the gradients of `optimizer`'s parameters (unscaled first under fp16): in manual optimization, or in
        `configure_gradient_clipping`. Unset arguments are the Trainer's (no clipping without a value)."""
        trainer = self.trainer
        if gradient_clip_val is None:
            gradient_clip_val = trainer.gradient_clip_val
        if gradient_clip_algorithm is None:
            gradient_clip_algorithm = trainer.gradient_clip_algorithm or "norm"
        gradient_clip_algorithm = str(gradient_clip_algorithm).lower()
        if not gradient_clip_val or gradient_clip_val <= 0:
            return
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if gradient_clip_algorithm == "norm":
            self.trainer.accelerator.clip_grad_norm_(params, gradient_clip_val)
        elif gradient_clip_algorithm == "value":
            self.trainer.accelerator.clip_grad_value_(params, gradient_clip_val)
        else:
            raise ValueError(f"gradient_clip_algorithm={gradient_clip_algorithm!r} is not supported; use 'norm' or 'value'")

    def toggle_optimizer(self, optimizer: torch.optim.Optimizer | ManualOptimizer) -> None:
        """Freeze the parameters of the other optimizers until `untoggle_optimizer` (Lightning's rule: parameters no
        optimizer holds are left as they are)."""
        toggled: dict[int, bool] = {}
        for opt in self.trainer.optimizers:
            for p in (p for group in opt.param_groups for p in group["params"] if id(p) not in toggled):
                toggled[id(p)] = p.requires_grad
                p.requires_grad_(False)
        for p in (p for group in optimizer.param_groups for p in group["params"]):
            p.requires_grad_(toggled.get(id(p), p.requires_grad))
        self._toggled = toggled

    def untoggle_optimizer(self, optimizer: torch.optim.Optimizer | ManualOptimizer) -> None:
        """Undo `toggle_optimizer`."""
        for p in self.parameters():
            p.requires_grad_(self._toggled.get(id(p), p.requires_grad))
        self._toggled = {}

    @contextlib.contextmanager
    def toggled_optimizer(self, optimizer: torch.optim.Optimizer | ManualOptimizer) -> Iterator[None]:
        """`toggle_optimizer` for the block, `untoggle_optimizer` after it (also when the block raises)."""
        self.toggle_optimizer(optimizer)
        try:
            yield
        finally:
            self.untoggle_optimizer(optimizer)

    def freeze(self) -> None:
        """Stop gradients for every parameter and switch to eval mode."""
        for p in self.parameters():
            p.requires_grad_(False)
        self.eval()

    def unfreeze(self) -> None:
        """Undo `freeze`."""
        for p in self.parameters():
            p.requires_grad_(True)
        self.train()

    # hooks: the events of `callbacks.events`, without the ``trainer, module`` arguments
    def setup(self, stage: str) -> None: ...
    def on_fit_start(self) -> None: ...
    def on_sanity_check_start(self) -> None: ...
    def on_sanity_check_end(self) -> None: ...
    def on_train_start(self) -> None: ...
    def on_train_epoch_start(self) -> None: ...
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None: ...
    def on_before_backward(self, loss: torch.Tensor) -> None: ...
    def on_after_backward(self) -> None: ...
    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer | ManualOptimizer) -> None: ...
    def on_before_zero_grad(self, optimizer: torch.optim.Optimizer) -> None: ...
    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None: ...
    def on_train_epoch_end(self) -> None: ...
    def on_train_end(self) -> None: ...
    def on_fit_end(self) -> None: ...
    def teardown(self, stage: str) -> None: ...
    def on_validation_start(self) -> None: ...
    def on_validation_epoch_start(self) -> None: ...
    def on_validation_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_validation_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_validation_epoch_end(self) -> None: ...
    def on_validation_end(self) -> None: ...
    def on_test_start(self) -> None: ...
    def on_test_epoch_start(self) -> None: ...
    def on_test_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_test_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_test_epoch_end(self) -> None: ...
    def on_test_end(self) -> None: ...
    def on_predict_start(self) -> None: ...
    def on_predict_epoch_start(self) -> None: ...
    def on_predict_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_predict_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_predict_epoch_end(self) -> None: ...
    def on_predict_end(self) -> None: ...

    # Lightning's module-only hooks around an evaluation loop (no callback has them): the loop calls the ``*_eval``
    # hook before ``on_<stage>_start``; after ``on_<stage>_end`` it calls the ``*_train`` hook when overridden, else it
    # restores each submodule's mode as it was (predict: always restores)
    def on_validation_model_eval(self) -> None:
        """Switch to eval mode for validation (default ``self.eval()``)."""
        self.eval()

    def on_validation_model_train(self) -> None:
        """Switch back after validation (called only when overridden; else each submodule's mode is restored)."""
        self.train()

    def on_test_model_eval(self) -> None:
        """Switch to eval mode for testing (default ``self.eval()``)."""
        self.eval()

    def on_test_model_train(self) -> None:
        """Switch back after testing (called only when overridden; else each submodule's mode is restored)."""
        self.train()

    def on_predict_model_eval(self) -> None:
        """Switch to eval mode for prediction (default ``self.eval()``)."""
        self.eval()

    # batch transfer (Lightning's): each batch of every loader passes through these three, in this order, before
    # its batch hooks. Overriding any of them (here or on the DataModule, which wins) turns the loaders' own
    # device placement off, so `transfer_batch_to_device` is what moves the batch.
    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Change the batch before it is moved to the device (on the CPU); return it."""
        return batch

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        """Move the batch to `device` (default: every tensor in nested lists, tuples, dicts, dataclasses); return it."""
        from strategies.data import send_to_device  # lazy: `from trainer import TrainModule` loads no strategies module

        return send_to_device(batch, device)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        """Change the batch after it reached the device (e.g. GPU augmentation); return it."""
        return batch

    # hyperparameters and checkpoints
    def save_hyperparameters(self, *names: Any, ignore: Sequence[str] | str | None = None, frame: FrameType | None = None,
                             logger: bool = True) -> None:
        """Store the arguments of the calling ``__init__`` in ``self.hparams`` (and in checkpoints).

        Args:
            names: save only these arguments (all by default); or one mapping (a dict, an ``argparse.Namespace``) to
                save as it is, as Lightning.
            ignore: arguments to leave out (e.g. a large tensor or a sub-module).
            frame: where the search for the ``__init__`` arguments starts (Lightning's; default: the caller): the
                first ``__init__`` of this object above it, and the ``__init__`` calls of subclasses around that.
            logger: ``False`` keeps them from the trackers (they are still saved in checkpoints).
        """
        if not isinstance(logger, bool):
            raise TypeError(f"save_hyperparameters(logger={logger!r}) must be True or False")
        self.hparams_to_trackers = logger
        ignored = {ignore} if isinstance(ignore, str) else set(ignore or ())
        if len(names) == 1 and not isinstance(names[0], str):
            given = vars(names[0]) if hasattr(names[0], "__dict__") and not isinstance(names[0], Mapping) else names[0]
            if not isinstance(given, Mapping):
                raise TypeError(f"save_hyperparameters({names[0]!r}): pass argument names, or one dict or argparse.Namespace")
            self.hparams.update({k: v for k, v in given.items() if k not in ignored})
            return
        collected: dict[str, Any] = {}
        if frame is None:
            frame = inspect.currentframe()
            frame = frame.f_back if frame is not None else None

        def own_init(f: FrameType) -> bool:
            return f.f_code.co_name == "__init__" and f.f_locals.get("self") is self

        while frame is not None and not own_init(frame):  # Lightning's walk: up to this object's first __init__ ...
            frame = frame.f_back
        while frame is not None and own_init(frame):  # ... then through the __init__ calls of its classes
            collected = {**_init_arguments(frame), **collected}
            frame = frame.f_back
        del frame
        unknown = [n for n in names if n not in collected]
        if unknown:
            raise ValueError(f"save_hyperparameters({', '.join(map(repr, unknown))}): not arguments of __init__; choose from {sorted(collected)}")
        keep = names or tuple(collected)
        self.hparams.update({k: collected[k] for k in keep if k not in ignored and not isinstance(collected[k], nn.Module)})

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Add JSON-serializable entries to `checkpoint` before it is written."""

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Read what `on_save_checkpoint` added, when a checkpoint is restored."""

    def to_torchscript(self, file_path: str | os.PathLike[str] | None = None, method: str = "script",
                       example_inputs: Any = None, **kwargs: Any) -> Any:
        """This module as TorchScript (``torch.jit.script``, or ``torch.jit.trace`` on `example_inputs` or
        `example_input_array`), in eval mode, saved to `file_path` when given; Lightning's method."""
        from trainer.fit.export import to_torchscript  # lazy: `from trainer import TrainModule` loads no exporter

        return to_torchscript(self, file_path, method, example_inputs, **kwargs)

    def to_onnx(self, file_path: str | os.PathLike[str] | None = None, input_sample: Any = None, **kwargs: Any) -> Any:
        """Export this module to ONNX (``torch.onnx.export`` on `input_sample` or `example_input_array`, in eval mode;
        `kwargs` go to the exporter); Lightning's method. Needs the ``onnx`` package. Without `file_path` nothing is
        written (``torch.onnx.export(..., dynamo=True)`` returns the program)."""
        from trainer.fit.export import to_onnx  # lazy: `from trainer import TrainModule` loads no exporter

        return to_onnx(self, file_path, input_sample, **kwargs)

    @classmethod
    def load_from_checkpoint(
        cls, checkpoint_path: str | os.PathLike[str], map_location: str | int | torch.device | None = None, hparams_file: str | os.PathLike[str] | None = None,
        strict: bool | None = None, weights_only: bool | None = None, **overrides: Any
    ) -> TrainModule:
        """Rebuild a module from a checkpoint directory: its saved hyperparameters, then its weights.

        Args:
            checkpoint_path: a checkpoint directory (or its ``model.safetensors``).
            map_location: device to load the weights to (CPU by default).
            hparams_file: a YAML file of hyperparameters (such as the ``hparams.yaml`` a tracker wrote) that replace the
                saved ones of the same name, as Lightning's.
            strict: require the checkpoint's keys to match the module's exactly (None: the module's `strict_loading`).
            weights_only: Lightning 2.6's argument: None or True (nothing is unpickled here); False is refused.
            overrides: constructor arguments that replace saved hyperparameters.
        """
        # lazy: `from trainer import TrainModule` loads no strategies module
        from strategies.checkpoint_io import load_weights
        from trainer.fit import checkpointing

        checkpointing.check_weights_only(weights_only, "load_from_checkpoint")
        directory = checkpointing.lightning_path(Path(checkpoint_path))
        if directory.is_file():
            directory = directory.parent
        checkpointing.verify_checkpoint(directory)
        hparams = {**checkpointing.load_hparams(directory), **_hparams_from_file(hparams_file), **overrides}
        try:
            module = cls(**hparams)
        except TypeError as err:
            err.args = ((f"{err}; rebuilding {cls.__name__} from {str(directory)!r} with hyperparameters {sorted(hparams)} failed: "
                        "call self.save_hyperparameters() in __init__, or pass the missing arguments to load_from_checkpoint(..., name=value)"),)
            raise
        if module._strict_loading is not None and strict is not None and strict != module.strict_loading:
            raise ValueError(f"load_from_checkpoint(..., strict={strict!r}) conflicts with {cls.__name__}.strict_loading="
                             f"{module.strict_loading!r}; pass the same value, or leave strict unset to use strict_loading")
        load_weights(directory, module, device="cpu" if map_location is None else map_location,
                     strict=module.strict_loading if strict is None else strict)
        return module


def _hparams_from_file(path: str | os.PathLike[str] | None) -> dict[str, Any]:
    """``load_from_checkpoint(hparams_file=...)``: the mapping in a YAML file (nothing without a path)."""
    if path is None:
        return {}
    if Path(path).suffix.lower() not in (".yaml", ".yml"):
        raise ValueError(f"load_from_checkpoint(hparams_file={str(path)!r}): pass a .yaml or .yml file (a .csv of tags is not read here)")
    import yaml  # lazy: only this argument reads YAML

    with open(path, encoding="utf-8") as handle:
        data = yaml.safe_load(handle)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"load_from_checkpoint(hparams_file={str(path)!r}): the file holds {type(data).__name__}, not a mapping of hyperparameters")
    return data


def _init_arguments(frame: Any) -> dict[str, Any]:
    """The named arguments (and ``**kwargs``) of the function running in `frame`."""
    info = inspect.getargvalues(frame)
    values = {name: info.locals[name] for name in info.args if name != "self"}
    if info.varargs and info.locals.get(info.varargs):
        values[info.varargs] = list(info.locals[info.varargs])
    if info.keywords:
        values.update(info.locals.get(info.keywords) or {})
    return {k: v for k, v in values.items() if k != "__class__"}
