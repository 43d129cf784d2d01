"""Accelerate's ``accelerate.state`` under the renamed import: ``from trainer.state import PartialState``."""

from trainer.accelerator.gradient_state import GradientState
from trainer.accelerator.layout import AcceleratorState, DistributedType, PartialState, is_initialized
from trainer.unsupported import unsupported_names

__all__ = ["AcceleratorState", "DistributedType", "GradientState", "PartialState", "is_initialized"]

# Accelerate names deliberately not provided (SharedDict, ...): see trainer.unsupported
__getattr__ = unsupported_names(__name__)
