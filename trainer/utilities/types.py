"""``lightning.pytorch.utilities.types`` under the rename: the type aliases Lightning code annotates with."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

from trainer.fit.module import LRSchedulerConfig

STEP_OUTPUT = torch.Tensor | Mapping[str, Any]
TRAIN_DATALOADERS = Any
EVAL_DATALOADERS = Any
LRSchedulerTypeUnion = LRScheduler | ReduceLROnPlateau
LRSchedulerTypeTuple = (LRScheduler, ReduceLROnPlateau)
LRSchedulerType = type[LRScheduler] | type[ReduceLROnPlateau]
LRSchedulerPLType = LRSchedulerTypeUnion
OptimizerConfig = dict[str, Any]
LRSchedulerConfigType = dict[str, Any]
OptimizerLRSchedulerConfig = dict[str, Any]
OptimizerLRScheduler = (
    Optimizer | Sequence[Optimizer] | tuple[Sequence[Optimizer], Sequence[LRSchedulerTypeUnion | LRSchedulerConfig]]
    | OptimizerLRSchedulerConfig | Sequence[OptimizerLRSchedulerConfig] | None
)

__all__ = [
    "EVAL_DATALOADERS", "STEP_OUTPUT", "TRAIN_DATALOADERS", "LRSchedulerConfig", "LRSchedulerConfigType", "LRSchedulerPLType",
    "LRSchedulerType", "LRSchedulerTypeTuple", "LRSchedulerTypeUnion", "OptimizerConfig", "OptimizerLRScheduler",
    "OptimizerLRSchedulerConfig",
]
