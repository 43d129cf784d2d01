"""Accelerate's kwargs handlers and the `Accelerator` methods around them, on one process: each setting is honoured
or refused with the reason (the 2-process DDP side is tests/distributed/test_accelerate_kwargs_ddp.py)."""

from __future__ import annotations

import datetime
import json
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from trainer import Accelerator
from trainer.utils import (
    AutocastKwargs,
    DDPCommunicationHookType,
    DistributedDataParallelKwargs,
    DummyOptim,
    DummyScheduler,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    ProfileKwargs,
    TERecipeKwargs,
    release_memory,
)


class Probe(nn.Module):
    """Records whether autocast was on in its forward."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 2)
        self.autocast_on: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.autocast_on.append(torch.is_autocast_enabled("cpu"))
        return self.linear(x)


def test_unknown_and_repeated_handlers_are_refused() -> None:
    with pytest.raises(TypeError, match="not a handler this Accelerator knows"):
        Accelerator(cpu=True, kwargs_handlers=[{"find_unused_parameters": True}])
    with pytest.raises(ValueError, match="two GradScalerKwargs"):
        Accelerator(cpu=True, mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(), GradScalerKwargs()])


def test_handlers_are_the_accelerators_public_attributes() -> None:
    autocast, profile = AutocastKwargs(cache_enabled=False), ProfileKwargs()
    acc = Accelerator(cpu=True, mixed_precision="bf16", kwargs_handlers=[autocast, profile])
    assert acc.autocast_handler is autocast and acc.profile_handler is profile
    assert acc.ddp_handler is None and acc.scaler_handler is None and acc.init_handler is None
    assert acc.fp8_recipe_handler is None and acc.te_recipe_handler is None
    assert acc.state.deepspeed_plugin is None and acc.deepspeed_plugin is None


def test_grad_scaler_kwargs_build_the_fp16_scaler() -> None:
    acc = Accelerator(cpu=True, mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=1024.0, growth_interval=3, backoff_factor=0.25)])
    assert acc.scaler is not None and acc.scaler.get_scale() == 1024.0
    assert acc.scaler.get_growth_interval() == 3 and acc.scaler.get_backoff_factor() == 0.25
    with pytest.raises(ValueError, match="need mixed_precision='fp16'"):
        Accelerator(cpu=True, mixed_precision="bf16", kwargs_handlers=[GradScalerKwargs(init_scale=2.0)])
    Accelerator(cpu=True, mixed_precision="bf16", kwargs_handlers=[GradScalerKwargs()])  # defaults: nothing to apply, as Accelerate
    with pytest.warns(UserWarning, match="changes nothing with mixed_precision='no'"):
        Accelerator(cpu=True, kwargs_handlers=[GradScalerKwargs(init_scale=2.0)])


def test_autocast_kwargs_reach_the_model_forward_and_the_autocast_block() -> None:
    acc = Accelerator(cpu=True, mixed_precision="bf16", kwargs_handlers=[AutocastKwargs(enabled=False)])
    model = acc.prepare(Probe())
    out = model(torch.randn(3, 4))
    assert model.autocast_on == [False] and out.dtype == torch.float32
    with acc.autocast():
        assert not torch.is_autocast_enabled("cpu")
    with acc.autocast(autocast_handler=AutocastKwargs(enabled=True)):
        assert torch.is_autocast_enabled("cpu")

    acc = Accelerator(cpu=True, mixed_precision="bf16")
    model = acc.prepare(Probe())
    with acc.autocast():
        assert torch.is_autocast_enabled("cpu")
        with acc.autocast(autocast_handler=AutocastKwargs(enabled=False)):  # a float32 region inside the mixed step
            assert not torch.is_autocast_enabled("cpu")
            assert (torch.randn(2, 2) @ torch.randn(2, 2)).dtype == torch.float32
    with pytest.raises(TypeError, match="must be an AutocastKwargs"):
        acc.autocast(autocast_handler={"enabled": False})  # type: ignore[arg-type]


def test_autocast_kwargs_cannot_reach_a_precision_without_autocast() -> None:
    with pytest.raises(ValueError, match="runs none"):
        Accelerator(cpu=True, mixed_precision="bf16-true", kwargs_handlers=[AutocastKwargs(cache_enabled=False)])


def test_init_process_group_kwargs() -> None:
    from trainer.accelerator.kwargs import KwargsHandlers

    handlers = KwargsHandlers.sort([InitProcessGroupKwargs(timeout=datetime.timedelta(seconds=42))])
    assert handlers.timeout(None) == 42.0 and handlers.backend() is None
    with pytest.raises(ValueError, match="disagree"):
        handlers.timeout(10)
    assert KwargsHandlers.sort([InitProcessGroupKwargs()]).timeout(None) is None  # defaults pass nothing on, as Accelerate
    assert KwargsHandlers.sort([InitProcessGroupKwargs(backend="gloo")]).backend() == "gloo"
    with pytest.raises(ValueError, match=r"init_method='tcp://x:1'\) is not supported"):
        InitProcessGroupKwargs(init_method="tcp://x:1")
    InitProcessGroupKwargs(init_method="env://")  # what is used anyway
    acc = Accelerator(cpu=True, kwargs_handlers=[InitProcessGroupKwargs(timeout=datetime.timedelta(seconds=42))])
    assert acc.init_handler is not None
    with pytest.raises(ValueError, match="needs a multi-process strategy"):
        Accelerator(cpu=True, kwargs_handlers=[InitProcessGroupKwargs(backend="gloo")])


def test_ddp_kwargs_are_checked_and_warn_without_ddp() -> None:
    with pytest.raises(ValueError, match="comm_state_option"):
        DistributedDataParallelKwargs(comm_state_option={"matrix_approximation_rank": 2})
    with pytest.raises(ValueError, match="comm_wrapper='fp16' wraps a communication hook"):
        DistributedDataParallelKwargs(comm_wrapper=DDPCommunicationHookType.FP16)
    with pytest.raises(ValueError, match="comm_hook='fp32'"):
        DistributedDataParallelKwargs(comm_hook="fp32")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="fields of DistributedDataParallelKwargs"):
        DistributedDataParallelKwargs(extra={"static_graph": True})
    kwargs = DistributedDataParallelKwargs(comm_hook="power_sgd", comm_state_option={"matrix_approximation_rank": 2})  # type: ignore[arg-type]
    assert kwargs.comm_hook is DDPCommunicationHookType.POWER_SGD and str(kwargs.comm_hook) == "power_sgd"
    assert DistributedDataParallelKwargs(bucket_cap_mb=10).to_kwargs() == {"bucket_cap_mb": 10}  # Accelerate's to_kwargs
    with pytest.warns(UserWarning, match="no DistributedDataParallel model"):
        Accelerator(cpu=True, kwargs_handlers=[DistributedDataParallelKwargs(find_unused_parameters=True)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        Accelerator(cpu=True, kwargs_handlers=[DistributedDataParallelKwargs()])  # defaults: nothing to say


def test_fp8_is_refused_naming_the_gpu_requirement() -> None:
    with pytest.raises(ValueError, match=r"mixed_precision='fp8': FP8 training needs an NVIDIA GPU of compute capability 8\.9"):
        Accelerator(cpu=True, mixed_precision="fp8")
    with pytest.raises(ValueError, match=r"TERecipeKwargs\(\.\.\.\)\] \(an FP8 recipe\): FP8 training needs"):
        Accelerator(cpu=True, kwargs_handlers=[TERecipeKwargs(fp8_format="HYBRID")])


def test_profile_honours_the_schedule_and_writes_a_trace(tmp_path) -> None:
    ready: list[int] = []
    handler = ProfileKwargs(schedule_option={"wait": 1, "warmup": 1, "active": 2, "repeat": 1}, record_shapes=True,
                            on_trace_ready=lambda prof: ready.append(prof.step_num), output_trace_dir=str(tmp_path / "traces"))
    acc = Accelerator(cpu=True, kwargs_handlers=[handler])
    model = nn.Linear(8, 8)
    with acc.profile() as prof:
        for _ in range(6):
            model(torch.randn(4, 8)).sum().backward()
            prof.step()
    assert ready == [4]  # one active window (steps 2 and 3) ended, after the 4th step() call
    trace = json.loads((tmp_path / "traces" / "profile_0.json").read_text())
    steps = sorted({e["name"] for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep#")})
    assert steps == ["ProfilerStep#2", "ProfilerStep#3"]
    with acc.profile(ProfileKwargs(activities=["cpu"])) as prof:  # a handler for this block only, no schedule
        model(torch.randn(2, 8))
    assert any("addmm" in e.key for e in prof.key_averages())
    with pytest.raises(ValueError, match="unknown keys"):
        ProfileKwargs(schedule_option={"wiat": 1})


def test_unwrap_model_keep_torch_compile_and_get_state_dict_unwrap() -> None:
    acc = Accelerator(cpu=True)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    model = acc.prepare(torch.compile(net, backend="eager"))
    x = torch.randn(3, 4)
    compiled = acc.unwrap_model(model)
    assert getattr(compiled.forward, "_trainwright_compiled", False)
    eager = acc.unwrap_model(model, keep_torch_compile=False)
    assert "forward" not in eager.__dict__ and eager is not compiled
    assert all(a is b for a, b in zip(eager.parameters(), compiled.parameters()))
    assert torch.equal(eager(x), compiled(x))
    assert getattr(acc.unwrap_model(model).forward, "_trainwright_compiled", False)  # the prepared model stays compiled
    assert list(acc.get_state_dict(model, unwrap=False)) == list(net.state_dict())

    acc = Accelerator(cpu=True, mixed_precision="bf16")
    model = acc.prepare(Probe())
    plain = acc.unwrap_model(model, keep_fp32_wrapper=False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert model(torch.randn(1, 4)).dtype == torch.float32  # the fp32 wrapper converts outputs
        assert plain(torch.randn(1, 4)).dtype == torch.bfloat16


def test_release_memory_and_skip_first_batches_as_functions() -> None:
    a, b = torch.ones(10), torch.ones(10)
    a, b = release_memory(a, b)
    assert a is None and b is None
    from trainer import skip_first_batches
    from trainer.data_loader import skip_first_batches as same

    assert skip_first_batches is same
    acc = Accelerator(cpu=True)
    loader = acc.prepare(DataLoader(torch.arange(10), batch_size=2))
    assert [batch.tolist() for batch in skip_first_batches(loader, 3)] == [[6, 7], [8, 9]]


def test_dummies_need_deepspeed() -> None:
    acc = Accelerator(cpu=True)
    model = nn.Linear(2, 2)
    optimizer = DummyOptim(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="stand for the optimizer and schedule of a DeepSpeed config"):
        acc.prepare(model, optimizer, DummyScheduler(optimizer))


def test_local_sgd_does_nothing_on_one_process() -> None:
    from trainer.local_sgd import LocalSGD

    acc = Accelerator(cpu=True)
    model = acc.prepare(nn.Linear(2, 2))
    with LocalSGD(accelerator=acc, model=model, local_sgd_steps=2) as local_sgd:
        local_sgd.step()
        assert not local_sgd.enabled and local_sgd.num_steps == 1
    with pytest.raises(ValueError, match="local_sgd_steps=0"):
        LocalSGD(accelerator=acc, model=model, local_sgd_steps=0)
