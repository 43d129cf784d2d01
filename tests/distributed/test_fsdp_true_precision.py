"""FSDP2 with bf16-true on 2 real processes (gloo, CPU): bf16 shards, and the losses of a single-process bf16-true run."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tests.distributed.test_fsdp import Block
from tests.helpers.multiprocess import run_distributed

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]

STEPS, GLOBAL_BATCH = 8, 16
# bf16 keeps 8 significant bits: one unit in the last place (ulp) of a loss is at most 2**-7 of it. The two runs
# differ only in where bf16 rounds (two half-batch gradients reduced in bf16 across the processes, against one
# full-batch gradient), which moves a parameter by an ulp here and there: the losses differ by up to 1 ulp (0.7%)
# here. 4 ulps is room for that and far below what a real difference does: without the gradient reduction (each
# process fitting its own half) the losses part by 38% within these steps.
LOSS_RTOL = 4 * 2**-7


def _data() -> TensorDataset:
    """One global batch of a noisy linear target, seen once per epoch: the loss must fall step after step."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(GLOBAL_BATCH, 4, generator=g)
    return TensorDataset(x, x @ torch.tensor([[1.0], [-2.0], [0.5], [0.3]]) + 0.1 * torch.randn(GLOBAL_BATCH, 1, generator=g))


def _fit(strategy: str, project_dir: str) -> dict[str, Any]:
    from strategies import FSDPStrategy
    from trainer import Trainer, TrainModule

    class Regressor(TrainModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.inp, self.blocks, self.out = nn.Linear(4, 16), nn.Sequential(Block(16), Block(16)), nn.Linear(16, 1)
            self.losses: list[float] = []

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.out(self.blocks(self.inp(x)))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = nn.functional.mse_loss(self(x), y)
            self.losses.append(float(loss.detach()))
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=0.02)

    chosen = FSDPStrategy(cpu=True, wrap_classes=[Block], precision="bf16-true") if strategy == "fsdp" else strategy
    trainer = Trainer(strategy=chosen, accelerator="cpu", precision="bf16-true", max_epochs=STEPS, project_dir=project_dir,
                      log_with=None, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    module = Regressor()
    trainer.fit(module, DataLoader(_data(), batch_size=GLOBAL_BATCH // trainer.world_size))
    param = module.inp.weight
    optimizer = trainer.optimizers[0]
    exp_avg = getattr(optimizer, "optimizer", optimizer).state[param]["exp_avg"]
    return {
        "losses": module.losses,
        "param_type": type(param).__name__,
        "shard_dtypes": {p.to_local().dtype if hasattr(p, "to_local") else p.dtype for p in module.parameters()},
        "exp_avg": (exp_avg.to_local() if hasattr(exp_avg, "to_local") else exp_avg).dtype,
        "full": {k: v.clone() for k, v in trainer.strategy.module_state_dict(module).items()},
    }


def test_fsdp_bf16_true_shards_bf16_and_matches_one_process(tmp_path: Any) -> None:
    reference = _fit("single", str(tmp_path / "single"))
    ranks = run_distributed(_fit, "fsdp", str(tmp_path / "fsdp"))
    for rank in ranks:
        assert rank["param_type"] == "DTensor" and rank["shard_dtypes"] == {torch.bfloat16} and rank["exp_avg"] == torch.bfloat16
    assert {v.dtype for v in ranks[0]["full"].values()} == {torch.bfloat16} and ranks[1]["full"] == {}
    # the global loss of a step is the mean of the two processes' half-batch means (equal halves)
    losses = [(a + b) / 2 for a, b in zip(ranks[0]["losses"], ranks[1]["losses"])]
    assert len(losses) == STEPS and all(later < earlier for earlier, later in itertools.pairwise(losses))  # it trains
    assert losses[-1] < 0.5 * losses[0]
    assert max(abs(a - b) / b for a, b in zip(losses, reference["losses"])) <= LOSS_RTOL
