"""on_nonfinite under DDP: a NaN loss on one process makes every process skip the batch, at the same step."""

from __future__ import annotations

import pytest

from tests.helpers.multiprocess import run_distributed

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]


def _fit(root: str):
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from trainer import Trainer, TrainModule

    class NanOnRankOne(TrainModule):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.lin(x), y)
            return loss * float("nan") if batch_idx == 0 and self.global_rank == 1 else loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    torch.manual_seed(0)
    loader = DataLoader(TensorDataset(torch.randn(32, 2), torch.randn(32, 1)), batch_size=4)
    module = NanOnRankOne()
    trainer = Trainer(project_dir=root, max_epochs=1, on_nonfinite="skip", log_with=None, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False, process_group_timeout=60)
    trainer.fit(module, loader)
    return {"skipped": trainer.nonfinite_skipped, "steps": trainer.global_step,
            "finite": all(bool(torch.isfinite(p).all()) for p in module.parameters()),
            "weights": [p.detach().clone() for p in module.parameters()]}


def test_a_nan_on_one_process_is_skipped_on_every_process(tmp_path) -> None:
    import torch

    results = run_distributed(_fit, str(tmp_path))
    assert [r["skipped"] for r in results] == [1, 1] and [r["steps"] for r in results] == [3, 3]
    assert all(r["finite"] for r in results)
    assert all(torch.equal(a, b) for a, b in zip(results[0]["weights"], results[1]["weights"]))  # still in sync
