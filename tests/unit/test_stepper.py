"""The `Stepper` is the one training step: both faces drive it, and the cheap path is decided once, inside it."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from strategies import SingleDeviceStrategy
from trainer import Accelerator, Trainer, TrainModule
from trainer.accelerator.config import GradientAccumulationPlugin
from trainer.accelerator.stepper import Stepper

QUIET = dict(log_with=None, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)


class CountingStrategy(SingleDeviceStrategy):
    """A strategy with something of its own to do in backward and the optimizer step."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.calls: list[str] = []

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        self.calls.append("backward")
        super().backward(loss, **kwargs)

    def optimizer_step(self, optimizer: torch.optim.Optimizer, **kwargs: Any) -> bool:
        self.calls.append("optimizer_step")
        return super().optimizer_step(optimizer, **kwargs)


def test_the_cheap_path_is_taken_only_where_the_strategy_adds_nothing() -> None:
    plain = Stepper(SingleDeviceStrategy(cpu=True), GradientAccumulationPlugin(num_steps=1))
    assert plain.plain and plain.plain_backward
    accumulating = Stepper(SingleDeviceStrategy(cpu=True), GradientAccumulationPlugin(num_steps=2))
    assert accumulating.plain and not accumulating.plain_backward  # the loss is divided: through the strategy
    counting = CountingStrategy(cpu=True)
    stepper = Stepper(counting, GradientAccumulationPlugin(num_steps=1))
    assert not stepper.plain
    param = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([param], lr=0.1)
    stepper.backward((param * 2).sum())
    assert stepper.optimizer_step(optimizer) and counting.calls == ["backward", "optimizer_step"]
    assert torch.equal(param.detach(), torch.full((2,), 0.8))


def test_both_boundary_rules_live_in_the_stepper() -> None:
    stepper = Stepper(SingleDeviceStrategy(cpu=True), GradientAccumulationPlugin(num_steps=3))
    # Accelerate's: every third batch, and the loader's last batch ends the window and restarts the count
    assert [stepper.advance(end_of_data=False) for _ in range(4)] == [False, False, True, False]
    assert stepper.advance(end_of_data=True) and stepper.batches_in_window == 0
    # Lightning's, from a position the Trainer saves: the window is full or the epoch ends
    assert [stepper.at_position(p, last=False) for p in range(3)] == [False, False, True]
    assert stepper.at_position(0, last=True)


class Regression(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Linear(3, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _data() -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(24, 3, generator=g), torch.randn(24, 1, generator=g))


@pytest.mark.parametrize("accumulation", [1, 3])
def test_both_faces_step_through_the_strategy_the_same_way(tmp_path: Any, accumulation: int) -> None:
    """The Trainer's batch and an Accelerator loop make the same strategy calls and reach the same weights."""
    trainer_strategy = CountingStrategy(cpu=True)
    trainer = Trainer(strategy=trainer_strategy, max_epochs=1, accumulate_grad_batches=accumulation, project_dir=tmp_path, **QUIET)
    module = Regression()
    trainer.fit(module, DataLoader(_data(), batch_size=4))

    acc_strategy = CountingStrategy(cpu=True)
    acc = Accelerator(strategy=acc_strategy, gradient_accumulation_steps=accumulation)
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 1)
    net, optimizer, loader = acc.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1), DataLoader(_data(), batch_size=4))
    for x, y in loader:
        with acc.accumulate(net):
            acc.backward(torch.nn.functional.mse_loss(net(x), y))
            optimizer.step()
            optimizer.zero_grad()

    assert trainer_strategy.calls == acc_strategy.calls
    assert trainer_strategy.calls.count("optimizer_step") == 6 // accumulation
    for mine, theirs in zip(module.net.parameters(), net.parameters()):
        assert torch.equal(mine.detach(), theirs.detach())
