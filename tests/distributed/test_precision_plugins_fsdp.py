"""``Trainer(strategy="fsdp", plugins=[FSDPPrecision(mode, policy=MixedPrecisionPolicy(...))])`` on 2 real processes
(gloo, CPU): the plugin's policy is the one `fully_shard` applies."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from tests.helpers.multiprocess import run_distributed

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]


def _fit_with_policy(tmp: str) -> dict[str, Any]:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from trainer import Trainer, TrainModule
    from trainer.plugins import FSDPPrecision

    class Line(TrainModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)
            self.dtypes: list[str] = []

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            out = self.layer(batch[0])
            self.dtypes.append(str(out.dtype))
            return out.float().pow(2).mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    policy = MixedPrecisionPolicy(param_dtype=torch.float64, reduce_dtype=torch.float32)
    trainer = Trainer(strategy="fsdp", plugins=[FSDPPrecision("no", policy=policy)], max_epochs=1, project_dir=tmp,
                      log_with=None, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                      process_group_timeout=60)
    module = Line()
    trainer.fit(module, DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=2))
    return {"policy": trainer.accelerator.strategy.precision.policy is policy, "dtypes": module.dtypes}


def test_an_fsdp_precision_plugins_policy_is_applied(tmp_path: Any) -> None:
    for rank in run_distributed(_fit_with_policy, str(tmp_path), nprocs=2, timeout=240):
        assert rank == {"policy": True, "dtypes": ["torch.float64", "torch.float64"]}  # the policy's compute dtype
