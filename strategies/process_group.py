"""The process group every multi-process strategy (DDP, FSDP) joins, as two plain functions."""

from __future__ import annotations

import atexit
import contextlib
import datetime
import faulthandler
import functools
import json
import os
import re
import signal
import socket
import sys
import threading
import time
import types
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist

from strategies.environment import ClusterEnvironment


def give_timeout(groups: Iterable[Any], timeout: float) -> None:
    """Give each of `groups` the run's process-group timeout of `timeout` seconds.

    Torch makes every group after the default one (a `DeviceMesh`'s dimensions, a second gloo group) with its
    backend's default timeout, 30 minutes for gloo and 10 for NCCL, whatever the default group's: a rank hung before
    a collective on such a group would hold the others that long instead of the run's timeout.
    """
    world = dist.group.WORLD
    for group in groups:
        if group is not world:
            dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=timeout), group)


def groups_now() -> set[Any]:
    """The process groups this process has made so far (to find the ones a library makes: `give_timeout` them)."""
    return set(dist.distributed_c10d._world.pg_names)


def join_process_group(cluster: ClusterEnvironment, device: torch.device, backend: str, timeout: float, teardown: Callable[[], None]) -> bool:
    """Select `device` and join (or create) the default process group; return True when this call created it.

    `teardown` is registered to run at interpreter exit (a script need not call ``end_training()``), and after
    it `wait_for_collective_threads` (see there: why a process that printed its results could still abort).

    A group that exists already is joined as it is, except one Ray Train made before the worker function ran: it gets
    the run's `timeout` (Ray's is 30 minutes) and the hung-rank report, as a group made here would.
    """
    die_with_launcher()
    _register_exit_wait()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if dist.is_initialized():
        if dist.get_world_size() != cluster.world_size:
            raise RuntimeError(
                f"a process group of size {dist.get_world_size()} already exists but the environment says "
                f"{cluster.world_size} processes; destroy it or fix WORLD_SIZE"
            )
        if cluster.source == "ray":  # Ray Train made it (TorchConfig.timeout_s, 30 minutes by default): the run's rules
            dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=timeout), None)
            report_hung_ranks(cluster.rank, cluster.world_size, timeout, several_machines=cluster.several_machines)
        return False
    if debug_collectives():
        # torch checks every collective's op, shapes and dtypes against the other ranks' before running it, and
        # names both sides on a mismatch (ProcessGroupWrapper); costs a small extra collective per call
        os.environ["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
        dist.set_debug_level(dist.DebugLevel.DETAIL)  # torch reads the variable once, maybe before this process set it
    os.environ.setdefault("MASTER_ADDR", cluster.master_addr)
    os.environ.setdefault("MASTER_PORT", str(cluster.master_port))
    store = attempt_store(timeout)
    dist.init_process_group(
        backend=backend,
        init_method=None if store is not None else "env://",
        store=store,
        world_size=cluster.world_size,
        rank=cluster.rank,
        timeout=datetime.timedelta(seconds=timeout),
    )
    atexit.register(teardown)
    report_hung_ranks(cluster.rank, cluster.world_size, timeout, several_machines=cluster.several_machines)
    return True


# The variable `trainer launch` gives workers: a token all of one rendezvous round's agents agreed on (trainer.cli.rounds).
ATTEMPT_VARIABLE = "TRAINWRIGHT_ATTEMPT"


def attempt_id() -> str | None:
    """Which attempt of an elastic job this worker belongs to, the same on every worker of it: the token `trainer
    launch` agreed on for the rendezvous round, else torchrun's restart count; None outside torchrun."""
    return os.environ.get(ATTEMPT_VARIABLE) or os.environ.get("TORCHELASTIC_RESTART_COUNT")


def attempt_store(timeout: float) -> Any:
    """Under torchrun with its agent's store shared with the workers: that store, under a prefix of this attempt's own.

    torchrun's c10d rendezvous keeps one store server for the whole job (``TORCHELASTIC_USE_AGENT_STORE``), and torch
    builds the default group in it under the same keys on every attempt. A worker the agent restarted then reads the
    addresses the dead attempt's workers left there: gloo's ``connectFullMesh`` connects to a port nobody listens on
    ("Connection refused") or, worse, to the wrong peer and waits (a hang). A plain ``init_process_group("gloo")`` under
    ``torchrun --standalone --nproc_per_node 2 --max-restarts 1`` whose rank 1 died once recovered 2 times in 12 here;
    on a store under a prefix of the attempt's own, 8 in 8. Every group made later (a device mesh's, the background
    saves' gloo group) lives under the default group's store, so under the prefix too. None (torch's own ``env://``)
    anywhere else: without the agent's store, rank 0 serves a new store on every attempt.
    """
    attempt = attempt_id()
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or attempt is None:
        return None
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), int(os.environ["WORLD_SIZE"]), is_master=False,
        timeout=datetime.timedelta(seconds=timeout),
    )  # fmt: skip
    return dist.PrefixStore(f"trainwright/attempt/{attempt}", store)


# torch's gloo worker threads (``ProcessGroupGloo::runLoop``); /proc shows a thread's name (15 characters at most).
_GLOO_WORKER = "pt_gloo_runloop"
_exit_wait_registered = False


def _register_exit_wait() -> None:
    """Register `wait_for_collective_threads` at exit, once, before any strategy's teardown: exit functions run in
    reverse order, so it runs after the process group is destroyed."""
    global _exit_wait_registered
    if not _exit_wait_registered:
        _exit_wait_registered = True
        atexit.register(wait_for_collective_threads)


def wait_for_collective_threads(timeout: float = 10.0) -> bool:
    """At interpreter exit: wait, without the GIL, until no gloo worker thread of this process is still working on a
    collective; return False if one still was after `timeout` seconds.

    Why: a gloo backend outlives ``destroy_process_group()`` when something else keeps a reference to it (a
    ``DistributedDataParallel`` model does, even after it is deleted; so do DeepSpeed's and a device mesh's groups), and
    its two worker threads with it. A worker lets go of a finished collective's tensors a moment after the caller saw it
    complete; releasing a tensor that has a Python object takes the GIL. When the script ends right after its last
    collective (``validate``/``test``/``predict``-only scripts: the metric all-gather), the interpreter may already be
    finalizing by then: CPython ends the thread that asks for the GIL (``pthread_exit``), the unwinding crosses gloo's
    ``noexcept`` work destructor, and the process aborts after printing correct results ("terminate called without an
    active exception", SIGABRT; seen in 1 run of 15 on a loaded machine). Exit functions run while the interpreter is
    intact, so a worker that needs the GIL gets it while this one sleeps.

    A worker blocked waiting (in its queue, or in a collective another rank never joins) counts as done. Reads
    ``/proc``; elsewhere it waits 0.1 s.
    """
    deadline, calm = time.monotonic() + timeout, 0
    while calm < 3:  # three looks 5 ms apart with every worker blocked
        time.sleep(0.005)  # sleeping releases the GIL
        busy = _busy_gloo_workers()
        if busy is None:
            time.sleep(0.1)
            return True
        calm = 0 if busy else calm + 1
        if time.monotonic() > deadline:
            return False
    return True


def _busy_gloo_workers() -> int | None:
    """How many gloo worker threads of this process are running or waiting to run (None without ``/proc``)."""
    folder = f"/proc/{os.getpid()}/task"
    try:
        threads = os.listdir(folder)
    except OSError:
        return None
    busy = 0
    for tid in threads:
        try:
            with open(f"{folder}/{tid}/stat", encoding="ascii", errors="replace") as fh:
                stat = fh.read()
        except OSError:  # the thread ended
            continue
        name, state = stat[stat.find("(") + 1 : stat.rfind(")")], stat[stat.rfind(")") + 2 : stat.rfind(")") + 3]
        busy += name == _GLOO_WORKER and state not in ("S", "Z", "X")  # not blocked: working, or runnable but not scheduled
    return busy


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
        if threading.current_thread() is threading.main_thread():
            # ignored first: faulthandler gives the signal its previous disposition back when the interpreter
            # finalizes, and a real-time signal's default is to terminate: a rank asked for its stack while it exits
            # (its work done) would die of it, and the launcher would stop the others and report a signal death
            signal.signal(_STACK_SIGNAL, signal.SIG_IGN)
        faulthandler.register(_STACK_SIGNAL, all_threads=True, chain=False)
    store.set(_KEY.format(kind="pid", rank=rank), f"{_machine()} {os.getpid()}")
    if several_machines:
        threading.Thread(target=_print_stack_when_asked, args=(store, rank), name="trainwright-stack-watch", daemon=True).start()
    previous = sys.excepthook
    global _reporter
    _reporter = functools.partial(_report_timeout, store, rank, world_size, timeout)

    def hook(kind: type[BaseException], error: BaseException, tb: Any) -> None:
        if _is_timeout(error):
            try:
                report_collective_failure(error)
                tb = _shortened(error, tb)  # the report says what happened; gloo's text follows, shortened
            except Exception:  # the report must never hide the error itself
                pass
        previous(kind, error, tb)

    sys.excepthook = hook


_reporter: Callable[..., None] | None = None  # this process's report (`report_hung_ranks`), for the group joined last


def report_collective_failure(error: BaseException) -> bool:
    """Report `error` if it is a collective's timeout (or a peer leaving): name the ranks that never reached it, as
    the process's exception hook does for an error that ends the interpreter. Once per error; True if it reported.

    Where the error never reaches the interpreter's top (Ray Train runs the worker function in a thread and catches
    what it raises), the Trainer calls this from its failure path; a hand-written loop calls it, or runs inside
    `collective_failures_reported`.
    """
    if _reporter is None or not _is_timeout(error) or getattr(error, "_trainwright_reported", False):
        return False
    error._trainwright_reported = True  # type: ignore[attr-defined]
    try:
        _reporter(timed_out="Timed out" in str(error))
    except Exception:  # the report must never hide the error itself (its process group may be gone)
        return False
    return True


@contextlib.contextmanager
def collective_failures_reported() -> Any:
    """``with collective_failures_reported(): <training loop>``: a collective's timeout raised inside is reported
    (`report_collective_failure`) before it propagates."""
    try:
        yield
    except RuntimeError as error:
        report_collective_failure(error)
        raise


def _shortened(error: BaseException, tb: Any) -> Any:
    """`error` with gloo's message cut to its substance ("Read error [127.0.0.1]:6560: Connection reset by peer",
    without the source path and the advice that follows) and its traceback without torch's own frames."""
    text = re.sub(r"^\[[^\]]*\.(?:cc|cpp|h):\d+\] ", "", str(error)).split(". This is typically caused", 1)[0]
    error.args = (f"gloo: {text} (what it means: the trainwright line above)",)
    frames = []
    while tb is not None:
        if not tb.tb_frame.f_code.co_filename.startswith(_TORCH_DIR):
            frames.append(tb)
        tb = tb.tb_next
    short = None
    for frame in reversed(frames):
        short = types.TracebackType(short, frame.tb_frame, frame.tb_lasti, frame.tb_lineno)
    error.__traceback__ = short  # what the default hook prints (it ignores its argument when the error has one)
    return short


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


def _machine() -> str:
    """This process's machine: the host name, and the launcher's node rank (torchrun's GROUP_RANK, Ray's NODE_RANK;
    simulated machines share a host)."""
    return f"{socket.gethostname()}/{os.environ.get('GROUP_RANK') or os.environ.get('NODE_RANK', '0')}"


def _print_stack_when_asked(store: Any, rank: int) -> None:
    key = _KEY.format(kind="dump", rank=rank)
    while True:
        time.sleep(2.0)
        if not dist.is_initialized():  # the group was destroyed: let its store go (a later run in this process has its own)
            return
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


def _exited(pid: int) -> bool:
    """Whether process `pid` (on this machine) has ended: gone, or a zombie its parent has not reaped yet (which a
    signal still reaches, so `os.kill` alone would call it alive)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True
    except (OSError, IndexError):  # no /proc (not Linux): the signal sent next tells
        return False


def _exits_within(pid: int, seconds: float) -> bool:
    """Whether process `pid` ends within `seconds` (polled every 50 ms)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if _exited(pid):
            return True
        time.sleep(0.05)
    return False


def _report_timeout(store: Any, rank: int, world_size: int, timeout: float, *, timed_out: bool = True) -> None:
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
            # a peer that closed its connection is leaving: give its exit a moment (under load it takes seconds)
            if _exited(int(pid)) or (not timed_out and _exits_within(int(pid), 10.0)):
                raise ProcessLookupError(pid)
            os.kill(int(pid), _STACK_SIGNAL)
            alive.append(r)
        except ProcessLookupError:
            gone.append(r)
    if missing:
        who = f"rank(s) {missing} never reached it"
        who += f"; still running: {alive} (their Python stacks are printed too, by faulthandler)" if alive else ""
        who += f"; already exited: {gone} (it died, or ended without calling it: a collective called on some ranks only?)" if gone else ""
        who += f"; on other machines: {remote} (asked to print their Python stacks in their own logs)" if remote else ""
    else:
        who = "every rank reached it, so a rank probably called a different collective"
    report = {"waiting": rank, "missing": missing, "alive": alive, "gone": gone, "remote": remote, "timeout": timeout, "timed_out": timed_out}
    _leave_report(rank, report)
    if timed_out:
        head = (f"rank {rank} waited in a collective (timeout {timeout:g} s) and failed: {who}. The wait is the process-group "
                "timeout: Accelerator(process_group_timeout=...), Trainer(process_group_timeout=...), `trainer launch "
                "--process_group_timeout` or TRAINWRIGHT_PG_TIMEOUT")
    else:  # gloo's "Connection closed/reset by peer": a rank left, there was no wait
        head = f"rank {rank} failed at once in a collective because another rank left the process group: {who}"
    print(f"trainwright: {head}; TRAINWRIGHT_DEBUG_COLLECTIVES=1 checks every collective's arguments", file=sys.stderr, flush=True)
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
    """Destroy the default process group if `owned` (this strategy created it) and it still exists.

    First it lets gloo's worker threads finish with the last collective's work (`wait_for_collective_threads`): a
    model wrapper freed later in this process (a second run, a notebook, a sweep) frees the backend with it, whose
    destructor joins those threads while holding the GIL; a worker still waiting for the GIL to release its finished
    work's Python state then never gets it, and the process hangs (torch's ``~ProcessGroupGloo`` under
    ``Reducer`` deallocation; a raw DDP run freed right after its last step, repeated in one process, hung so on its third run here).
    """
    if owned and dist.is_initialized():
        wait_for_collective_threads()
        dist.destroy_process_group()
