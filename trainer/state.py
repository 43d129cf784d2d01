"""Accelerate's ``accelerate.state`` under the renamed import: ``from trainer.state import PartialState``."""

from trainer.accelerator.layout import AcceleratorState, DistributedType, PartialState

__all__ = ["AcceleratorState", "DistributedType", "PartialState"]
