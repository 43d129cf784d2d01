"""The measured counterpart of an estimate: one real training iteration, set up by the real strategy, under the trackers.

    tally = measure_iteration(model, setup)      # model: real, on the CPU; ddp/fsdp: inside a launched process group

The module is set up exactly as a run sets it up (`SingleDeviceStrategy` / `DDPStrategy` / `FSDPStrategy` on the CPU,
their `Precision`, the repeated blocks checkpointed and, for FSDP, each its own unit), trained one untracked
iteration (so the optimizer holds its state), then one iteration under `torch.distributed._tools`' `MemTracker`
(`FSDPMemTracker` for FSDP): `trainer.planning.trace.tracked_iteration`, the function the estimate runs on fake
tensors. DeepSpeed's engine is not measured here: it allocates its flat partitions outside what the trackers follow.
"""

from __future__ import annotations

import torch
from torch import nn

from strategies.activation_checkpointing import apply_activation_checkpointing
from strategies.base import Strategy
from strategies.blocks import find_blocks
from trainer.planning.layouts import PRECISIONS, Setup, build_optimizer
from trainer.planning.models import compute_loss, make_batch
from trainer.planning.trace import Tally, tracked_iteration


def _strategy(setup: Setup, block_classes: tuple[type[nn.Module], ...], cpu: bool) -> Strategy:
    mode = PRECISIONS[setup.precision]
    if setup.strategy == "single":
        from strategies.single_device import SingleDeviceStrategy  # lazy: only the measured strategy

        return SingleDeviceStrategy(cpu=cpu, precision=mode)
    if setup.strategy == "ddp":
        from strategies.ddp import DDPStrategy  # lazy: only the measured strategy

        return DDPStrategy(cpu=cpu, precision=mode)
    if setup.strategy == "fsdp":
        from strategies.fsdp import FSDPStrategy  # lazy: only the measured strategy

        ac = block_classes if setup.activation_checkpointing else None
        return FSDPStrategy(cpu=cpu, precision=mode, activation_checkpointing_policy=ac)  # sharded as by default
    raise ValueError(
        f"strategy={setup.strategy!r} cannot be measured on the CPU with PyTorch's trackers (DeepSpeed allocates its "
        "partitions outside them); measure 'single', 'ddp' or 'fsdp'"
    )


def _set_up(model: nn.Module, setup: Setup, *, cpu: bool) -> tuple[nn.Module, torch.optim.Optimizer, torch.Tensor]:
    """`model` set up as `setup` says (on the CPU, or on the GPU), trained one untracked iteration."""
    blocks = find_blocks(model)
    strategy = _strategy(setup, blocks.classes, cpu)
    if setup.strategy != "single":
        strategy.setup_environment()
    if setup.activation_checkpointing and setup.strategy != "fsdp":  # FSDPStrategy applies it itself, before sharding
        apply_activation_checkpointing(model, blocks.classes)
    wrapped = strategy.setup_module(model)
    strategy.precision.convert_module(strategy.unwrap_module(wrapped))
    optimizer = build_optimizer(setup.optimizer, wrapped, strategy.device.type)
    batch = make_batch(model, setup.batch_size, setup.shape, strategy.device)
    compute_loss(wrapped, batch).backward()
    optimizer.step()
    optimizer.zero_grad()
    return wrapped, optimizer, batch


def measure_iteration(model: nn.Module, setup: Setup) -> Tally:
    """Set `model` (real, on the CPU; consumed) up as `setup` says, train one iteration, then measure the next."""
    wrapped, optimizer, batch = _set_up(model, setup, cpu=True)
    return tracked_iteration(wrapped, optimizer, batch, sharded=setup.strategy == "fsdp")


def measure_cuda_peak(model: nn.Module, setup: Setup) -> int:
    """On a GPU: ``torch.cuda.max_memory_allocated`` over one iteration after an untracked one (the peak of live
    tensors, which is what the estimate predicts; the caching allocator's reserve is above it)."""
    wrapped, optimizer, batch = _set_up(model, setup, cpu=False)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    compute_loss(wrapped, batch).backward()
    optimizer.step()
    optimizer.zero_grad()
    torch.cuda.synchronize()
    return int(torch.cuda.max_memory_allocated())
