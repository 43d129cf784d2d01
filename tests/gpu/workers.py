"""What each process of a multi-process GPU check runs (module-level, so the fork server can import it).

Every function takes ``cpu``: True runs the same logic on CPU with gloo (``TRAINWRIGHT_GPU_TESTS_ON_CPU=1``).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

GLOBAL_BATCH = 16
SAMPLES = 64


def data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, 16, generator=g)
    return x, x @ torch.randn(16, 1, generator=g) + 0.1 * torch.randn(SAMPLES, 1, generator=g)


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.lin(x))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(16, 32)
        self.blocks = nn.Sequential(Block(32), Block(32))
        self.head = nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.inp(x)))


def net() -> Net:
    torch.manual_seed(0)
    return Net()


def reference(lr: float = 0.05) -> tuple[dict[str, torch.Tensor], list[float]]:
    """One process on CPU in fp32, full global batches, SGD: what every data-parallel run must reproduce."""
    x, y = data()
    model = net()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for i in range(0, SAMPLES, GLOBAL_BATCH):
        loss = nn.functional.mse_loss(model(x[i : i + GLOBAL_BATCH]), y[i : i + GLOBAL_BATCH])
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, losses


def _train(acc: Any, model: nn.Module, opt: torch.optim.Optimizer, hook_on: nn.Module | None = None) -> dict[str, Any]:
    x, y = data()
    loader = DataLoader(TensorDataset(x, y), batch_size=GLOBAL_BATCH // acc.num_processes)
    model, opt, loader = acc.prepare(model, opt, loader)
    seen: list[torch.dtype] = []
    handle = hook_on.register_forward_hook(lambda m, i, o: seen.append(o.dtype)) if hook_on is not None else None
    losses, batch_devices = [], set()
    for xb, yb in loader:
        batch_devices.add(xb.device.type)
        loss = nn.functional.mse_loss(model(xb).float(), yb)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(float(acc.reduce(loss.detach(), "mean")))
    if handle is not None:
        handle.remove()
    import torch.distributed as dist

    out = {"backend": dist.get_backend(), "device": str(acc.device), "batch_devices": sorted(batch_devices), "losses": losses,
           "param_devices": sorted({p.device.type for p in model.parameters()}), "compute_dtypes": sorted({str(d) for d in seen}),
           "shard_dtypes": sorted({str(getattr(p, "to_local", lambda p=p: p)().dtype) for p in model.parameters()}),
           "grad_free": all(p.grad is None for p in model.parameters())}
    state = acc.get_state_dict(model)
    out["state"] = {k: v.detach().float().cpu().clone() for k, v in state.items()}
    acc.end_training()
    return out


def ddp(cpu: bool) -> dict[str, Any]:
    from trainer import Accelerator

    acc = Accelerator(cpu=cpu, strategy="ddp")
    model = net()
    return _train(acc, model, torch.optim.SGD(model.parameters(), lr=0.05))


def fsdp_mixed(cpu: bool) -> dict[str, Any]:
    """FSDP2 with MixedPrecisionPolicy(param bf16, reduce fp32): fp32 shards, bf16 compute."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from strategies import FSDPStrategy
    from trainer import Accelerator

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    acc = Accelerator(strategy=FSDPStrategy(cpu=cpu, wrap_classes=[Block], mixed_precision_policy=policy))
    model = net()
    head = model.head
    return _train(acc, model, torch.optim.SGD(model.parameters(), lr=0.05), hook_on=head)


def deepspeed_zero(cpu: bool, stage: int) -> dict[str, Any]:
    from strategies import DeepSpeedStrategy
    from trainer import Accelerator

    acc = Accelerator(strategy=DeepSpeedStrategy(cpu=cpu, zero_stage=stage))
    model = net()
    return _train(acc, model, torch.optim.SGD(model.parameters(), lr=0.05))


def gather(cpu: bool) -> dict[str, Any]:
    """13 samples, batches of 4 per process: gather_for_metrics returns each sample exactly once, on the device."""
    from trainer import Accelerator

    acc = Accelerator(cpu=cpu)
    loader = acc.prepare(DataLoader(TensorDataset(torch.arange(13, dtype=torch.float32)), batch_size=4))
    seen, devices = [], set()
    for (batch,) in loader:
        gathered = acc.gather_for_metrics(batch)
        devices.add(gathered.device.type)
        seen += gathered.cpu().tolist()
    objects = acc.gather_for_metrics([f"rank{acc.process_index}"], use_gather_object=True)
    acc.end_training()
    return {"seen": seen, "devices": sorted(devices), "objects": objects, "device": str(acc.device)}


# ------------------------------------------------------------------------------------------- peak memory per strategy
LLAMA_STEPS = 4


def llama(cpu: bool) -> nn.Module:
    import transformers

    small = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    large = dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=4)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**(small if cpu else large)))


def peak_memory(cpu: bool, name: str) -> dict[str, Any]:
    """Train a locally built Llama a few steps under strategy `name`; the peak device memory of the steps after the first."""
    from strategies import DeepSpeedStrategy, FSDPStrategy
    from trainer import Accelerator

    builders = {
        "single device, fp32": lambda: Accelerator(cpu=cpu),
        "single device, bf16 autocast": lambda: Accelerator(cpu=cpu, mixed_precision="bf16"),
        "DDP, bf16 autocast": lambda: Accelerator(cpu=cpu, strategy="ddp", mixed_precision="bf16"),
        "FSDP2, bf16 params / fp32 reduce": lambda: Accelerator(strategy=FSDPStrategy(
            cpu=cpu, wrap_classes=["LlamaDecoderLayer"], mixed_precision_policy=_policy())),
        "DeepSpeed ZeRO-2, bf16": lambda: Accelerator(strategy=DeepSpeedStrategy(cpu=cpu, zero_stage=2, precision="bf16")),
        "DeepSpeed ZeRO-3, bf16": lambda: Accelerator(strategy=DeepSpeedStrategy(cpu=cpu, zero_stage=3, precision="bf16")),
    }
    acc = builders[name]()
    model = llama(cpu)
    params = sum(p.numel() for p in model.parameters())
    dtypes: set[str] = set()
    model.lm_head.register_forward_hook(lambda m, i, o: dtypes.add(str(o.dtype).replace("torch.", "")))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model, opt = acc.prepare(model, opt)
    vocab, seq, batch = (128, 32, 2) if cpu else (32000, 1024, 4)
    g = torch.Generator().manual_seed(acc.process_index)
    tokens = torch.randint(0, vocab, (LLAMA_STEPS, batch, seq), generator=g)
    losses, peak = [], math.nan
    for step in range(LLAMA_STEPS):
        if step == 1 and not cpu:  # after the first step made the optimizer states
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        ids = tokens[step].to(acc.device)
        loss = model(input_ids=ids, labels=ids).loss
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    if not cpu:
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() / 2**20
    world = acc.num_processes
    acc.end_training()
    return {"peak_mib": peak, "losses": losses, "params": params, "world": world, "compute": sorted(dtypes)}


def _policy() -> Any:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
