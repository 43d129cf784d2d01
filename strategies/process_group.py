"""The process group every multi-process strategy (DDP, FSDP) joins, as two plain functions."""

from __future__ import annotations

import atexit
import datetime
import os
from collections.abc import Callable

import torch
import torch.distributed as dist

from strategies.environment import ClusterEnvironment


def join_process_group(cluster: ClusterEnvironment, device: torch.device, backend: str, timeout: float, teardown: Callable[[], None]) -> bool:
    """Select `device` and join (or create) the default process group; return True when this call created it.

    `teardown` is registered to run at interpreter exit: a script that never calls ``end_training()``
    would otherwise reach exit with gloo's threads alive, and their destructors abort the process
    ("terminate called without an active exception").
    """
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if dist.is_initialized():
        if dist.get_world_size() != cluster.world_size:
            raise RuntimeError(
                f"a process group of size {dist.get_world_size()} already exists but the environment says "
                f"{cluster.world_size} processes; destroy it or fix WORLD_SIZE"
            )
        return False
    os.environ.setdefault("MASTER_ADDR", cluster.master_addr)
    os.environ.setdefault("MASTER_PORT", str(cluster.master_port))
    dist.init_process_group(
        backend=backend,
        init_method="env://",
        world_size=cluster.world_size,
        rank=cluster.rank,
        timeout=datetime.timedelta(seconds=timeout),
    )
    atexit.register(teardown)
    return True


def leave_process_group(owned: bool) -> None:
    """Destroy the default process group if `owned` (this strategy created it) and it still exists."""
    if owned and dist.is_initialized():
        dist.destroy_process_group()
