"""Helpers Accelerate users import from ``accelerate.utils``, under the same names."""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import torch

from callbacks.trackers.registry import LoggerType
from strategies.collectives import broadcast, broadcast_object, gather, gather_object, pad_across_processes, reduce
from trainer.accelerator.config import (
    DataLoaderConfiguration,
    DDPKwargs,
    DeepSpeedPlugin,
    DistributedDataParallelKwargs,
    DistributedType,
    GradientAccumulationPlugin,
    ProjectConfiguration,
)


def set_seed(seed: int, device_specific: bool = False, deterministic: bool = False) -> None:
    """Seed python, numpy and torch (all devices). ``device_specific`` adds the process rank."""
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed={seed!r} must be an int")
    if device_specific:
        seed += int(os.environ.get("RANK", "0"))
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    if deterministic:
        torch.use_deterministic_algorithms(True)


def seed_everything(seed: int | None = None, workers: bool = False, verbose: bool = True) -> int:
    """Lightning's ``seed_everything``: seed python, numpy and torch; returns the seed.

    Without `seed`, ``PL_GLOBAL_SEED`` (as Lightning) or ``TRAINWRIGHT_SEED``, else 0. `workers` is accepted for
    compatibility: prepared loaders already seed their workers from the shared data seed.
    """
    if seed is None:
        raw = os.environ.get("PL_GLOBAL_SEED") or os.environ.get("TRAINWRIGHT_SEED") or "0"
        try:
            seed = int(raw)
        except ValueError:
            raise ValueError(f"the seed environment variable holds {raw!r}, not an int; set it to e.g. 42") from None
    set_seed(seed)
    os.environ["PL_GLOBAL_SEED"] = str(seed)
    if verbose:
        print(f"Seed set to {seed}")
    return seed


def send_to_device(data: Any, device: torch.device | str, non_blocking: bool = False) -> Any:
    from strategies.data import send_to_device as _send

    return _send(data, device, non_blocking=non_blocking)


def broadcast_object_list(objects: list[Any], from_process: int = 0) -> list[Any]:
    """Broadcast a list of picklable objects in place (Accelerate's signature)."""
    result = broadcast_object(list(objects), from_process)
    objects[:] = result
    return objects


__all__ = [
    "DDPKwargs",
    "DataLoaderConfiguration",
    "DeepSpeedPlugin",
    "DistributedDataParallelKwargs",
    "DistributedType",
    "GradientAccumulationPlugin",
    "LoggerType",
    "ProjectConfiguration",
    "broadcast",
    "broadcast_object",
    "broadcast_object_list",
    "gather",
    "gather_object",
    "pad_across_processes",
    "reduce",
    "seed_everything",
    "send_to_device",
    "set_seed",
]
