"""Two real processes (gloo) see the batches Accelerate 1.15 gives each, and leave the global RNG as it does.

Compared with the traces recorded from Accelerate by `tests/helpers/data_order_trace.py`
(`tests/fixtures/accelerate_data_order.json`); the one-process half is in `tests/unit/test_accelerate_data_order.py`.
On top of Accelerate's order, `save_state` mid-epoch and `load_state` in new processes continue with the batches
and random numbers of the uninterrupted run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from tests.helpers import data_order_trace as dot
from tests.helpers.multiprocess import run_distributed

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]

RECORDED = json.loads((Path(__file__).resolve().parents[1] / "fixtures" / "accelerate_data_order.json").read_text())


def _trace_all() -> dict[str, Any]:
    return dot.trace_all("trainer")


def test_two_processes_match_accelerate() -> None:
    if RECORDED["torch"].split(".")[:2] != torch.__version__.split(".")[:2]:
        pytest.skip(f"the traces were recorded with torch {RECORDED['torch']}; this is {torch.__version__}")
    ranks = run_distributed(_trace_all)
    mismatched = {}
    for case in dot.CASES:
        got = [ranks[0][case], ranks[1][case]]
        if ("2", case) in dot.KNOWN_DIFFERENCES:
            for epoch in range(dot.EPOCHS):  # ours: every sample once per epoch (22 samples in 24 places)
                seen = [i for rank in got for batch, _ in rank["epochs"][epoch] for i in batch]
                assert set(seen) == set(range(dot.N)), (case, epoch, sorted(seen))
            continue
        found = dot.differences(RECORDED["2"][case], got)
        if found:
            mismatched[case] = found[:3]
    assert mismatched == {}


def _epochs(accelerator: Any, loader: Any, epochs: range, save_at: tuple[int, int] | None, directory: str) -> list[Any]:
    seen = []
    for epoch in epochs:
        for i, batch in enumerate(loader):
            seen.append([epoch, batch[0].tolist(), dot.rng_hash()])
            torch.rand(2)  # dropout
            if (epoch, i + 1) == save_at:
                accelerator.save_state(directory)
                return seen
    return seen


def _run(kind: str, directory: str, save_at: tuple[int, int] | None, resume: bool) -> list[Any]:
    from torch.utils.data import TensorDataset

    from trainer import Accelerator
    from trainer.utils import set_seed

    accelerator = Accelerator(cpu=True)
    set_seed(42)
    data = TensorDataset(torch.arange(23))
    generator = torch.Generator().manual_seed(5) if kind == "generator" else None
    loader = accelerator.prepare(DataLoader(data, batch_size=3, shuffle=True, generator=generator))
    first_epoch = 0
    if resume:
        torch.manual_seed(1000 + accelerator.process_index)  # a new process: its RNG is the checkpoint's to restore
        accelerator.load_state(directory)
        first_epoch = loader.state_dict()["epoch"]
    return _epochs(accelerator, loader, range(first_epoch, 3), save_at, directory)


@pytest.mark.parametrize("kind", ["shuffle", "generator"])
def test_save_state_mid_epoch_resumes_with_the_same_batches(tmp_path: Path, kind: str) -> None:
    directory = str(tmp_path / "ckpt")
    whole = run_distributed(_run, kind, directory, None, False)
    first = run_distributed(_run, kind, directory, (1, 2), False)
    rest = run_distributed(_run, kind, directory, None, True)
    for rank in range(2):
        assert first[rank] + rest[rank] == whole[rank], f"rank {rank}"
    assert whole[0] != whole[1]
