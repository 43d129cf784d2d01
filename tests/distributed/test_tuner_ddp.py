"""The tuners and an accumulation schedule on 2 DDP processes (real gloo): `LearningRateFinder` in a fit gives both
ranks the same results (rank 0 decides the early stop, as Lightning's broadcast) and leaves the run bit for bit as a
fit without it; the hidden checkpoint of the search is removed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.multiprocess import run_distributed


def _fit_on_each_rank(root: str, with_finder: bool) -> dict[str, Any]:
    from callbacks import LearningRateFinder
    from tests.unit.test_tuner import Regression, make_trainer, weights

    finder = LearningRateFinder(num_training_steps=12, min_lr=1e-4, max_lr=10.0, update_attr=False) if with_finder else None
    module = Regression()
    trainer = make_trainer(Path(root), accumulate_grad_batches={1: 2}, callbacks=[finder] if finder else [],
                           process_group_timeout=60)
    trainer.fit(module)
    assert trainer.world_size == 2
    results = finder.optimal_lr.results if finder is not None and finder.optimal_lr is not None else None
    return {"weights": weights(module), "results": results, "steps": trainer.global_step}


@pytest.mark.timeout(300)
def test_lr_finder_under_ddp(tmp_path: Path) -> None:
    plain = run_distributed(_fit_on_each_rank, str(tmp_path / "plain"), False)
    tuned = run_distributed(_fit_on_each_rank, str(tmp_path / "tuned"), True)
    assert tuned[0]["results"] == tuned[1]["results"] and 1 < len(tuned[0]["results"]["lr"]) <= 12
    for rank in range(2):
        assert tuned[rank]["steps"] == plain[rank]["steps"] == 3 + 2 + 2  # 3 batches an epoch on each rank; then 2 per step
        assert all(torch.equal(tuned[rank]["weights"][k], plain[rank]["weights"][k]) for k in plain[rank]["weights"])
    assert not list(tmp_path.rglob(".lr_find_*"))
