"""The `Accelerator` face: the user keeps the loop; ``prepare``, ``backward``, ``save_state`` go through a strategy."""

from trainer.accelerator.accelerator import Accelerator

__all__ = ["Accelerator"]
