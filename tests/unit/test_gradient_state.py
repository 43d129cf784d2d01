"""`accelerator.gradient_state` / `trainer.state.GradientState`: a view over the Accelerator's stepper and its prepared
loaders (Accelerate's ``GradientState``), and ``AcceleratorState._reset_state``."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from trainer import Accelerator
from trainer.accelerator import gradient_state, layout
from trainer.state import AcceleratorState, GradientState
from trainer.utils import DistributedType, GradientAccumulationPlugin


def test_the_window_is_the_steppers() -> None:
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    state = accelerator.gradient_state
    assert (state.num_steps, state.plugin_kwargs, state.adjust_scheduler, state.sync_with_dataloader) == (2, {"num_steps": 2}, True, True)
    model = torch.nn.Linear(1, 1)
    loader = accelerator.prepare(DataLoader(torch.arange(5.0).unsqueeze(1), batch_size=1))
    seen = []
    for _ in loader:
        with accelerator.accumulate(model):
            seen.append(state.sync_gradients)
            assert state.sync_gradients is accelerator.sync_gradients
    assert seen == [False, True, False, True, True]  # every 2nd batch, and the loader's last
    state.sync_gradients = False
    assert accelerator.sync_gradients is False and accelerator.stepper.sync_gradients is False
    accelerator.gradient_accumulation_steps = 4
    assert state.num_steps == 4 and state.plugin_kwargs == {"num_steps": 4}


def test_gradient_state_reads_the_accelerator_made_last() -> None:
    Accelerator(cpu=True)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=3)
    assert GradientState().num_steps == 3
    plugin = GradientAccumulationPlugin(num_steps=5, adjust_scheduler=False, sync_with_dataloader=False)
    state = GradientState(plugin)
    assert accelerator.gradient_accumulation_steps == 5 and accelerator.stepper.accumulation_steps == 5
    assert state.plugin_kwargs == {"num_steps": 5, "adjust_scheduler": False, "sync_with_dataloader": False}
    assert (state.adjust_scheduler, state.sync_with_dataloader) == (False, False)
    accelerator.stepper.sync_gradients, accelerator.stepper.batches_in_window = False, 3
    GradientState._reset_state()
    assert accelerator.sync_gradients is True and accelerator.step == 0
    with pytest.raises(TypeError, match="GradientAccumulationPlugin"):
        GradientState({"num_steps": 2})  # type: ignore[arg-type]


def test_gradient_state_without_an_accelerator_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gradient_state, "_latest", [])
    with pytest.raises(RuntimeError, match="create the Accelerator first"):
        GradientState()
    GradientState._reset_state()  # nothing to restart


def test_active_dataloader_follows_nested_and_broken_loops() -> None:
    accelerator = Accelerator(cpu=True)
    first, second = accelerator.prepare(DataLoader(list(range(10)), batch_size=4), DataLoader(list(range(6)), batch_size=4))
    state = accelerator.gradient_state
    assert (state.active_dataloader, state.in_dataloader, state.end_of_dataloader, state.remainder) == (None, False, False, -1)
    for i, _ in enumerate(first):
        assert state.active_dataloader is first
        if i == 0:
            for j, _ in enumerate(second):
                assert state.active_dataloader is second and state.dataloader_references == [None, first, second]
                assert state.end_of_dataloader is (j == len(second) - 1)
            assert state.active_dataloader is first and not state.end_of_dataloader
        if i == len(first) - 1:
            assert state.end_of_dataloader and state.remainder == first.remainder == 2
    assert state.active_dataloader is None
    iterator = iter(first)
    next(iterator)
    assert state.active_dataloader is first
    del iterator  # a loop left with break: the pass ends when its iterator goes
    assert state.active_dataloader is None
    assert "Sync Gradients: True" in repr(state)


def test_reset_state_retires_the_accelerators_made_before(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(layout, "resets", [0])
    old = Accelerator(cpu=True)
    AcceleratorState._reset_state()
    with pytest.raises(AttributeError, match=r"This happens if `AcceleratorState._reset_state\(\)` was called"):
        old.prepare(torch.nn.Linear(1, 1))
    new = Accelerator(cpu=True)
    assert isinstance(new.prepare(torch.nn.Linear(1, 1)), torch.nn.Module)


def test_accelerates_other_distributed_types_compare() -> None:
    assert Accelerator(cpu=True).distributed_type not in (DistributedType.MULTI_NPU, DistributedType.MULTI_HPU, DistributedType.MEGATRON_LM)
    assert DistributedType("MULTI_NEURON") is DistributedType.MULTI_NEURON
