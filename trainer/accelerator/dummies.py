"""Accelerate's stand-ins for an optimizer and a schedule that a DeepSpeed config describes.

    optimizer = DummyOptim(model.parameters(), lr=3e-4, weight_decay=0.01)   # the config's "optimizer" section
    scheduler = DummyScheduler(optimizer, total_num_steps=1000, warmup_num_steps=100)   # its "scheduler" section
    model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)

`prepare` fills the config's ``"auto"`` entries from them (``optimizer.params.lr``/``weight_decay``; the scheduler's
``warmup_min_lr`` 0, ``warmup_max_lr`` the optimizer's lr, ``warmup_num_steps``, and ``total_num_steps`` divided by
the process count unless ``split_batches``, as Accelerate does), then the DeepSpeed engine builds both. The schedule
is stepped by the engine in its optimizer step, so the prepared scheduler's ``step()`` does nothing.
A ``DummyScheduler(..., lr_scheduler_callable=fn)`` without a ``scheduler`` section builds the schedule as
``fn(optimizer)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau


class DummyOptim:
    """The optimizer of the DeepSpeed config, over `params` (parameters or parameter groups)."""

    def __init__(self, params: Any, lr: float = 0.001, weight_decay: float = 0, **kwargs: Any) -> None:
        self.params = list(params) if not isinstance(params, (list, tuple)) else params
        self.lr = lr
        self.weight_decay = weight_decay
        self.kwargs = kwargs


class DummyScheduler:
    """The learning-rate schedule of the DeepSpeed config (or ``lr_scheduler_callable(optimizer)``)."""

    def __init__(
        self, optimizer: DummyOptim | torch.optim.Optimizer, total_num_steps: int | None = None, warmup_num_steps: int = 0,
        lr_scheduler_callable: Callable[[Any], Any] | None = None, **kwargs: Any,
    ) -> None:
        self.optimizer = optimizer
        self.total_num_steps = total_num_steps
        self.warmup_num_steps = warmup_num_steps
        self.lr_scheduler_callable = lr_scheduler_callable
        self.kwargs = kwargs


class EngineScheduler:
    """The schedule a DeepSpeed engine built and steps itself: ``step()`` does nothing, the rest is the schedule's."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler

    def step(self, *args: Any, **kwargs: Any) -> None:
        """Nothing: the engine stepped the schedule in its optimizer step."""

    def get_last_lr(self) -> list[float]:
        return list(self.scheduler.get_last_lr())

    def state_dict(self) -> dict[str, Any]:
        return dict(self.scheduler.state_dict())

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.scheduler.load_state_dict(state_dict)

    def __getattr__(self, name: str) -> Any:
        if name == "scheduler":
            raise AttributeError(name)
        return getattr(self.scheduler, name)


def check_placeholders(config: dict[str, Any] | None, optimizer: torch.optim.Optimizer | DummyOptim | None,
                       scheduler: LRScheduler | ReduceLROnPlateau | DummyScheduler | None, strategy_name: str) -> None:
    """Accelerate's rules for the stand-ins: each needs its config section, and a real one contradicts it."""
    dummies = [type(o).__name__ for o in (optimizer, scheduler) if isinstance(o, (DummyOptim, DummyScheduler))]
    if config is None:
        if dummies:
            raise ValueError(
                f"{' and '.join(dummies)} stand for the optimizer and schedule of a DeepSpeed config, but this run uses "
                f"strategy={strategy_name!r}; build a torch optimizer (and scheduler) instead, or run DeepSpeed "
                "(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=...))"
            )
        return
    if isinstance(optimizer, DummyOptim) and "optimizer" not in config:
        raise ValueError("DummyOptim needs an 'optimizer' section in the DeepSpeed config; add one, or pass a torch optimizer")
    if isinstance(scheduler, DummyScheduler) and "scheduler" not in config and scheduler.lr_scheduler_callable is None:
        raise ValueError(
            "DummyScheduler needs a 'scheduler' section in the DeepSpeed config, or lr_scheduler_callable=fn (fn(optimizer) "
            "builds the schedule); add one of them"
        )
    if scheduler is not None and not isinstance(scheduler, DummyScheduler) and "scheduler" in config:
        raise ValueError(
            "a scheduler was passed and the DeepSpeed config has a 'scheduler' section; use one: drop the section, or pass "
            "trainer.utils.DummyScheduler"
        )
    if isinstance(scheduler, DummyScheduler) and optimizer is not None and not isinstance(optimizer, DummyOptim):
        raise ValueError("DummyScheduler goes with DummyOptim (the engine builds both); with a torch optimizer pass a torch scheduler")


def auto_values(optimizer: torch.optim.Optimizer | DummyOptim | None, scheduler: LRScheduler | ReduceLROnPlateau | DummyScheduler | None,
                num_processes: int, split_batches: bool) -> dict[str, Any]:
    """The values the stand-ins give the config's ``"auto"`` entries (Accelerate's)."""
    values: dict[str, Any] = {}
    if isinstance(optimizer, DummyOptim):
        values.update({"optimizer.params.lr": optimizer.lr, "optimizer.params.weight_decay": optimizer.weight_decay})
    if isinstance(scheduler, DummyScheduler) and scheduler.lr_scheduler_callable is None:
        source = scheduler.optimizer
        defaults = getattr(source, "defaults", None)
        max_lr = defaults["lr"] if defaults is not None else getattr(source, "lr", None)
        values.update({"scheduler.params.warmup_min_lr": 0, "scheduler.params.warmup_max_lr": max_lr,
                       "scheduler.params.warmup_num_steps": max(1, scheduler.warmup_num_steps)})
        if scheduler.total_num_steps is not None:
            total = scheduler.total_num_steps
            values["scheduler.params.total_num_steps"] = total if split_batches else math.ceil(total / num_processes)
    return values


__all__ = ["DummyOptim", "DummyScheduler", "EngineScheduler", "auto_values", "check_placeholders"]
