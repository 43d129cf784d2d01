"""Accelerate's ``accelerate.state`` under the renamed import: ``from trainer.state import PartialState``."""

from trainer.accelerator import layout
from trainer.accelerator.gradient_state import GradientState
from trainer.accelerator.layout import AcceleratorState, DistributedType, PartialState
from trainer.unsupported import unsupported_names


def is_initialized() -> bool:
    """Whether this process's layout is set up (an `Accelerator` or a `PartialState()` was made), as Accelerate's."""
    return bool(layout._shared)


__all__ = ["AcceleratorState", "DistributedType", "GradientState", "PartialState", "is_initialized"]

# Accelerate names deliberately not provided (SharedDict, ...): see trainer.unsupported
__getattr__ = unsupported_names(__name__)
