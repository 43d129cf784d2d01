"""Run a function in N real processes (gloo on CPU) with a short process-group timeout.

The processes are forked from a fork server (started once, with torch imported, before any computation) and
see the same environment variables torchrun would set, so `Accelerator`/`Trainer` inside detect a distributed
run on their own. Forking the test process itself is unsafe once it has run a computation: the CPU thread
pools it started do not survive a fork, and a child's next matmul can hang forever.
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import socket
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.multiprocessing as mp

mp.set_forkserver_preload(["torch", "trainer", "strategies"])


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(
    rank: int, fn: Callable[..., Any], world_size: int, port: int, out_dir: str, env: dict[str, str], args: tuple[Any, ...], timeout: float
) -> None:
    faulthandler.dump_traceback_later(max(timeout - 5, 1), exit=False)  # a hung rank shows where it hangs
    os.environ.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "TRAINWRIGHT_PG_TIMEOUT": "60",
            **env,
        }
    )
    try:
        result: Any = ("ok", fn(*args))
    except BaseException as err:  # report, then fail the process
        result = ("error", f"{type(err).__name__}: {err}\n{traceback.format_exc()}")
    Path(out_dir, f"rank{rank}.pkl").write_bytes(pickle.dumps(result))
    try:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        pass
    if result[0] == "error":
        os._exit(1)


def run_distributed(fn: Callable[..., Any], *args: Any, nprocs: int = 2, env: dict[str, str] | None = None, timeout: float = 240) -> list[Any]:
    """Run ``fn(*args)`` on `nprocs` ranks; return each rank's result, or raise with the failing rank's traceback."""
    with tempfile.TemporaryDirectory() as out_dir:
        ctx = mp.start_processes(
            _worker, args=(fn, nprocs, free_port(), out_dir, env or {}, args, timeout), nprocs=nprocs, join=False, start_method="forkserver"
        )
        deadline = time.monotonic() + timeout
        try:
            while not ctx.join(timeout=1):
                if time.monotonic() > deadline:
                    raise AssertionError(f"distributed run did not finish within {timeout} s")
        except mp.ProcessExitedException as err:
            details = [Path(out_dir, f"rank{r}.pkl") for r in range(nprocs)]
            msgs = [pickle.loads(p.read_bytes())[1] for p in details if p.exists() and pickle.loads(p.read_bytes())[0] == "error"]
            raise AssertionError(f"distributed run failed: {err}\n" + "\n".join(msgs)) from None
        except mp.ProcessRaisedException as err:
            raise AssertionError(f"distributed run failed: {err}") from None
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
        results = []
        for rank in range(nprocs):
            status, value = pickle.loads(Path(out_dir, f"rank{rank}.pkl").read_bytes())
            if status != "ok":
                raise AssertionError(f"rank {rank} failed:\n{value}")
            results.append(value)
        return results
