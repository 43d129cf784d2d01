"""What the multi-process benchmark scripts (``nd_scripts/tp_rounds.py``, ``pipeline_scripts/pp_rounds.py``) share:
the residual block their models are made of, and the timed rounds that alternate which side goes first."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

WIDTH, HIDDEN = 256, 1024


class Block(nn.Module):
    """A residual MLP block: ``x + down(gelu(up(x)))``."""

    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(WIDTH, HIDDEN)
        self.down = nn.Linear(HIDDEN, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(x)))


def alternating_rounds(
    ours: Callable[[Any], Any], raw: Callable[[Any], Any], batches: Sequence[Any], rounds: int, steps: int, device: torch.device,
) -> dict[str, list[float]]:
    """Seconds per step of each side, `steps` steps a round on `batches` in turn; rounds alternate which side goes
    first, and each side's steps are timed between barriers (so every process's time counts)."""
    times: dict[str, list[float]] = {"ours": [], "raw": []}
    for r in range(rounds):
        for name, step in ((("ours", ours), ("raw", raw)) if r % 2 == 0 else (("raw", raw), ("ours", ours))):
            dist.barrier()
            begin = time.perf_counter()
            for i in range(steps):
                step(batches[i % len(batches)])
            if device.type == "cuda":
                torch.cuda.synchronize()
            dist.barrier()
            times[name].append((time.perf_counter() - begin) / steps)
    return times
