"""The `Accelerator` face: the user keeps the loop; ``prepare``, ``backward``, ``save_state`` go through a strategy.

Also Accelerate's ``accelerate.accelerator`` under the renamed import: the configuration records it re-exports.
"""

from trainer.accelerator.accelerator import Accelerator
from trainer.accelerator.config import (
    DataLoaderConfiguration,
    DeepSpeedPlugin,
    DistributedDataParallelKwargs,
    DistributedType,
    GradientAccumulationPlugin,
    ProjectConfiguration,
)

__all__ = [
    "Accelerator",
    "DataLoaderConfiguration",
    "DeepSpeedPlugin",
    "DistributedDataParallelKwargs",
    "DistributedType",
    "GradientAccumulationPlugin",
    "ProjectConfiguration",
]
