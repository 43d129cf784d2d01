"""Helpers Accelerate users import from ``accelerate.utils``, under the same names."""

from __future__ import annotations

import functools
import gc
import inspect
import os
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from callbacks.trackers.registry import LoggerType
from strategies.collectives import broadcast, broadcast_object, gather, gather_object, pad_across_processes, reduce
from strategies.data import send_to_device as _send_to_device
from trainer.accelerator.config import (
    DataLoaderConfiguration,
    DDPKwargs,
    DeepSpeedPlugin,
    DistributedDataParallelKwargs,
    DistributedType,
    FullyShardedDataParallelPlugin,
    GradientAccumulationPlugin,
    ProjectConfiguration,
    TorchDynamoPlugin,
)
from trainer.big_modeling import init_empty_weights, init_on_device


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


_OUT_OF_MEMORY = (
    " out of memory.",  # CUDA, ROCm, XPU
    "MPS backend out of memory",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",
    "DefaultCPUAllocator: can't allocate memory",
)


def should_reduce_batch_size(exception: BaseException) -> bool:
    """True for the out-of-memory errors (CUDA, MPS, CPU allocator, cuDNN) a smaller batch may avoid."""
    if isinstance(exception, torch.OutOfMemoryError):
        return True
    return isinstance(exception, RuntimeError) and len(exception.args) == 1 and any(
        text in str(exception.args[0]) for text in _OUT_OF_MEMORY)


def find_executable_batch_size(
    function: Callable[..., Any] | None = None,
    starting_batch_size: int = 128,
    reduce_batch_size_fn: Callable[[], int] | None = None,
) -> Any:
    """Decorator (Accelerate's): call ``function(batch_size, *args)``, retrying with a smaller batch size after each
    out-of-memory error (``int(batch_size * 0.9)``, or what `reduce_batch_size_fn` returns).

    The size that worked is kept for the next call. Other errors propagate. Under several processes every one
    must fail alike: a process that runs out of memory alone leaves the others waiting in their collective.
    """
    if function is None:
        return functools.partial(find_executable_batch_size, starting_batch_size=starting_batch_size,
                                 reduce_batch_size_fn=reduce_batch_size_fn)
    if isinstance(starting_batch_size, bool) or not isinstance(starting_batch_size, int) or starting_batch_size < 1:
        raise ValueError(f"starting_batch_size={starting_batch_size!r} must be an int >= 1")
    batch_size = starting_batch_size

    def smaller() -> int:
        return int(batch_size * 0.9)

    reduce = reduce_batch_size_fn or smaller
    params = list(inspect.signature(function).parameters)

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        nonlocal batch_size
        if len(params) < len(args) + 1:
            raise TypeError(
                f"{function.__name__}() got its batch size as an argument; the decorator passes it: call "
                f"{function.__name__}({', '.join(params[1:len(args)])}) without it"
            )
        while True:
            if batch_size < 1:
                raise RuntimeError(f"no executable batch size found for {function.__name__}(): reached {batch_size}")
            try:
                return function(batch_size, *args, **kwargs)
            except Exception as error:
                if not should_reduce_batch_size(error):
                    raise
            gc.collect()  # out of the except block: the failed call's frames (and their tensors) are gone now
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            batch_size = reduce()

    return run


def send_to_device(data: Any, device: torch.device | str, non_blocking: bool = False) -> Any:
    return _send_to_device(data, device, non_blocking=non_blocking)


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
    "FullyShardedDataParallelPlugin",
    "GradientAccumulationPlugin",
    "LoggerType",
    "ProjectConfiguration",
    "TorchDynamoPlugin",
    "broadcast",
    "broadcast_object",
    "broadcast_object_list",
    "find_executable_batch_size",
    "gather",
    "gather_object",
    "init_empty_weights",
    "init_on_device",
    "pad_across_processes",
    "reduce",
    "seed_everything",
    "send_to_device",
    "set_seed",
    "should_reduce_batch_size",
]
