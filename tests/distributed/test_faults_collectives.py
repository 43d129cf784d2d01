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
