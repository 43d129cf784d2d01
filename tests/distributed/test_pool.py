"""The pool behind ``run_distributed``: its worker processes are reused, and each call starts as a fresh process would.

A call that changes the process's state (environment, directory, torch's settings, signal handlers, warning
filters, logging, the process group and the Accelerator's layout) leaves nothing behind for the next test's call.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.multiprocess import run_distributed

pytestmark = pytest.mark.distributed


def _change_everything(marker: str) -> int:
    import logging
    import sys
    import warnings

    import torch

    from trainer import Accelerator

    accelerator = Accelerator(cpu=True)  # joins the process group and sets the process's layout
    accelerator.wait_for_everyone()
    os.environ["LEFT_BEHIND"] = marker
    os.chdir("/")
    sys.path.append("/left/behind")
    torch.set_default_dtype(torch.float64)
    torch.set_grad_enabled(False)
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    signal.signal(signal.SIGUSR1, lambda *_: None)
    warnings.simplefilter("error")
    logging.root.addHandler(logging.NullHandler())
    torch.rand(5)  # the generators move on
    return os.getpid()


def _observe() -> dict[str, Any]:
    import logging
    import sys
    import warnings

    import torch
    import torch.distributed as dist

    import trainer.state

    return {"pid": os.getpid(), "left_behind": os.environ.get("LEFT_BEHIND"), "cwd": os.getcwd(), "home": os.environ["HOME"],
            "rank": os.environ["RANK"], "path": "/left/behind" in sys.path, "dtype": str(torch.get_default_dtype()),
            "grad": torch.is_grad_enabled(), "deterministic": torch.are_deterministic_algorithms_enabled(),
            "sigusr1": signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL,
            "errors": any(f[0] == "error" and f[2] is Warning for f in warnings.filters),
            "null_handlers": sum(isinstance(h, logging.NullHandler) for h in logging.root.handlers),
            "group": dist.is_initialized(), "layout": trainer.state.is_initialized(), "draw": torch.rand(2).tolist()}


def _fail_on_rank_one() -> int:
    if os.environ["RANK"] == "1":
        raise RuntimeError("rank 1 fails on purpose")
    return os.getpid()


def test_a_call_leaves_nothing_for_the_next(tmp_path: Path) -> None:
    before = run_distributed(_observe, fresh=False)
    pids = run_distributed(_change_everything, "x", fresh=False)
    after = run_distributed(_observe, fresh=False)
    assert [o["pid"] for o in after] == pids == [o["pid"] for o in before]  # the same processes served all three
    for rank, (first, second) in enumerate(zip(before, after, strict=True)):
        assert second == first, rank  # the second fresh start looks exactly like the first
        assert second["left_behind"] is None and second["cwd"] == str(Path.cwd()) and second["home"] == os.environ["HOME"]
        assert (second["rank"], second["dtype"], second["grad"], second["group"], second["layout"]) == (str(rank), "torch.float32", True, False, False)


def test_a_failed_call_reports_its_rank_and_the_pool_starts_anew() -> None:
    pids = [o["pid"] for o in run_distributed(_observe, fresh=False)]
    with pytest.raises(AssertionError, match="rank 1 failed:\nRuntimeError: rank 1 fails on purpose"):
        run_distributed(_fail_on_rank_one, fresh=False)
    again = [o["pid"] for o in run_distributed(_observe, fresh=False)]
    assert set(again).isdisjoint(pids)  # the failed call's processes were discarded


_SCRIPT = """
import os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
total = torch.tensor([int(os.environ["RANK"]) + 1])
dist.all_reduce(total)
print(f"rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']} on port {os.environ['MASTER_PORT']}: {int(total)}")
if sys.argv[1:] == ["fail"]:
    if dist.get_rank() == 1:
        sys.exit(3)
    time.sleep(60)  # (stopped when rank 1 fails, as torchrun's agent stops the others)
dist.destroy_process_group()
"""


def test_a_script_on_several_forked_processes_runs_as_under_torchrun(tmp_path: Path) -> None:
    import sys
    import time

    from tests.helpers.scripts import run_python

    (tmp_path / "job.py").write_text(_SCRIPT)
    done = run_python([sys.executable, "job.py"], cwd=tmp_path, nprocs=2, timeout=60)
    assert done.returncode == 0, done.stderr
    lines = sorted(done.stdout.splitlines())
    assert [line.split(" on port")[0] for line in lines] == ["rank 0 of 2", "rank 1 of 2"] and all(line.endswith(": 3") for line in lines)
    start = time.monotonic()
    failed = run_python([sys.executable, "job.py", "fail"], cwd=tmp_path, nprocs=2, timeout=60)
    assert failed.returncode == 3 and time.monotonic() - start < 30, (failed.returncode, failed.stderr)
