"""Data loading: the prepared loader against the plain `DataLoader` it was built from (in-memory tensors)."""

from __future__ import annotations

import time

import torch
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.common import Row, Section, interleaved


def _epoch_time(loader: DataLoader) -> float:
    """Seconds per batch over one whole epoch (the batches are touched, as a training step would)."""
    begin = time.perf_counter()
    count = 0
    for x, y in loader:
        count += x.shape[0] > 0 and y.shape[0] > 0
    return (time.perf_counter() - begin) / max(count, 1)


def _check_same_batches(plain: DataLoader, prepared: DataLoader) -> str:
    pairs = list(zip(plain, prepared))
    if len(pairs) != len(plain) or len(plain) != len(prepared):
        return f"CHECK FAILED: the prepared loader has {len(prepared)} batches, the plain DataLoader {len(plain)}."
    for i, (a, b) in enumerate(pairs):
        if not all(torch.equal(p, q) for p, q in zip(a, b)):
            return f"CHECK FAILED: the prepared loader's batch {i} differs from the plain DataLoader's."
    return "Unshuffled, the prepared loader yields the plain DataLoader's batches exactly (checked)."


def run(*, quick: bool) -> list[Section]:
    from trainer import Accelerator

    rounds = 4 if quick else 10  # even: both contenders take each position equally
    samples = 8192 if quick else 32768
    gen = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(samples, 32, generator=gen), torch.randint(0, 10, (samples,), generator=gen))
    sections = []
    for batch_size in (32, 256):
        rows: list[Row] = []
        check = ""
        for shuffle in (False, True):
            plain = DataLoader(data, batch_size=batch_size, shuffle=shuffle)
            prepared = Accelerator().prepare(DataLoader(data, batch_size=batch_size, shuffle=shuffle))
            if not shuffle:
                check = _check_same_batches(plain, prepared)
            suffix = ", shuffle=True" if shuffle else ""
            measured = interleaved(
                {f"plain DataLoader{suffix}": lambda p=plain: _epoch_time(p), f"prepared loader{suffix}": lambda p=prepared: _epoch_time(p)},
                f"plain DataLoader{suffix}", rounds, unit="µs/batch", scale=1e6,
            )
            rows.extend(measured.values())
        rows[1].target = "≤ 1.00"
        notes = [
            (f"TensorDataset of {samples} samples × 32 features; {rounds} interleaved rounds of one epoch each; "
            "each ratio is to the plain DataLoader with the same `shuffle`."),
            check,
        ]
        sections.append(Section(f"Data loading — batch {batch_size}", "plain DataLoader", rows, notes))
    return sections
