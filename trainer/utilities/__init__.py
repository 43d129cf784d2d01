"""``lightning.pytorch.utilities`` under the rename: the helpers Lightning scripts import from it.

Submodules as Lightning's: `rank_zero`, `combined_loader`, `seed`, `grads`, `types`, `exceptions`, `deepspeed`.
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from enum import Enum
from typing import Any

import torch
from torch import nn

from strategies.data import send_to_device
from trainer.fit.combined_loader import CombinedLoader
from trainer.fit.module import AttributeDict
from trainer.lightning_api import not_offered
from trainer.utilities.grads import grad_norm
from trainer.utilities.rank_zero import rank_zero_deprecation, rank_zero_info, rank_zero_only, rank_zero_warn


class LightningEnum(str, Enum):
    """A string enum compared without case (Lightning's)."""

    @classmethod
    def from_str(cls, value: str, source: str = "key") -> LightningEnum:
        for st in cls:
            if st.value.lower() == value.lower() or st.name.lower() == value.lower():
                return st
        raise ValueError(f"Invalid match: expected one of {[e.value for e in cls]}, but got {value}.")

    def __eq__(self, other: object) -> bool:
        other = other.value if isinstance(other, Enum) else str(other)
        return bool(self.value.lower() == other.lower())

    def __hash__(self) -> int:
        return hash(self.value.lower())


class GradClipAlgorithmType(LightningEnum):
    """``Trainer(gradient_clip_algorithm=...)``: ``"value"`` or ``"norm"``."""

    VALUE = "value"
    NORM = "norm"


def move_data_to_device(batch: Any, device: torch.device | str | int) -> Any:
    """Every tensor in `batch` (nested lists, tuples, dicts, dataclasses) moved to `device`."""
    return send_to_device(batch, device)


def is_picklable(obj: object) -> bool:
    """True when ``pickle.dumps(obj)`` works."""
    try:
        pickle.dumps(obj)
    except (pickle.PickleError, AttributeError, RecursionError, TypeError):
        return False
    return True


def suggested_max_num_workers(local_world_size: int) -> int:
    """An upper bound for a loader's ``num_workers``: the CPUs this process may use per local process, less one."""
    if local_world_size < 1:
        raise ValueError(f"`local_world_size` should be >= 1, got {local_world_size}.")
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cpus // local_world_size - 1)


def measure_flops(model: nn.Module, forward_fn: Callable[[], torch.Tensor], loss_fn: Callable[[torch.Tensor], torch.Tensor] | None = None) -> int:
    """The floating-point operations of ``forward_fn()`` (and of the backward of ``loss_fn(output)`` when given),
    counted by ``torch.utils.flop_counter.FlopCounterMode``; build `model` on the meta device to count without
    memory."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        if loss_fn is None:
            forward_fn()
        else:
            loss_fn(forward_fn()).backward()
    return int(counter.get_total_flops())


def find_shared_parameters(module: nn.Module) -> list[list[str]]:
    """The names of each parameter reachable under several names (tied weights), one list per parameter."""
    names: dict[nn.Parameter, list[str]] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        names.setdefault(param, []).append(name)
    return [group for group in names.values() if len(group) > 1]


def set_shared_parameters(module: nn.Module, shared_params: list[list[str]]) -> nn.Module:
    """Tie again the parameters `find_shared_parameters` found (after something, e.g. a ``.to()``, untied them)."""
    for group in shared_params:
        first = module.get_parameter(group[0])
        for path in group[1:]:
            owner, _, name = path.rpartition(".")
            setattr(module.get_submodule(owner) if owner else module, name, first)
    return module


def disable_possible_user_warnings(module: str = "") -> None:
    """Nothing to do: Trainwright raises no ``PossibleUserWarning`` (filter a warning by its message or category)."""


is_shared_filesystem = not_offered(
    "is_shared_filesystem", "lightning.pytorch.utilities",
    "checkpoint directories are written by each process's share and agreed on by the store; no file-system probe is needed",
    module=__name__,
)


__all__ = [
    "AttributeDict", "CombinedLoader", "GradClipAlgorithmType", "LightningEnum", "disable_possible_user_warnings",
    "find_shared_parameters", "grad_norm", "is_picklable", "is_shared_filesystem", "measure_flops", "move_data_to_device",
    "rank_zero_deprecation", "rank_zero_info", "rank_zero_only", "rank_zero_warn", "set_shared_parameters",
    "suggested_max_num_workers",
]
