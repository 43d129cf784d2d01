"""Run a function in N real processes (gloo on CPU) with a short process-group timeout.

``run_distributed(fn, *args, nprocs=2)`` runs ``fn`` on `nprocs` worker processes and returns each rank's result. By
default calls go to a pool of long-lived workers (one pool per size, per pytest process), which pays for the
processes once; ``TEST_PROCESS_POOL=0`` (or ``fresh=True``) gives a call processes of its own. The workers are forked once from a fork server that
imported torch before any computation (forking the test process itself is unsafe once it has run one: the CPU thread
pools it started do not survive a fork, and a child's next matmul can hang forever), so a call costs no interpreter
start, no ``import torch`` and no re-import of what an earlier call already imported (FSDP, DeepSpeed, transformers).

Each call still starts as a fresh process would, with the state a test can change put back after it (what the
call's fresh-start check in ``tests/distributed/test_pool.py`` proves): the environment is the calling test's (its
HOME, its working directory, the variables ``torchrun`` would set, a new ``MASTER_PORT``), the random generators are
seeded alike, and afterwards the process group the call joined is destroyed, the Accelerator's process-wide state is
reset, and the environment, working directory, signal handlers, warning filters, logging handlers and torch's global
settings (default dtype, grad mode, threads, deterministic algorithms, the distributed debug level) are restored.

A rank that fails ends its process (its peers' collectives then fail at once instead of waiting out the timeout);
the pool is discarded and the next call forks a new one. ``fresh=True`` runs a call in a pool of its own that is
discarded afterwards, for calls that leave a process unusable on purpose (a collective left half done).
"""

from __future__ import annotations

import atexit
import faulthandler
import gc
import logging
import os
import random
import signal
import socket
import sys
import time
import traceback
import warnings
from collections.abc import Callable
from multiprocessing import connection
from typing import Any

import torch.multiprocessing as mp

# What nearly every job imports on first use, beyond `import torch`: torch._dynamo (the first optimizer built imports
# it, 1.7-2.8 s of CPU), DCP and FSDP2 (about 1 s each). Preloaded in the server, a forked process finds them imported
# as a fresh one would after its first optimizer; optional packages are not preloaded (a test may make one missing).
_TORCH_LAZY_IMPORTS = ["torch._dynamo", "torch.distributed.checkpoint", "torch.distributed.fsdp"]
mp.set_forkserver_preload(["torch", "trainer", "strategies", *_TORCH_LAZY_IMPORTS])

_CONTEXT = mp.get_context("forkserver")
_SIGNALS = [s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP)]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def end_process_group() -> None:
    """Destroy this process's default process group if one is left, through DeepSpeed when it made handles of it
    (its destroy lets them go, as `DeepSpeedStrategy.teardown` does)."""
    import torch.distributed as dist

    from strategies.process_group import wait_for_collective_threads

    if dist.is_available() and dist.is_initialized():
        wait_for_collective_threads()  # before anything frees the backend (see strategies.process_group.leave_process_group)
    deepspeed = sys.modules.get("deepspeed")
    if dist.is_available() and dist.is_initialized() and deepspeed is not None and deepspeed.comm.is_initialized():
        deepspeed.comm.destroy_process_group()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


# ----------------------------------------------------------------------------------------------------- the worker
class _FreshStart:
    """What a call may change in a worker process and the worker puts back after it."""

    def __init__(self) -> None:
        import torch
        import torch.distributed as dist

        self.environ = dict(os.environ)
        self.cwd = os.getcwd()
        self.argv, self.path, self.excepthook = list(sys.argv), list(sys.path), sys.excepthook
        self.handlers = {s: signal.getsignal(s) for s in _SIGNALS}
        self.warning_filters = list(warnings.filters)
        self.root_handlers, self.root_level = list(logging.root.handlers), logging.root.level
        self.torch = (torch.get_default_dtype(), torch.is_grad_enabled(), torch.get_num_threads(),
                      torch.are_deterministic_algorithms_enabled(), dist.get_debug_level())

    def begin(self, rank: int, world_size: int, port: int, environ: dict[str, str], cwd: str, env: dict[str, str]) -> None:
        """Set up the process as ``torchrun`` would start rank `rank` from the caller's environment and directory."""
        import torch

        os.environ.clear()
        os.environ.update(environ)
        os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
                           "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                           "TRAINWRIGHT_PG_TIMEOUT": "60", **env})
        if world_size > 1 and "OMP_NUM_THREADS" not in os.environ:
            os.environ["OMP_NUM_THREADS"] = "1"  # torchrun's default for several processes on one machine
        if "OMP_NUM_THREADS" in os.environ:  # (read by a new process's torch at start; this one imported torch already)
            torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        os.chdir(cwd)
        random.seed(0)
        torch.manual_seed(0)
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed(0)

    def end(self) -> None:
        """Tear down what the call joined and put back what it changed."""
        import torch
        import torch.distributed as dist

        from trainer.state import AcceleratorState

        faulthandler.cancel_dump_traceback_later()
        end_process_group()
        AcceleratorState._reset_state(reset_partial_state=True)  # Accelerate's reset of the process's layout
        atexit._clear()  # a worker never exits normally: the call's exit handlers would only keep its objects alive
        os.environ.clear()
        os.environ.update(self.environ)
        os.chdir(self.cwd)
        sys.argv[:], sys.path[:], sys.excepthook = self.argv, self.path, self.excepthook
        for number, handler in self.handlers.items():
            if signal.getsignal(number) is not handler and handler is not None:
                signal.signal(number, handler)
        warnings.filters[:] = self.warning_filters
        warnings._filters_mutated()  # type: ignore[attr-defined]
        logging.root.handlers[:] = self.root_handlers
        logging.root.setLevel(self.root_level)
        dtype, grad, threads, deterministic, debug = self.torch
        torch.set_default_dtype(dtype)
        torch.set_grad_enabled(grad)
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(deterministic)
        dist.set_debug_level(debug)
        gc.collect()


def _serve(rank: int, world_size: int, conn: Any) -> None:
    """A worker: run each call sent over `conn` as rank `rank` and send back its result; exit after a failed call."""
    fresh = _FreshStart()
    while True:
        try:
            call = conn.recv()
        except EOFError:  # the test process ended
            return
        if call is None:
            return
        fn, args, env, port, timeout, environ, cwd = call
        faulthandler.dump_traceback_later(max(timeout - 5, 1), exit=False)  # a hung rank shows where it hangs
        try:
            fresh.begin(rank, world_size, port, environ, cwd, env)
            result: tuple[str, Any] = ("ok", fn(*args))
        except BaseException as err:  # report, then end this process
            result = ("error", f"{type(err).__name__}: {err}\n{traceback.format_exc()}")
        try:
            fresh.end()
        except BaseException as err:
            result = ("error", f"the worker could not be reset after the call: {type(err).__name__}: {err}\n{traceback.format_exc()}")
        try:
            conn.send(result)
        except Exception as err:  # an unpicklable result
            conn.send(("error", f"rank {rank}'s result could not be sent back: {type(err).__name__}: {err}"))
            os._exit(1)
        if result[0] == "error":
            os._exit(1)


# ------------------------------------------------------------------------------------------------------- the pool
class _Pool:
    """`nprocs` worker processes, forked from the fork server, that run one call at a time together."""

    def __init__(self, nprocs: int) -> None:
        self.processes: list[Any] = []
        self.connections: list[Any] = []
        for rank in range(nprocs):
            ours, theirs = _CONTEXT.Pipe()
            # not a daemon: a call may start processes of its own (DataLoader workers)
            process = _CONTEXT.Process(target=_serve, args=(rank, nprocs, theirs), name=f"distributed-rank{rank}")
            process.start()
            theirs.close()
            self.processes.append(process)
            self.connections.append(ours)

    def run(self, fn: Callable[..., Any], args: tuple[Any, ...], env: dict[str, str], timeout: float) -> list[tuple[str, Any]]:
        """Run one call on every rank; each rank's ``(status, value)``, an ``("error", why)`` for a rank that died."""
        call = (fn, args, env, free_port(), timeout, dict(os.environ), os.getcwd())
        for conn in self.connections:
            conn.send(call)
        results: dict[int, tuple[str, Any]] = {}
        deadline = time.monotonic() + timeout
        while len(results) < len(self.connections):
            waiting = {conn: rank for rank, conn in enumerate(self.connections) if rank not in results}
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(waiting.values())
                raise AssertionError(f"distributed run did not finish within {timeout} s (ranks {missing} still running)")
            for conn in connection.wait(list(waiting), timeout=min(left, 1.0)):
                rank = waiting[conn]
                try:
                    results[rank] = conn.recv()
                except (EOFError, OSError):
                    self.processes[rank].join(5)
                    results[rank] = ("error", f"rank {rank} exited with code {self.processes[rank].exitcode} before it reported")
                if results[rank][0] == "error":  # its peers fail at once now, or are stopped after a short wait
                    deadline = min(deadline, time.monotonic() + 10)
        return [results[rank] for rank in range(len(self.connections))]

    def close(self) -> None:
        for conn in self.connections:
            try:
                conn.send(None)
            except OSError:
                pass
        for process in self.processes:
            process.join(2)
            if process.is_alive():
                process.kill()
                process.join(5)


_POOLS: dict[int, _Pool] = {}


@atexit.register
def _close_pools() -> None:
    """Let the workers end with the test process (before multiprocessing waits for its children)."""
    while _POOLS:
        _POOLS.popitem()[1].close()


def run_distributed(fn: Callable[..., Any], *args: Any, nprocs: int = 2, env: dict[str, str] | None = None, timeout: float = 240,
                    fresh: bool | None = None) -> list[Any]:
    """Run ``fn(*args)`` on `nprocs` ranks; return each rank's result, or raise with the failing ranks' tracebacks.

    ``fresh=True`` runs the call in processes of its own, discarded afterwards; ``fresh=False`` in the pool's
    processes, reused by the next call of the same size. The default is the pool; ``TEST_PROCESS_POOL=0`` gives every
    call processes of its own (to tell whether a failure comes from the reuse).
    """
    if fresh is None:
        fresh = os.environ.get("TEST_PROCESS_POOL", "1") == "0"
    pool = _Pool(nprocs) if fresh else _POOLS.pop(nprocs, None) or _Pool(nprocs)
    healthy = False
    try:
        outcomes = pool.run(fn, args, env or {}, timeout)
        errors = [f"rank {rank} failed:\n{value}" for rank, (status, value) in enumerate(outcomes) if status != "ok"]
        healthy = not errors and not fresh
        if errors:
            raise AssertionError("distributed run failed:\n" + "\n".join(errors))
        return [value for _, value in outcomes]
    finally:
        if healthy:
            _POOLS[nprocs] = pool
        else:
            pool.close()
