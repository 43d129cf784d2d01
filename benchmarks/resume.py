"""Resume latency: ``load_state`` then the first batch, from a mid-epoch checkpoint early and late in the epoch.

A prepared loader resumes by seeking its batch sampler, so the latency must not grow with the position. A
plain loop that skips by iterating (what a script without resumable loaders does) is shown for contrast.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from benchmarks.common import Section, interleaved


class CountingDataset(Dataset):
    """In-memory rows that count how many samples were read."""

    def __init__(self, rows: torch.Tensor) -> None:
        self.rows = rows
        self.reads = 0

    def __len__(self) -> int:
        return self.rows.shape[0]

    def __getitem__(self, index: int) -> torch.Tensor:
        self.reads += 1
        return self.rows[index]


def _prepared(data: CountingDataset, batch_size: int) -> tuple[Any, Any]:
    from trainer import Accelerator

    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True)
    model = nn.Linear(data.rows.shape[1], 10)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    *_, loader = accelerator.prepare(model, optimizer, DataLoader(data, batch_size=batch_size, shuffle=True))
    return accelerator, loader


def _checkpoint_at(data: CountingDataset, batch_size: int, position: int, folder: Path) -> torch.Tensor:
    """Save a checkpoint after `position` batches; return the batch an uninterrupted run sees next."""
    accelerator, loader = _prepared(data, batch_size)
    batches = iter(loader)
    for _ in range(position):
        next(batches)
    accelerator.save_state(folder)
    return next(batches)


def run(*, quick: bool) -> list[Section]:
    rounds = 4 if quick else 8  # a multiple of the contender count: every position equally
    batch_size, samples = 32, (16384 if quick else 65536)
    positions = {"early": 8, "late": samples // batch_size - 8}
    data = CountingDataset(torch.randn(samples, 32, generator=torch.Generator().manual_seed(0)))
    root = Path(tempfile.mkdtemp(prefix="bench-resume-"))
    try:
        expected = {name: _checkpoint_at(data, batch_size, pos, root / name) for name, pos in positions.items()}
        resumed: dict[str, Any] = {}

        def resume(name: str) -> float:
            times = []
            for _ in range(5):  # the fastest of 5 resumes: one resume is short enough for a busy machine to disturb
                accelerator, loader = _prepared(data, batch_size)
                data.reads = 0
                begin = time.perf_counter()
                accelerator.load_state(root / name)
                batch = next(iter(loader))
                times.append(time.perf_counter() - begin)
                resumed[name] = (batch, data.reads)
            return min(times)

        def skip_by_iterating(name: str) -> float:
            times = []
            for _ in range(5):
                begin = time.perf_counter()
                batches = iter(DataLoader(data, batch_size=batch_size))
                for _ in range(positions[name] + 1):
                    next(batches)
                times.append(time.perf_counter() - begin)
            return min(times)

        rows = interleaved({
            f"load_state + first batch, batch {positions['early']}": lambda: resume("early"),
            f"load_state + first batch, batch {positions['late']}": lambda: resume("late"),
            f"plain loop skipping by iterating, batch {positions['early']}": lambda: skip_by_iterating("early"),
            f"plain loop skipping by iterating, batch {positions['late']}": lambda: skip_by_iterating("late"),
        }, f"load_state + first batch, batch {positions['early']}", rounds, unit="ms", scale=1e3)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    check = ("After resuming, the next batch equals the uninterrupted run's, and no skipped sample was read: only that batch "
             "and the one-batch look-ahead the loader keeps to know where the epoch ends (checked).")
    for name in positions:
        batch, reads = resumed[name]
        if not torch.equal(batch, expected[name]):
            check = f"CHECK FAILED: the batch after resuming at the {name} position differs from the uninterrupted run's."
        elif reads > 2 * batch_size:  # the next batch, and one batch of look-ahead that tells the loader where the epoch ends
            check = f"CHECK FAILED: resuming at the {name} position read {reads} samples; at most {2 * batch_size} should be read."
    late = list(rows.values())[1]
    late.target = "≈ 1.00 (flat)"
    late.met = late.ratio_stats()[1] <= 1.10
    notes = [f"{samples} samples, batch {batch_size}, shuffled; {rounds} interleaved rounds, each the fastest of 5 resumes.", check]
    return [Section("Resume latency from a mid-epoch checkpoint", "resume at the early position", list(rows.values()), notes)]
