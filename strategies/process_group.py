"""The process group every multi-process strategy (DDP, FSDP) joins, as two plain functions."""

from __future__ import annotations

import atexit
import datetime
import os
import sys
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
    die_with_launcher()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if dist.is_initialized():
        if dist.get_world_size() != cluster.world_size:
            raise RuntimeError(
                f"a process group of size {dist.get_world_size()} already exists but the environment says "
                f"{cluster.world_size} processes; destroy it or fix WORLD_SIZE"
            )
        return False
    if debug_collectives():
        # torch checks every collective's op, shapes and dtypes against the other ranks' before running it, and
        # names both sides on a mismatch (ProcessGroupWrapper); costs a small extra collective per call
        os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
        dist.set_debug_level(dist.DebugLevel.DETAIL)  # torch reads the variable once, maybe before this process set it
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


def debug_collectives() -> bool:
    """``TRAINWRIGHT_DEBUG_COLLECTIVES=1`` (or Accelerate's ``ACCELERATE_DEBUG_MODE=1``): check that every rank calls
    the same collective with compatible shapes and dtypes, and name the ranks that do not."""
    return any(os.environ.get(name, "").lower() in ("1", "true", "yes") for name in ("TRAINWRIGHT_DEBUG_COLLECTIVES", "ACCELERATE_DEBUG_MODE"))


def die_with_launcher() -> None:
    """Under ``trainer launch``: have the kernel send this worker SIGTERM if the launcher dies (even of SIGKILL).

    Linux only (``prctl(PR_SET_PDEATHSIG)``); elsewhere, and outside ``trainer launch``, nothing happens.
    """
    launcher = os.environ.get("TRAINWRIGHT_LAUNCHER_PID")
    if not launcher or not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if str(os.getppid()) != launcher:  # the launcher died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


def leave_process_group(owned: bool) -> None:
    """Destroy the default process group if `owned` (this strategy created it) and it still exists."""
    if owned and dist.is_initialized():
        dist.destroy_process_group()
