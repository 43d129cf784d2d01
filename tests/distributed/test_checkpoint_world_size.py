"""A full-format (DDP) checkpoint of 2 processes is refused by 1 process, naming both counts; nothing is loaded."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers.multiprocess import run_distributed

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]


def _save(root: str) -> None:
    from trainer import Accelerator

    acc = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    model, _opt = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    acc.save_state(f"{root}/state")
    acc.end_training()


def test_ddp_checkpoint_of_two_processes_is_refused_on_one(tmp_path: Path) -> None:
    from trainer import Accelerator

    run_distributed(_save, str(tmp_path))
    acc = Accelerator(cpu=True)
    model = torch.nn.Linear(3, 2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model, _ = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="was written by 2 processes but this run has 1; resuming needs the same number"):
        acc.load_state(tmp_path / "state")
    assert all(torch.equal(model.state_dict()[k], before[k]) for k in before)
