"""A 2-process script that never calls ``end_training()`` must still exit 0, every time (20 runs in a row).

Without the strategy destroying its process group at interpreter exit, gloo's threads outlive Python and
abort the process ("terminate called without an active exception") in about 1 run of 3 on this machine.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.integration.test_cli_launch import clean_env, run_trainer

RUNS = 20

PLAIN = textwrap.dedent(
    """
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from trainer import Accelerator

    acc = Accelerator(process_group_timeout=60)
    loader = acc.prepare(DataLoader(TensorDataset(torch.arange(16.0)), batch_size=4))
    for (x,) in loader:
        acc.gather_for_metrics(x)
    """
)


@pytest.mark.faults
@pytest.mark.timeout(600)
def test_plain_script_without_end_training_always_exits_zero(tmp_path: Path) -> None:
    script = tmp_path / "plain.py"
    script.write_text(PLAIN)
    env = clean_env(tmp_path)
    failures = []
    for attempt in range(RUNS):
        result = run_trainer(["launch", "--num_processes", "2", "--cpu", str(script)], env, tmp_path)
        if result.returncode != 0:
            failures.append((attempt, result.returncode, result.stderr[-400:]))
    assert not failures, f"{len(failures)} of {RUNS} runs failed: {failures}"
