"""Gathering tensors whose dtypes differ across ranks raises ValueError on every rank (real 2-process gloo)."""

from __future__ import annotations

import pytest

from tests.helpers.multiprocess import run_distributed

pytestmark = [pytest.mark.distributed]


def _gather_mismatched_dtypes() -> str:
    import torch
    import torch.distributed as dist

    from strategies import collectives

    dist.init_process_group("gloo", init_method="env://")
    rank = dist.get_rank()
    t = torch.ones(3, dtype=torch.float32) if rank == 0 else torch.ones(3, dtype=torch.int64)
    try:
        collectives.gather_tensor(t)
    except ValueError as err:
        return str(err)
    return "no error"


def test_gather_mismatched_dtypes_raises_on_every_rank():
    messages = run_distributed(_gather_mismatched_dtypes, nprocs=2, timeout=120)
    for msg in messages:
        assert "rank 0: torch.float32" in msg and "rank 1: torch.int64" in msg, msg


def _mismatched_collectives():
    import torch
    import torch.distributed as dist

    from trainer import Accelerator

    acc = Accelerator(cpu=True)
    try:
        if acc.process_index == 0:
            dist.all_reduce(torch.ones(3))
        else:
            dist.broadcast(torch.ones(5, dtype=torch.int64), src=0)
    except RuntimeError as err:
        return str(err)
    return "no error"


def test_debug_mode_names_mismatched_collectives() -> None:
    # the rank that detects it raises at once; its peer may then wait out the (here short) process-group timeout
    results = run_distributed(_mismatched_collectives, env={"TRAINWRIGHT_DEBUG_COLLECTIVES": "1", "TRAINWRIGHT_PG_TIMEOUT": "10"}, timeout=120)
    named = [m for m in results if "Detected mismatch between collectives on ranks" in m]
    assert named and all("ALLREDUCE" in m and "BROADCAST" in m for m in named), results
