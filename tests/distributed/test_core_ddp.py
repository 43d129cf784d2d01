"""Real 2-process gloo checks of the core, sharing one process start-up."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from tests.helpers.multiprocess import run_distributed

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]


def _collectives(acc):
    from strategies import collectives

    rank = acc.process_index
    out = {}
    out["gather_nested"] = acc.gather({"a": torch.tensor([rank]), "b": (torch.full((2, 2), rank),)})
    out["gather_unequal"] = acc.gather(torch.arange(rank + 2))  # rank0: 2 items, rank1: 3 items
    out["gather_scalar"] = acc.gather(torch.tensor(float(rank)))
    out["gather_object"] = acc.gather_object([f"r{rank}"] * (rank + 1))
    out["gather_object_large"] = acc.gather_object({"rank": rank, "blob": "x" * (9000 * rank)})  # one over 4 KB: two rounds
    out["pad"] = acc.pad_across_processes(torch.ones(rank + 1, 2), dim=0, pad_index=-1)
    out["pad_first"] = acc.pad_across_processes(torch.ones(2, rank + 1), dim=1, pad_index=-1, pad_first=True)
    out["reduce"] = {r: acc.reduce(torch.tensor([rank + 1.0]), r).item() for r in ("sum", "mean", "max", "min")}
    out["broadcast"] = acc.broadcast(torch.tensor([rank + 5]), from_process=1).item()
    out["broadcast_object"] = acc.broadcast_object({"from": rank})
    try:
        acc.gather(torch.zeros(2, rank + 1))
        out["mismatch"] = "no error"
    except ValueError as err:
        out["mismatch"] = str(err)
    out["still_alive"] = collectives.gather(torch.tensor([1])).tolist()
    return out


def _gather_for_metrics(acc):
    loader = acc.prepare(DataLoader(list(range(7)), batch_size=2))
    seen = [acc.gather_for_metrics(batch).tolist() for batch in loader]
    objects = []
    for batch in loader:
        objects.extend(acc.gather_for_metrics([f"s{int(i)}" for i in batch], use_gather_object=True))
    return {"batches": seen, "objects": objects}


def _make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def _ddp_matches_single(acc):
    torch.manual_seed(1)
    x, y = torch.randn(64, 3), torch.randn(64, 1)
    model = _make_model()
    reference = copy.deepcopy(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ddp_model, opt, loader = acc.prepare(model, opt, DataLoader(TensorDataset(x, y), batch_size=8))
    for xb, yb in loader:  # each rank: 8 of every global batch of 16
        acc.backward(torch.nn.functional.mse_loss(ddp_model(xb), yb))
        opt.step()
        opt.zero_grad()
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for i in range(0, 64, 16):
        torch.nn.functional.mse_loss(reference(x[i : i + 16]), y[i : i + 16]).backward()
        ref_opt.step()
        ref_opt.zero_grad()
    return max((a - b).abs().max().item() for a, b in zip(acc.unwrap_model(ddp_model).parameters(), reference.parameters()))


def _accumulation_skips_sync(acc):
    from trainer import Accelerator

    acc2 = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = acc2.prepare(_make_model())
    opt = acc2.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    grads = []
    for step in range(2):
        x = torch.full((4, 3), float(acc2.process_index + 1 + step))
        with acc2.accumulate(model):
            acc2.backward(model(x).sum())
            grads.append((acc2.sync_gradients, acc2.gather(acc2.unwrap_model(model)[0].weight.grad.clone().unsqueeze(0))))
            opt.step()
            opt.zero_grad()
    return [(sync, torch.equal(g[0], g[1])) for sync, g in grads]


def _fp16_inf_skips(acc):
    from trainer import Accelerator

    acc2 = Accelerator(cpu=True, mixed_precision="fp16")
    model = acc2.prepare(_make_model())
    opt = acc2.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    before = [p.detach().clone() for p in model.parameters()]
    loss = model(torch.ones(2, 3)).sum()
    if acc2.process_index == 1:
        loss = loss * float("inf")  # injected on one rank only
    acc2.backward(loss)
    opt.step()
    unchanged = all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    return acc2.optimizer_step_was_skipped, unchanged


def _save_load_exact(acc, path):
    from trainer import Accelerator
    from trainer.utils import set_seed

    def build():
        set_seed(3)
        a = Accelerator(cpu=True)
        model = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 1))
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        data = TensorDataset(torch.randn(40, 3), torch.randn(40, 1))
        return (a, *a.prepare(model, opt, DataLoader(data, batch_size=4, shuffle=True)))

    def run(a, model, opt, it, n):
        out = []
        for _ in range(n):
            xb, yb = next(it)
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            a.backward(loss)
            opt.step()
            opt.zero_grad()
            out.append((xb.sum().item(), loss.item()))
        return out

    a, model, opt, loader = build()
    it = iter(loader)
    run(a, model, opt, it, 2)
    a.save_state(path)
    straight = run(a, model, opt, it, 3)
    weights = [p.detach().clone() for p in model.parameters()]
    b, model2, opt2, loader2 = build()
    b.load_state(path)
    resumed = run(b, model2, opt2, iter(loader2), 3)
    return straight == resumed, all(torch.equal(x, y) for x, y in zip(weights, model2.parameters()))


def _all_checks(path):
    from trainer import Accelerator

    acc = Accelerator(cpu=True)
    return {
        "num_processes": acc.num_processes,
        "process_index": acc.process_index,
        "distributed_type": acc.distributed_type.value,
        "collectives": _collectives(acc),
        "gather_for_metrics": _gather_for_metrics(acc),
        "ddp_vs_single": _ddp_matches_single(acc),
        "accumulation": _accumulation_skips_sync(acc),
        "fp16": _fp16_inf_skips(acc),
        "resume": _save_load_exact(acc, path),
    }


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_distributed(_all_checks, str(tmp_path_factory.mktemp("state") / "ckpt"), nprocs=2)


def test_two_processes_really_ran(results):
    assert [r["num_processes"] for r in results] == [2, 2]
    assert [r["process_index"] for r in results] == [0, 1]
    assert {r["distributed_type"] for r in results} == {"MULTI_CPU"}


def test_collectives(results):
    for c in results:
        c = c["collectives"]
        assert c["gather_nested"]["a"].tolist() == [0, 1]
        assert c["gather_nested"]["b"][0].tolist() == [[0, 0], [0, 0], [1, 1], [1, 1]]
        assert c["gather_unequal"].tolist() == [0, 1, 0, 1, 2]
        assert c["gather_scalar"].tolist() == [0.0, 1.0]
        assert c["gather_object"] == ["r0", "r1", "r1"]
        assert c["gather_object_large"] == [{"rank": 0, "blob": ""}, {"rank": 1, "blob": "x" * 9000}]
        assert c["reduce"] == {"sum": 3.0, "mean": 1.5, "max": 2.0, "min": 1.0}
        assert c["broadcast"] == 6 and c["broadcast_object"] == {"from": 0}
        assert "pad_across_processes" in c["mismatch"]
        assert c["still_alive"] == [1, 1]
    assert results[0]["collectives"]["pad"].tolist() == [[1, 1], [-1, -1]]
    assert results[0]["collectives"]["pad_first"].tolist() == [[-1, 1], [-1, 1]]


def test_gather_for_metrics_counts_every_sample_once(results):
    for r in results:
        g = r["gather_for_metrics"]
        assert g["batches"] == [[0, 1, 2, 3], [4, 5, 6]]
        assert g["objects"] == [f"s{i}" for i in range(7)]


def test_ddp_matches_single_process(results):
    assert all(r["ddp_vs_single"] < 1e-6 for r in results)


def test_accumulation_skips_sync_until_boundary(results):
    for r in results:
        assert r["accumulation"] == [(False, False), (True, True)]


def test_fp16_skip_on_injected_inf(results):
    assert all(r["fp16"] == (True, True) for r in results)


def test_save_load_state_reproduces_next_batches_and_weights(results):
    assert all(r["resume"] == (True, True) for r in results)
