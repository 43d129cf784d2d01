"""Trace what every process of a prepared loader sees, to compare our data order and RNG use with Accelerate's.

For each case below, ``trace(framework, case)`` builds an Accelerator (``framework`` is the package imported:
``"accelerate"`` or ``"trainer"``, nothing else differs), seeds with ``set_seed(42)``, builds the case's
``DataLoader``, prepares it and runs two epochs. It records the sample ids of every batch and a hash of
``torch.get_rng_state()`` after it, then draws from the global RNG as dropout would (so a loader that draws at
another moment shows). ``tests/fixtures/accelerate_data_order.json`` holds Accelerate 1.15's traces, written by::

    /path/to/venv-with-accelerate/bin/python tests/helpers/data_order_trace.py --framework accelerate \\
        --out tests/fixtures/accelerate_data_order.json

(one and two processes; two are gloo processes on CPU started here). ``--framework trainer`` traces ours.
This module imports neither framework at import time.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import socket
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    IterableDataset,
    RandomSampler,
    Sampler,
    SubsetRandomSampler,
    WeightedRandomSampler,
)

N = 22  # samples: neither a multiple of 3, 4 nor 6, so every tail rule shows
EPOCHS = 2


class Ids(Dataset):
    """Sample ``i`` is ``tensor(i)``."""

    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor(i)


class Augmented(Ids):
    """Draws from the global RNG in ``__getitem__``, like a random augmentation."""

    def __getitem__(self, i: int) -> torch.Tensor:
        torch.rand(1)
        return torch.tensor(i)


class Stream(IterableDataset):
    """``0 .. n-1`` as a stream."""

    def __init__(self, n: int = N) -> None:
        self.n = n

    def __iter__(self) -> Iterator[torch.Tensor]:
        return (torch.tensor(i) for i in range(self.n))


class GlobalPermutation(Sampler[int]):
    """A user sampler without a ``generator`` attribute that draws its order from the global RNG."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[int]:
        return iter(torch.randperm(self.n).tolist())

    def __len__(self) -> int:
        return self.n


class Buckets(Sampler[list[int]]):
    """A custom batch sampler (no ``batch_size``): batches of 2, 3, 4, 2, ... over a random order."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[list[int]]:
        order = torch.randperm(self.n).tolist()
        sizes, i = [2, 3, 4], 0
        while order:
            yield order[: sizes[i % 3]]
            order = order[sizes[i % 3]:]
            i += 1

    def __len__(self) -> int:
        return 8


def _loader(case: str) -> tuple[DataLoader, dict[str, Any], Callable[[], Any] | None]:
    """The case's loader, the DataLoaderConfiguration arguments, and what runs right after `prepare`."""
    config: dict[str, Any] = {}
    if case in ("shuffle", "device_specific", "rng_torch", "skip_first", "break_first", "zip"):
        return DataLoader(Ids(), batch_size=3, shuffle=True), config, None
    if case == "workers":
        return DataLoader(Ids(), batch_size=3, shuffle=True, num_workers=2), config, None
    if case == "seedable_device_specific":
        return DataLoader(Ids(), batch_size=3, shuffle=True), {"use_seedable_sampler": True}, None
    if case == "sequential":
        return DataLoader(Ids(), batch_size=3), config, None
    if case == "generator":
        return DataLoader(Ids(), batch_size=3, shuffle=True, generator=torch.Generator().manual_seed(7)), config, None
    if case == "generator_reseeded":  # Accelerate's test_script.training_check: the generator is reseeded after prepare
        gen = torch.Generator().manual_seed(7)
        return DataLoader(Ids(), batch_size=3, shuffle=True, generator=gen), config, lambda: gen.manual_seed(42)
    if case == "sampler_generator":
        sampler = RandomSampler(Ids(), generator=torch.Generator().manual_seed(9))
        return DataLoader(Ids(), batch_size=3, sampler=sampler), config, None
    if case == "sampler_replacement":
        return DataLoader(Ids(), batch_size=3, sampler=RandomSampler(Ids(), replacement=True, num_samples=40)), config, None
    if case == "sampler_subset":
        return DataLoader(Ids(), batch_size=3, sampler=SubsetRandomSampler(list(range(2, 20)))), config, None
    if case == "sampler_weighted":
        weights = torch.linspace(0.1, 1.0, N).tolist()
        return DataLoader(Ids(), batch_size=3, sampler=WeightedRandomSampler(weights, 25)), config, None
    if case == "sampler_global":
        return DataLoader(Ids(), batch_size=3, sampler=GlobalPermutation(N)), config, None
    if case == "batch_sampler_as_sampler":
        batches = BatchSampler(RandomSampler(Ids()), batch_size=3, drop_last=False)
        return DataLoader(Ids(), batch_size=None, sampler=batches), config, None
    if case == "custom_batch_sampler":
        return DataLoader(Ids(), batch_sampler=Buckets(N)), {"even_batches": False}, None
    if case == "seedable":
        return DataLoader(Ids(), batch_size=3, shuffle=True), {"use_seedable_sampler": True}, None
    if case == "seedable_data_seed":
        return DataLoader(Ids(), batch_size=3, shuffle=True), {"use_seedable_sampler": True, "data_seed": 123}, None
    if case == "seedable_generator":
        gen = torch.Generator().manual_seed(7)
        return DataLoader(Ids(), batch_size=3, shuffle=True, generator=gen), {"use_seedable_sampler": True}, None
    if case == "data_seed_alone":  # data_seed without use_seedable_sampler
        return DataLoader(Ids(), batch_size=3, shuffle=True), {"data_seed": 123}, None
    if case == "split_batches":
        return DataLoader(Ids(), batch_size=4, shuffle=True), {"split_batches": True}, None
    if case == "uneven":
        return DataLoader(Ids(), batch_size=3, shuffle=True), {"even_batches": False}, None
    if case in ("drop_last", "break_before_last"):
        return DataLoader(Ids(), batch_size=3, shuffle=True, drop_last=True), config, None
    if case == "augmented":
        return DataLoader(Augmented(), batch_size=3, shuffle=True), config, None
    if case == "iterable":
        return DataLoader(Stream(), batch_size=3), config, None
    if case == "iterable_no_dispatch":
        return DataLoader(Stream(), batch_size=3), {"dispatch_batches": False}, None
    if case == "iterable_split":
        return DataLoader(Stream(), batch_size=4), {"split_batches": True}, None
    if case == "iterable_drop_last":
        return DataLoader(Stream(), batch_size=3, drop_last=True), config, None
    raise ValueError(f"unknown case {case!r}")


CASES = (
    "shuffle", "sequential", "generator", "generator_reseeded", "sampler_generator", "sampler_replacement",
    "sampler_subset", "sampler_weighted", "sampler_global", "batch_sampler_as_sampler", "custom_batch_sampler",
    "seedable", "seedable_data_seed", "seedable_generator", "data_seed_alone", "split_batches", "uneven", "drop_last",
    "augmented", "iterable", "iterable_no_dispatch", "iterable_split", "iterable_drop_last", "workers", "device_specific",
    "rng_torch", "skip_first", "break_first", "seedable_device_specific", "zip", "break_before_last",
)

# Where we differ from Accelerate 1.15 on purpose (docs/migrating-from-accelerate.md): {(processes, case): why}.
KNOWN_DIFFERENCES = {
    ("1", "batch_sampler_as_sampler"): "Accelerate raises TypeError (batch_size given twice) on one process; we load it",
    ("2", "seedable_device_specific"): "Accelerate seeds each process's SeedableRandomSampler with its own seed, so the "
    "processes' orders overlap; we take process 0's seed so every sample is seen once per epoch",
}


def rng_hash() -> str:
    """A short digest of the global torch RNG state."""
    return hashlib.sha256(torch.get_rng_state().numpy().tobytes()).hexdigest()[:16]


def trace(framework: str, case: str) -> dict[str, Any]:
    """This process's view of ``case``: ``{"prepared": hash, "epochs": [[[ids, hash], ...], ...]}``."""
    accelerate = importlib.import_module(framework)
    utils = importlib.import_module(f"{framework}.utils")
    _, config, _ = _loader(case)
    rng_types = ["torch", "generator"] if case == "rng_torch" else None
    accelerator = accelerate.Accelerator(cpu=True, dataloader_config=utils.DataLoaderConfiguration(**config), rng_types=rng_types)
    utils.set_seed(42, device_specific=case.endswith("device_specific"))
    loader, _, after = _loader(case)
    prepared = accelerator.prepare(loader)
    if case == "zip":  # a second shuffling loader iterated alongside: batches are (first, second) pairs
        second = accelerator.prepare(DataLoader(Ids(), batch_size=2, shuffle=True))
    if after is not None:
        after()
    out: dict[str, Any] = {"prepared": rng_hash(), "epochs": []}
    breaks = case in ("break_first", "break_before_last")
    break_after = 2 if case == "break_first" else len(prepared) - 1 if case == "break_before_last" else None
    for epoch in range(EPOCHS + breaks):
        batches = []
        active = accelerator.skip_first_batches(prepared, 2) if case == "skip_first" and epoch == 0 else prepared
        if case == "zip":
            active = (torch.cat(pair) for pair in zip(prepared, second))
        for batch in active:
            batches.append([batch.tolist(), rng_hash()])
            torch.rand(2)  # dropout
            # left early, the loader one batch ahead: the sampler's generator has drawn only what that batch needed
            if epoch == 0 and len(batches) == break_after:
                break
        out["epochs"].append(batches)
    return out


def trace_all(framework: str, cases: tuple[str, ...] = CASES) -> dict[str, Any]:
    """Every case's trace; a case that raises records ``{"error": "Type: message"}``."""
    out: dict[str, Any] = {}
    for case in cases:
        try:
            out[case] = trace(framework, case)
        except Exception as err:  # recorded: Accelerate fails some cases
            out[case] = {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"}
    return out


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_main(rank: int, framework: str, port: int, queue: Any) -> None:
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    queue.put((rank, trace_all(framework)))


def record(framework: str) -> dict[str, Any]:
    """``{"1": {case: trace}, "2": {case: [rank 0 trace, rank 1 trace]}}`` plus the versions used."""
    import torch.multiprocessing as mp

    out: dict[str, Any] = {"torch": torch.__version__, "1": {c: [t] for c, t in trace_all(framework).items()}}
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_rank_main, args=(rank, framework, port, queue)) for rank in range(2)]
    for p in procs:
        p.start()
    results = dict(queue.get(timeout=600) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    out["2"] = {case: [results[0][case], results[1][case]] for case in CASES}
    version = importlib.import_module(framework).__version__ if framework == "accelerate" else "ours"
    out[framework] = f"{framework} {version}"
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework", default="accelerate", choices=["accelerate", "trainer"])
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    result = record(args.framework)
    with open(args.out, "w") as f:  # one case a line, so a new recording diffs by case
        f.write("{\n")
        f.write(f'"framework": {json.dumps(result[args.framework])},\n"torch": {json.dumps(result["torch"])},\n')
        for i, n in enumerate(("1", "2")):
            cases = ",\n".join(f"  {json.dumps(case)}: {json.dumps(result[n][case], separators=(',', ':'))}" for case in CASES)
            f.write(f'"{n}": {{\n{cases}\n}}{"," if i == 0 else ""}\n')
        f.write("}\n")


def differences(expected: list[dict[str, Any]], actual: list[dict[str, Any]]) -> list[str]:
    """Where ``actual`` (one case's per-rank traces) differs from ``expected``: first differing batch per rank."""
    found = []
    for rank, (want, got) in enumerate(zip(expected, actual)):
        if "error" in want or "error" in got:
            if want.get("error") != got.get("error"):
                found.append(f"rank {rank}: error {want.get('error')!r} vs {got.get('error')!r}")
            continue
        if want["prepared"] != got["prepared"]:
            found.append(f"rank {rank}: RNG after prepare differs")
        for epoch, (w, g) in enumerate(zip(want["epochs"], got["epochs"])):
            if len(w) != len(g):
                found.append(f"rank {rank} epoch {epoch}: {len(g)} batches, expected {len(w)}")
            for i, (wb, gb) in enumerate(zip(w, g)):
                if wb[0] != gb[0]:
                    found.append(f"rank {rank} epoch {epoch} batch {i}: {gb[0]} expected {wb[0]}")
                    break
                if wb[1] != gb[1]:
                    found.append(f"rank {rank} epoch {epoch} batch {i}: RNG state after it differs")
                    break
    return found
