"""The process group every multi-process strategy (DDP, FSDP) joins, as two plain functions."""

from __future__ import annotations

import atexit
import contextlib
import datetime
import faulthandler
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

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
    report_hung_ranks(cluster.rank, cluster.world_size, timeout, several_machines=cluster.world_size > cluster.local_world_size)
    return True


# A signal every worker answers by printing all its threads' Python stacks (faulthandler), for the hung-rank report.
_STACK_SIGNAL = getattr(signal, "SIGRTMIN", 0) + 2 if hasattr(signal, "SIGRTMIN") else None
_KEY = "trainwright/{kind}/{rank}"


def report_hung_ranks(rank: int, world_size: int, timeout: float, *, several_machines: bool = False) -> None:
    """When a collective times out here, name the ranks that never reached it and dump their Python stacks.

    A rank that hangs alive (stuck before a collective) makes the others fail after the process-group timeout
    with gloo's bare "Timed out waiting ... for recv". Each process records its host and pid in the process
    group's store now; on a timeout, each waiting process marks itself there, waits a moment for the other
    waiting ones, and the unmarked ranks are the ones that never arrived: this process says so, names the
    setting that changes the timeout, and has them print their stacks (faulthandler): by a signal on this
    machine (it works even while the hung process holds the GIL), through the store on the others (with
    several machines, each process's watcher thread polls its key every 2 s).
    """
    store = _default_store()
    if store is None:
        return
    if _STACK_SIGNAL is not None:
        faulthandler.register(_STACK_SIGNAL, all_threads=True, chain=False)
    store.set(_KEY.format(kind="pid", rank=rank), f"{_machine()} {os.getpid()}")
    if several_machines:
        threading.Thread(target=_print_stack_when_asked, args=(store, rank), name="trainwright-stack-watch", daemon=True).start()
    previous = sys.excepthook

    def hook(kind: type[BaseException], error: BaseException, tb: Any) -> None:
        if _is_timeout(error):
            with contextlib.suppress(Exception):  # the report must never hide the error itself
                _report_timeout(store, rank, world_size, timeout)
        previous(kind, error, tb)

    sys.excepthook = hook


def _machine() -> str:
    """This process's machine: the host name, and the launcher's node rank (simulated machines share a host)."""
    return f"{socket.gethostname()}/{os.environ.get('GROUP_RANK', '0')}"


def _print_stack_when_asked(store: Any, rank: int) -> None:
    key = _KEY.format(kind="dump", rank=rank)
    while True:
        time.sleep(2.0)
        try:
            asked = store.check([key])
        except Exception:  # the process group is gone: nothing to watch
            return
        if asked:
            print(f"trainwright: rank {rank} was asked for its Python stack: another rank waited for it in a collective",
                  file=sys.stderr, flush=True)
            faulthandler.dump_traceback(all_threads=True)
            return


def _leave_report(rank: int, report: dict[str, Any]) -> None:
    """Write `report` where ``trainer launch`` reads it for its summary (``TRAINWRIGHT_FAULT_DIR``, when set)."""
    folder = os.environ.get("TRAINWRIGHT_FAULT_DIR")
    if folder and os.path.isdir(folder):
        path = os.path.join(folder, f"hung-{rank}.json")
        with open(path + ".tmp", "w", encoding="utf-8") as file:
            json.dump(report, file)
        os.replace(path + ".tmp", path)


def read_hung_reports(folder: str) -> list[dict[str, Any]]:
    """The reports `_leave_report` wrote in `folder`, lowest waiting rank first."""
    reports = []
    for name in sorted(os.listdir(folder)):
        if name.startswith("hung-") and name.endswith(".json"):
            with contextlib.suppress(OSError, ValueError), open(os.path.join(folder, name), encoding="utf-8") as file:
                reports.append(json.load(file))
    return sorted(reports, key=lambda r: r["waiting"])


def _is_timeout(error: BaseException) -> bool:
    """gloo's timeout, or its error when a peer left the group (a collective called on some ranks only)."""
    text = str(error)
    parts = ("Timed out waiting", "Connection closed by peer", "Connection reset by peer", "Read error")
    return isinstance(error, RuntimeError) and any(part in text for part in parts)


def _default_store() -> Any:
    get = getattr(dist.distributed_c10d, "_get_default_store", None)
    try:
        return get() if get is not None else None
    except (RuntimeError, ValueError):
        return None


def _report_timeout(store: Any, rank: int, world_size: int, timeout: float) -> None:
    store.set(_KEY.format(kind="waiting", rank=rank), "1")
    time.sleep(min(5.0, max(1.0, timeout / 10)))  # the other waiting ranks time out at about the same moment
    waiting = [r for r in range(world_size) if store.check([_KEY.format(kind="waiting", rank=r)])]
    missing = [r for r in range(world_size) if r not in waiting]
    here, alive, gone, remote = _machine(), [], [], []
    for r in missing:
        machine, pid = store.get(_KEY.format(kind="pid", rank=r)).decode().split()
        if machine != here or _STACK_SIGNAL is None:
            store.set(_KEY.format(kind="dump", rank=r), "1")  # its watcher thread prints its stack on its machine
            remote.append(r)
            continue
        try:
            os.kill(int(pid), _STACK_SIGNAL)
            alive.append(r)
        except ProcessLookupError:
            gone.append(r)
    if missing:
        who = f"rank(s) {missing} never reached it"
        who += f"; still running: {alive} (their Python stacks are printed too, by faulthandler)" if alive else ""
        who += f"; already exited: {gone} (a collective called on some ranks only?)" if gone else ""
        who += f"; on other machines: {remote} (asked to print their Python stacks in their own logs)" if remote else ""
    else:
        who = "every rank reached it, so a rank probably called a different collective"
    _leave_report(rank, {"waiting": rank, "missing": missing, "alive": alive, "gone": gone, "remote": remote, "timeout": timeout})
    print(
        f"trainwright: rank {rank} waited in a collective (timeout {timeout:g} s) and failed: {who}. The wait is the process-group "
        "timeout: Accelerator(process_group_timeout=...), Trainer(process_group_timeout=...), `trainer launch "
        "--process_group_timeout` or TRAINWRIGHT_PG_TIMEOUT; TRAINWRIGHT_DEBUG_COLLECTIVES=1 checks every collective's arguments",
        file=sys.stderr,
        flush=True,
    )
    time.sleep(4.0 if remote else 0.5)  # let the dumped stacks (a watcher polls every 2 s) reach the logs before this exits


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
