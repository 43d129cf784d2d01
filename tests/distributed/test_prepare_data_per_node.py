"""`prepare_data_per_node` on 2 processes (real gloo) that stand for 2 machines of one process each (both have local
rank 0): True (the default), each machine prepares; False, global rank 0 alone prepares, and the other waits for it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.multiprocess import run_distributed


def _fit(root: str, datamodule_per_node: bool, module_per_node: bool) -> dict[str, Any]:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from trainer import DataModule, Trainer, TrainModule

    class Data(DataModule):
        def prepare_data(self) -> None:
            time.sleep(0.5)  # the other process must not pass before this file is written
            Path(root, f"data_rank{self.trainer.global_rank}").write_text("prepared")

        def train_dataloader(self) -> Any:
            return DataLoader(TensorDataset(torch.randn(8, 2)), batch_size=2)

    class Net(TrainModule):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(2, 1)

        def prepare_data(self) -> None:
            Path(root, f"module_rank{self.trainer.global_rank}").write_text("prepared")

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return self.lin(batch[0]).pow(2).mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data, net = Data(), Net()
    assert data.prepare_data_per_node and net.prepare_data_per_node  # Lightning's default
    data.prepare_data_per_node, net.prepare_data_per_node = datamodule_per_node, module_per_node
    trainer = Trainer(max_epochs=1, accelerator="cpu", log_with=None, enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=False, num_nodes=2, process_group_timeout=60)
    trainer.fit(net, datamodule=data)
    return {"world_size": trainer.world_size, "local_rank": trainer.local_rank, "seen_when_set_up": sorted(p.name for p in Path(root).iterdir())}


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("datamodule_per_node", "module_per_node"), [(True, True), (False, False), (False, True)])
def test_prepare_data_per_node(tmp_path: Path, datamodule_per_node: bool, module_per_node: bool) -> None:
    results = run_distributed(_fit, str(tmp_path), datamodule_per_node, module_per_node, env={"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"})
    assert [(r["world_size"], r["local_rank"]) for r in results] == [(2, 0), (2, 0)]  # two machines, one process each
    expected = {"data_rank0", "module_rank0"}
    expected |= {"data_rank1"} if datamodule_per_node else set()
    expected |= {"module_rank1"} if module_per_node else set()
    assert {p.name for p in tmp_path.iterdir()} == expected
    assert all(set(r["seen_when_set_up"]) == expected for r in results)  # the fit started after every preparation
