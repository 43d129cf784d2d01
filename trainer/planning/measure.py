"""The measured counterpart of an estimate: one real training iteration, set up by the real strategy, under the trackers.

    tally = measure_iteration(model, setup)      # model: real, on the CPU; ddp/fsdp: inside a launched process group

The module is set up exactly as a run sets it up (`SingleDeviceStrategy` / `DDPStrategy` / `FSDPStrategy` on the CPU,
their `Precision`, the repeated blocks checkpointed and, for FSDP, each its own unit), trained one untracked
iteration (so the optimizer holds its state), then one iteration under `torch.distributed._tools`' `MemTracker`
(`FSDPMemTracker` for FSDP): `trainer.planning.trace.tracked_iteration`, the function the estimate runs on fake
tensors. DeepSpeed's engine (`measure_zero`) builds its flat partitions inside ``deepspeed.initialize``, so there the
tracker is entered before the engine is built and follows every allocation of the engine's life.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from strategies.activation_checkpointing import apply_activation_checkpointing
from strategies.base import Strategy
from strategies.blocks import find_blocks
from trainer.planning.layouts import PRECISIONS, Setup, build_optimizer
from trainer.planning.models import compute_loss, make_batch
from trainer.planning.trace import Tally, iterate, memory_tracker, tracked_iteration

if TYPE_CHECKING:
    from torch.distributed._tools.mem_tracker import MemTracker


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
    if setup.strategy.startswith("deepspeed"):
        from strategies.deepspeed import DeepSpeedStrategy  # lazy: only the measured strategy

        return DeepSpeedStrategy(cpu=cpu, zero_stage=int(setup.strategy[-1]), precision=mode)
    raise ValueError(f"strategy={setup.strategy!r} is not one of single, ddp, fsdp, deepspeed_stage_2, deepspeed_stage_3")


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
    if setup.strategy.startswith("deepspeed"):
        return measure_zero(model, setup)
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


def measure_zero(model: nn.Module, setup: Setup) -> Tally:
    """DeepSpeed ZeRO-2/3 (inside a launched process group): `MemTracker` entered before ``deepspeed.initialize``, so
    it follows the engine's flat partitions, buckets and gathered parameters from their allocation; one iteration
    (the engine's backward and step), then the next measured.

    The tracker names what it allocates by when: a tensor made while the engine is built is an "activation" to it.
    So before the measured iteration, and again after its step, what the engine holds is named (`_name_zero_state`):
    the module's parameters (ZeRO-3: their partitions) as parameters, the float32 master partitions and the optimizer's
    states as optimizer state (the estimate's categories).
    """
    blocks = find_blocks(model)
    strategy = _strategy(setup, blocks.classes, cpu=True)
    strategy.setup_environment()
    if setup.activation_checkpointing:
        apply_activation_checkpointing(model, blocks.classes)
    tracker = memory_tracker()
    with tracker:
        optimizer = build_optimizer(setup.optimizer, model, "cpu")
        engine: Any = strategy.setup_module_and_optimizers(model, [optimizer], batch_size=setup.batch_size)[0]
        strategy.precision.convert_module(strategy.unwrap_module(engine))
        batch = make_batch(model, setup.batch_size, setup.shape, strategy.device)

        def step() -> None:
            engine.step()
            _name_zero_state(tracker, engine)

        engine.backward(compute_loss(engine, batch))
        step()
        tracker.reset_mod_stats()  # (its per-module statistics allow one iteration)
        return iterate(tracker, lambda: compute_loss(engine, batch), engine.backward, step)


def _name_zero_state(tracker: MemTracker, engine: Any) -> None:
    """Name what a ZeRO engine holds in the tracker's categories: parameters, and optimizer state (see `measure_zero`)."""
    from torch.distributed._tools.mem_tracker import _MemRefType

    zero = engine.optimizer
    tracker.track_external(engine.module, zero.optimizer)  # the parameters (ZeRO-2: the flat buffer), the states
    for param in engine.module.parameters():
        if hasattr(param, "ds_tensor"):  # ZeRO-3: this process's partition
            tracker._update_and_maybe_create_winfos(param.ds_tensor, _MemRefType.PARAM)
    masters = getattr(zero, "single_partition_of_fp32_groups", None) or getattr(zero, "fp32_partitioned_groups_flat", [])
    for master in masters:
        tracker._update_and_maybe_create_winfos(master, _MemRefType.OPT)
