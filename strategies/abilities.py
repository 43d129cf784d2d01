"""Optional abilities of a strategy, as small interfaces (after Lightning Fabric's ``_BackwardSyncControl``/``_Sharded``).

A face asks ``isinstance(strategy, Engine)`` once, where it sets things up, instead of reading a flag.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

import torch
from torch import nn


class Engine(ABC):
    """A training engine that builds the module and its optimizer in one call and steps inside its own backward.

    DeepSpeed's: the faces build the optimizers on the plain module first and hand both to
    `setup_module_and_optimizers` (a model alone cannot be set up); on an accumulation boundary the engine's
    ``backward`` reduces, clips, steps and zeroes, so ``optimizer_step`` only reports whether the step applied, and a
    learning-rate schedule advances once per optimizer step.
    """

    config: dict[str, Any]  # the engine's configuration (DeepSpeed's config dict)

    @abstractmethod
    def setup_module_and_optimizers(
        self, module: nn.Module, optimizers: list[torch.optim.Optimizer], *, move: bool = True, batch_size: int | None = None,
        model_parameters: Any = None, lr_scheduler: Callable[[torch.optim.Optimizer], object] | None = None,
    ) -> tuple[nn.Module, list[torch.optim.Optimizer]]:
        """Build the engine around `module` and `optimizers`; returns what to call and what to step. With no optimizer,
        the engine may build the one its `config` describes, over `model_parameters`, and a schedule (its own, or
        ``lr_scheduler(optimizer)``)."""

    @abstractmethod
    def fill_auto(self, values: dict[str, Any]) -> None:
        """Fill the config's ``"auto"`` entries named by dotted key in `values`."""


class Float8AllGather(ABC):
    """A strategy whose sharded weights can be all-gathered in float8 (FSDP2 with torchao's ``enable_fsdp_float8_all_gather``).

    The faces ask it when a float8 recipe turns that on: the float8 scales of the sharded weights are then computed for
    all of them together after each optimizer step, instead of one weight at a time in the next all-gather (torchao's
    ``precompute_float8_dynamic_scale_for_fsdp``, as Accelerate does).
    """

    @abstractmethod
    def precompute_float8_scales_after_step(self, optimizer: torch.optim.Optimizer, module: nn.Module) -> None:
        """Refresh `module`'s float8 weight scales after every step of `optimizer`."""
