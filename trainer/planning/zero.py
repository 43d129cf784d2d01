"""DeepSpeed ZeRO-2/3's memory per process: what the engine allocates, around a fake run of the module.

    tally = zero_layout(compute, setup, meta_model)    # compute: the module's fake iteration, unsharded, engine dtype

DeepSpeed's engine cannot run on fake tensors, so its buffers are counted from what it allocates (DeepSpeed 0.19:
``runtime/zero/stage_1_and_2.py``, ``stage3.py``, ``partitioned_param_coordinator.py``), with the ZeRO section
`DeepSpeedStrategy` passes for this model (`zero_section`) and DeepSpeed's defaults for what it leaves out
(`ZERO_DEFAULTS`). The forward and backward compute (activations, their gradients, casts) is the fake run's; its
parameter gradients are not counted, because the engine moves each into its bucket as it is made. Per process, with
E trainable elements, N processes, P = E/N (stage 3: each parameter's share, rounded up) and b bytes per element
in the engine's dtype (4, or 2 with ``bf16-mixed``):

* held for the whole run: the parameters (stage 2: all of them, one flat buffer; stage 3: a partition of each, and
  whole the parameters of at most ``stage3_param_persistence_threshold`` elements, which are never partitioned),
  the float32 master partition (4P), the optimizer's state over it; stage 3 also its gradient bucket
  (``reduce_bucket_size`` × b) and its gradient partition (Pb).
* forward: stage 3 gathers the partitioned parameters and keeps them until backward frees them, up to
  ``stage3_max_live_parameters`` elements, through a flat all-gather buffer of up to ``stage3_prefetch_bucket_size``.
* backward: stage 2 allocates its gradient bucket (``reduce_bucket_size`` × b); when it is reduced, the engine
  flattens what it holds (stage 2: one copy; stage 3: two, for the reduce-scatter).
* step: the float32 gradient of the partition (4P; stage 2 first flattens its gradient partition, Pb, beside the
  bucket's copy of it), and the optimizer's own temporaries over the flat partition, from a fake step of the same
  torch optimizer on a tensor of P elements. Stage 3 partitions its persistent parameters for the step.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from trainer.planning.layouts import PRECISIONS, Setup, build_optimizer
from trainer.planning.optimizers import OptimizerSpec
from trainer.planning.trace import Tally, memory_tracker, prime_optimizer, scalar_reads_as_one

# DeepSpeed's defaults for the ZeRO settings that size its buffers, where `DeepSpeedStrategy` passes none
# (deepspeed.runtime.zero.config.DeepSpeedZeroConfig; tests/unit/test_memory_estimate.py compares them)
ZERO_DEFAULTS = {
    "stage3_param_persistence_threshold": 100_000,
    "stage3_max_live_parameters": 1_000_000_000,
    "stage3_prefetch_bucket_size": 50_000_000,
}


def zero_section(setup: Setup, model: nn.Module) -> dict[str, Any]:
    """The ``zero_optimization`` section `DeepSpeedStrategy` passes to ``deepspeed.initialize`` for `model` in this
    setup (its default strategy: no config of the user's), DeepSpeed's defaults filled in."""
    from strategies.deepspeed import DeepSpeedStrategy  # lazy: only DeepSpeed estimates

    strategy = DeepSpeedStrategy(cpu=True, zero_stage=int(setup.strategy[-1]), precision=PRECISIONS[setup.precision])
    return {**ZERO_DEFAULTS, **strategy.engine_config(setup.batch_size, model)["zero_optimization"]}


def zero_layout(compute: Tally, setup: Setup, model: nn.Module) -> Tally:
    """The iteration of `model` (a meta module, its whole size) under ZeRO: `compute` is the fake run of the module,
    unsharded, in the engine's dtype (see the module docstring)."""
    zero = zero_section(setup, model)
    stage3 = zero["stage"] == 3
    n = setup.num_processes
    b = 2 if setup.precision == "bf16-mixed" else 4
    sizes = [p.numel() for p in model.parameters() if p.requires_grad]
    elements = sum(sizes)
    persistent = sum(s for s in sizes if s <= zero["stage3_param_persistence_threshold"]) if stage3 else 0
    partition = sum(math.ceil(s / n) for s in sizes) if stage3 else math.ceil(elements / n)
    bucket = zero["reduce_bucket_size"] * b
    filled = min(elements, zero["reduce_bucket_size"]) * b  # what one reduction flattens
    state, step_scratch = flat_optimizer(setup.optimizer, partition, setup.device)
    buffers = compute.parameters - elements * b  # the module's buffers (stay whole)

    parameters = (partition + persistent) * b + buffers if stage3 else compute.parameters
    optimizer = 4 * partition + state
    gradients = partition * b  # stage 2: its gradient partition after backward; stage 3: its partition buffer, held
    held = {"gradients": gradients, "temporaries": bucket} if stage3 else {"gradients": 0, "temporaries": 0}

    def at(extra: int, phase: str | None = None, grads: int = 0) -> dict[str, int]:
        """Every category at a moment: what is held, `extra` temporaries, the fake run's compute in `phase`."""
        work = compute.phases[phase] if phase else dict.fromkeys(("activations", "temporaries"), 0)
        return {"parameters": parameters, "gradients": held["gradients"] + grads, "optimizer": optimizer,
                "activations": work["activations"], "temporaries": held["temporaries"] + work["temporaries"] + extra}

    if stage3:
        live = elements - persistent
        gathered = min(live, zero["stage3_max_live_parameters"]) * b
        fetch = min(live, zero["stage3_prefetch_bucket_size"]) * b
        forward = at(gathered + fetch, "forward")
        backward = [at(gathered, "backward"), at(2 * filled)]
        flat_grads = 0
    else:
        forward = at(0, "forward")
        backward = [at(bucket, "backward"), at(bucket + filled)]
        flat_grads = 2 * partition * b + (0 if b == 4 else 4 * partition)  # its partition, flattened, then in float32
    step = at(max(flat_grads, 4 * partition + step_scratch) - 4 * partition, grads=4 * partition)
    if stage3:  # the step partitions every parameter, the persistent ones too, and gathers those again after it
        step["parameters"] -= persistent * b
    return Tally(parameters=parameters, gradients=gradients, optimizer=optimizer, activations=compute.activations,
                 phases={"forward": forward, "backward": max(backward, key=lambda d: sum(d.values())), "step": step})


def flat_optimizer(optimizer_spec: OptimizerSpec, elements: int, device: str) -> tuple[int, int]:
    """The state bytes and the step's peak temporaries of `optimizer_spec` (as `build_optimizer` makes it) over one
    float32 tensor of `elements`: ZeRO steps the torch optimizer on its flat partition. A fake step: nothing is
    allocated."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(), scalar_reads_as_one():
        flat = nn.ParameterList([nn.Parameter(torch.empty(elements))])
        optimizer = build_optimizer(optimizer_spec, flat, device)
        prime_optimizer(flat, optimizer)
        tracker = memory_tracker()
        tracker.track_external(flat, optimizer)
        flat[0].grad = torch.zeros_like(flat[0])
        with tracker:
            before = _total(tracker.get_tracker_snapshot("current"))
            optimizer.step()
            peak = _total(tracker.get_tracker_snapshot("peak"))
        state = sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values() if isinstance(t, torch.Tensor))
    return state, peak - before


def _total(snapshot: dict[Any, dict[Any, int]]) -> int:
    return sum(per_device["Total"] for per_device in snapshot.values())
