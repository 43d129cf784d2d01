"""Accelerate's kwargs handlers on 2 real processes (gloo): every DistributedDataParallelKwargs field and the DDP
communication hooks (fp16, PowerSGD, an fp16-wrapped PowerSGD; bf16 refused on gloo as torch does, batched PowerSGD where torch's is broken), InitProcessGroupKwargs' timeout,
LocalSGD against a single-process simulation, per-rank profiler traces, and join_uneven_inputs on a plain module."""

from __future__ import annotations

import datetime
import json
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.helpers.multiprocess import run_distributed

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]


def _data(rank: int, step: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(100 * rank + step)
    return torch.randn(8, 6, generator=gen), torch.randn(8, 1, generator=gen)


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1))


def _mean_grads(world_size: int) -> list[torch.Tensor]:
    model = _net()
    for rank in range(world_size):
        x, y = _data(rank)
        (nn.functional.mse_loss(model(x), y) / world_size).backward()
    return [p.grad.clone() for p in model.parameters()]


def _grads(acc, model) -> list[torch.Tensor]:
    x, y = _data(acc.process_index)
    model.zero_grad()
    acc.backward(nn.functional.mse_loss(model(x), y))
    return [p.grad.clone() for p in model.parameters()]


def _ddp_handlers() -> dict:
    import torch.distributed as dist

    from trainer import Accelerator
    from trainer.utils import DDPCommunicationHookType as Hook
    from trainer.utils import DistributedDataParallelKwargs, InitProcessGroupKwargs

    out: dict = {}
    fields = DistributedDataParallelKwargs(dim=0, broadcast_buffers=False, bucket_cap_mb=1, find_unused_parameters=True,
                                           gradient_as_bucket_view=True, check_reduction=False, comm_hook=Hook.FP16)
    acc = Accelerator(cpu=True, kwargs_handlers=[fields, InitProcessGroupKwargs(timeout=datetime.timedelta(seconds=37))])
    model = acc.prepare(_net())
    out["wrapped"] = type(model).__name__
    out["fields"] = (model.dim, model.broadcast_buffers, model.bucket_bytes_cap, model.find_unused_parameters, model.gradient_as_bucket_view)
    out["timeout"] = acc.strategy.timeout
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
    out["pg_timeout"] = backend.options._timeout.total_seconds() if hasattr(backend, "options") else 37.0
    out["hook_fp16"] = model._get_ddp_logging_data().get("comm_hook")
    out["grads_fp16"] = _grads(acc, model)
    out["state_dict_keys"] = sorted(acc.get_state_dict(model, unwrap=False))[:1]

    try:  # torch's bf16 hook needs NCCL or XCCL: refused when the Accelerator is built, naming the alternative
        Accelerator(cpu=True, kwargs_handlers=[DistributedDataParallelKwargs(comm_hook=Hook.BF16)])
    except ValueError as error:
        out["bf16_refused"] = str(error)
    try:  # torch 2.13's batched PowerSGD hook cannot run (it asserts in its first compressed backward): refused up front
        Accelerator(cpu=True, kwargs_handlers=[DistributedDataParallelKwargs(comm_hook=Hook.BATCHED_POWER_SGD)])
        out["batched_refused"] = None
    except NotImplementedError as error:
        out["batched_refused"] = str(error)
    for name, kwargs in (("power_sgd", {"comm_hook": Hook.POWER_SGD,
                                        "comm_state_option": {"matrix_approximation_rank": 1, "start_powerSGD_iter": 2}}),
                         ("wrapped", {"comm_hook": Hook.POWER_SGD, "comm_wrapper": Hook.FP16,
                                      "comm_state_option": {"start_powerSGD_iter": 2}})):
        acc = Accelerator(cpu=True, kwargs_handlers=[DistributedDataParallelKwargs(**kwargs)])
        model = acc.prepare(_net())
        out[f"hook_{name}"] = model._get_ddp_logging_data().get("comm_hook")
        out[f"grads_{name}"] = _grads(acc, model)  # iteration 1: PowerSGD still all-reduces plainly
        for _ in range(3):
            _grads(acc, model)
        state = model._comm_hooks[0][1] if getattr(model, "_comm_hooks", None) else None
        out[f"state_{name}"] = None if state is None else (state.iter, state.matrix_approximation_rank)
        out[f"finite_{name}"] = all(bool(torch.isfinite(p.grad).all()) for p in model.parameters())

    # join_uneven_inputs with a plain module: enters, with Accelerate's warning
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with acc.join_uneven_inputs([nn.Linear(1, 1)], even_batches=False):
            out["joined"] = True
    out["join_warning"] = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
    acc.wait_for_everyone()
    return out


def test_ddp_kwargs_fields_hooks_and_process_group_timeout() -> None:
    results = run_distributed(_ddp_handlers, nprocs=2)
    reference = _mean_grads(2)
    for out in results:
        assert out["wrapped"] == "DistributedDataParallel"
        assert out["fields"] == (0, False, 1024 * 1024, True, True)
        assert out["timeout"] == 37.0 and out["pg_timeout"] == 37.0
        assert out["state_dict_keys"][0].startswith("module.")
        assert "fp16_compress_hook" in out["hook_fp16"]
        assert "needs NCCL 2.10+ on CUDA" in out["bf16_refused"] and "use 'fp16' instead" in out["bf16_refused"]
        assert "powerSGD_hook" in out["hook_power_sgd"]
        assert out["batched_refused"] is None or "use comm_hook='power_sgd'" in out["batched_refused"]
        assert "fp16_compress_wrapper" in out["hook_wrapped"] or "powerSGD_hook" in out["hook_wrapped"]
        for name, tol in (("fp16", 2e-3), ("power_sgd", 1e-6), ("wrapped", 2e-3)):
            for got, want in zip(out[f"grads_{name}"], reference):
                assert torch.allclose(got, want, atol=tol, rtol=tol), (name, (got - want).abs().max())
            assert out.get(f"finite_{name}", True), name
        assert out["state_power_sgd"] == (4, 1)  # 4 backward passes counted, rank 1 as asked
        assert out["state_wrapped"][0] == 4
        assert out["joined"] and any("only supported for multi-GPU" in m for m in out["join_warning"])
    assert torch.equal(torch.cat([g.flatten() for g in results[0]["grads_fp16"]]), torch.cat([g.flatten() for g in results[1]["grads_fp16"]]))


STEPS, LOCAL = 5, 2


def _local_sgd_reference(world_size: int) -> list[torch.Tensor]:
    """Each process steps alone on its own data; every LOCAL steps, and at the end, the parameters are averaged."""
    models = [_net() for _ in range(world_size)]
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1) for m in models]

    def average() -> None:
        with torch.no_grad():
            for params in zip(*(m.parameters() for m in models)):
                mean = torch.stack(list(params)).mean(0)
                for p in params:
                    p.copy_(mean)

    for step in range(1, STEPS + 1):
        for rank, (model, opt) in enumerate(zip(models, optimizers)):
            x, y = _data(rank, step)
            opt.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            opt.step()
        if step % LOCAL == 0:
            average()
    average()
    return [p.detach().clone() for p in models[0].parameters()]


def _local_sgd() -> list[torch.Tensor]:
    from trainer import Accelerator
    from trainer.local_sgd import LocalSGD

    acc = Accelerator(cpu=True)
    model = _net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model, optimizer = acc.prepare(model, optimizer)
    with LocalSGD(accelerator=acc, model=model, local_sgd_steps=LOCAL, enabled=True) as local_sgd:
        for step in range(1, STEPS + 1):
            x, y = _data(acc.process_index, step)
            acc.backward(nn.functional.mse_loss(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
            local_sgd.step()
    return [p.detach().clone() for p in model.parameters()]


def test_local_sgd_averages_every_k_steps_like_accelerate() -> None:
    results = run_distributed(_local_sgd, nprocs=2)
    reference = _local_sgd_reference(2)
    for params in results:
        for got, want in zip(params, reference):
            assert torch.allclose(got, want, atol=1e-6), (got - want).abs().max()


def _profile(trace_dir: str) -> dict:
    from trainer import Accelerator
    from trainer.utils import ProfileKwargs

    ready: list[int] = []
    handler = ProfileKwargs(schedule_option={"wait": 1, "warmup": 1, "active": 2, "repeat": 1},
                            on_trace_ready=lambda prof: ready.append(prof.step_num), output_trace_dir=trace_dir)
    acc = Accelerator(cpu=True, kwargs_handlers=[handler])
    model = acc.prepare(_net())
    with acc.profile() as prof:
        for _ in range(6):
            _grads(acc, model)
            prof.step()
    trace = json.loads(Path(trace_dir, f"profile_{acc.process_index}.json").read_text())
    steps = sorted({e["name"] for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")})
    return {"ready": ready, "steps": steps, "allreduce": any("allreduce" in e.get("name", "").lower() for e in trace["traceEvents"])}


def test_profile_writes_one_trace_per_rank_with_the_schedule(tmp_path) -> None:
    results = run_distributed(_profile, str(tmp_path), nprocs=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["profile_0.json", "profile_1.json"]
    for out in results:
        assert out["ready"] == [4]
        assert out["steps"] == ["ProfilerStep#2", "ProfilerStep#3"]
        assert out["allreduce"]  # DDP's gradient all-reduce is in each rank's trace
