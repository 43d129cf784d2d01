"""``lightning.pytorch.utilities.types`` under the rename: the type aliases Lightning code annotates with."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Union

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau

from trainer.fit.module import LRSchedulerConfig

STEP_OUTPUT = Union[torch.Tensor, Mapping[str, Any]]
TRAIN_DATALOADERS = Any
EVAL_DATALOADERS = Any
LRSchedulerTypeUnion = Union[LRScheduler, ReduceLROnPlateau]
LRSchedulerTypeTuple = (LRScheduler, ReduceLROnPlateau)
LRSchedulerType = Union[type[LRScheduler], type[ReduceLROnPlateau]]
LRSchedulerPLType = LRSchedulerTypeUnion
OptimizerConfig = dict[str, Any]
LRSchedulerConfigType = dict[str, Any]
OptimizerLRSchedulerConfig = dict[str, Any]
OptimizerLRScheduler = Union[
    Optimizer, Sequence[Optimizer], tuple[Sequence[Optimizer], Sequence[Union[LRSchedulerTypeUnion, LRSchedulerConfig]]],
    OptimizerLRSchedulerConfig, Sequence[OptimizerLRSchedulerConfig], None,
]

__all__ = [
    "EVAL_DATALOADERS", "STEP_OUTPUT", "TRAIN_DATALOADERS", "LRSchedulerConfig", "LRSchedulerConfigType", "LRSchedulerPLType",
    "LRSchedulerType", "LRSchedulerTypeTuple", "LRSchedulerTypeUnion", "OptimizerConfig", "OptimizerLRScheduler",
    "OptimizerLRSchedulerConfig",
]
