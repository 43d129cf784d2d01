"""Accelerate's process helpers on 2 real processes (gloo): split_between_processes, the process decorators,
trigger_sync_in_backward (DDP and FSDP) and join_uneven_inputs."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from tests.helpers.multiprocess import run_distributed

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]


def _data(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(10 + rank)
    return torch.randn(4, 3, generator=gen), torch.randn(4, 3, generator=gen)


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def _reference_grads(world_size: int) -> list[torch.Tensor]:
    """What DDP must produce: the mean over ranks of each rank's two-forward loss gradient."""
    model = _model()
    for rank in range(world_size):
        first, second = _data(rank)
        ((model(first).sum() + model(second).sum()) / world_size).backward()
    return [p.grad.clone() for p in model.parameters()]


def _two_forwards_one_backward(acc, model, trigger: bool) -> list[torch.Tensor]:
    first, second = _data(acc.process_index)
    with acc.no_sync(model):
        loss = model(first).sum() + model(second).sum()
        if trigger:
            with acc.trigger_sync_in_backward(model):
                acc.backward(loss)
        else:
            acc.backward(loss)
    grads = [p.grad for p in model.parameters()]
    return [g.full_tensor() if hasattr(g, "full_tensor") else g.clone() for g in grads]


def _helpers() -> dict:
    from trainer import Accelerator
    from trainer.state import PartialState

    acc = Accelerator(cpu=True)
    out: dict = {}
    with acc.split_between_processes(["A", "B", "C"]) as mine:
        out["split"] = mine
    with PartialState().split_between_processes(["A", "B", "C"], apply_padding=True) as mine:
        out["padded"] = mine
    with acc.split_between_processes({"ids": torch.arange(5)}) as mine:
        out["dict"] = mine["ids"].tolist()
    ran: list[str] = []
    acc.on_main_process(lambda: ran.append("main"))()
    acc.on_last_process(lambda: ran.append("last"))()
    acc.on_process(process_index=1)(lambda: ran.append("p1"))()
    acc.on_local_process(lambda: ran.append("l0"), local_process_index=0)()
    out["ran"] = ran
    out["state"] = (acc.state.num_processes, acc.state.process_index, acc.state.distributed_type.value)

    model = acc.prepare(_model())
    out["triggered"] = _two_forwards_one_backward(acc, model, trigger=True)
    model.zero_grad()
    out["untriggered"] = _two_forwards_one_backward(acc, model, trigger=False)
    out["reference"] = _reference_grads(acc.num_processes)

    # join: rank 0 gets 3 batches, rank 1 gets 2; Join shadows the missing rank's all-reduce, nothing hangs
    joined = acc.prepare(torch.nn.Linear(1, 1))
    optimizer = acc.prepare(torch.optim.SGD(joined.parameters(), lr=0.1))
    loader = acc.prepare(DataLoader(torch.arange(5.0).reshape(5, 1), batch_size=1))
    out["len_before"] = len(loader)
    with acc.join_uneven_inputs([joined], even_batches=False):
        out["len_inside"] = len(loader)
        steps = 0
        for batch in loader:
            acc.backward(joined(batch).pow(2).sum())
            optimizer.step()
            optimizer.zero_grad()
            steps += 1
    out["steps"] = steps
    out["len_after"] = len(loader)
    out["joined_weights"] = [p.detach().clone() for p in acc.unwrap_model(joined).parameters()]
    acc.end_training()
    return out


def test_process_helpers_trigger_sync_and_join_on_two_processes() -> None:
    r0, r1 = run_distributed(_helpers, nprocs=2)
    assert (r0["split"], r1["split"]) == (["A", "B"], ["C"])
    assert (r0["padded"], r1["padded"]) == (["A", "B"], ["C", "C"])
    assert (r0["dict"], r1["dict"]) == ([0, 1, 2], [3, 4])
    assert (r0["ran"], r1["ran"]) == (["main", "l0"], ["last", "p1"])
    assert (r0["state"], r1["state"]) == ((2, 0, "MULTI_CPU"), (2, 1, "MULTI_CPU"))

    for got0, got1, want in zip(r0["triggered"], r1["triggered"], r0["reference"]):
        torch.testing.assert_close(got0, want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got1, want, rtol=1e-5, atol=1e-6)
    # the control: inside no_sync without the trigger each rank keeps its own gradient
    assert not all(torch.allclose(a, b) for a, b in zip(r0["untriggered"], r1["untriggered"]))

    assert (r0["len_before"], r1["len_before"]) == (3, 3)  # even_batches=True wraps rank 1 around
    assert (r0["len_inside"], r1["len_inside"]) == (3, 2)
    assert (r0["steps"], r1["steps"]) == (3, 2)
    assert (r0["len_after"], r1["len_after"]) == (3, 3)
    for a, b in zip(r0["joined_weights"], r1["joined_weights"]):
        assert torch.equal(a, b)


def _fsdp() -> dict:
    from trainer import Accelerator

    acc = Accelerator(cpu=True, strategy="fsdp")
    model = acc.prepare(_model())
    out = {"triggered": _two_forwards_one_backward(acc, model, trigger=True), "reference": _reference_grads(2)}
    try:
        with acc.join_uneven_inputs([model], even_batches=False):
            pass
        out["join"] = "no error"
    except NotImplementedError as err:
        out["join"] = str(err)
    acc.end_training()
    return out


def test_fsdp_trigger_sync_reduces_and_join_is_refused() -> None:
    for result in run_distributed(_fsdp, nprocs=2):
        for got, want in zip(result["triggered"], result["reference"]):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        assert "needs strategy='ddp'" in result["join"] and "even_batches=True" in result["join"]
