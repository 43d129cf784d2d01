"""Each strategy's memory layout, for the estimate: the module prepared as the strategy prepares it, on fake tensors.

    tally = trace(meta_model, blocks, setup)      # one fake iteration, as `setup.strategy` runs it on one process

* ``single``: the module as it is; mixed precision through the strategy's own `Precision` (autocast).
* ``ddp``: the same, plus DDP's gradient buckets: the reducer keeps one flat buffer per bucket (25 MiB each by
  default) for the whole life of the module, one copy of every gradient in all (none with ``gradient_as_bucket_view``).
* ``fsdp``: the module sharded by `strategies.fsdp.apply_fsdp` itself, over a fake process group of
  ``num_processes``: each repeated block its own unit, then the root, the precision's `MixedPrecisionPolicy`, the
  blocks checkpointed first (as `FSDPStrategy.setup_module` does). The tracker sees the shards, the unsharded units
  and FSDP's all-gather / reduce-scatter buffers of a real run.
* ``deepspeed_stage_2`` / ``deepspeed_stage_3``: DeepSpeed's engine cannot run on fake tensors, so its partitioning is
  modelled on a fake run of the module in the engine's dtype (`_zero_layout`): unsharded (stage 2) or sharded like
  FSDP (stage 3), with DeepSpeed's float32 master partition, optimizer state and gradient partition in place of torch's.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch import nn

from strategies.activation_checkpointing import apply_activation_checkpointing
from strategies.blocks import Blocks
from strategies.fsdp import apply_fsdp
from strategies.precision import DeepSpeedPrecision, FSDPPrecision, Precision
from trainer.planning.models import make_batch
from trainer.planning.trace import Tally, fake_mesh, fake_parameters, prime_optimizer, tracked_iteration

STRATEGIES = ("single", "ddp", "fsdp", "deepspeed_stage_2", "deepspeed_stage_3")
PRECISIONS = {"32-true": "no", "bf16-mixed": "bf16", "bf16-true": "bf16-true"}  # ours -> the strategies' modes
OPTIMIZERS = ("adamw", "sgd")
DEVICES = ("cuda", "cpu")
_STATE_PER_ELEMENT = {"adamw": 2, "sgd": 1}  # AdamW: exp_avg, exp_avg_sq; SGD: the momentum buffer
_REDUCE_BUCKET_ELEMENTS = 500_000_000  # DeepSpeed's default reduce_bucket_size (stage 2's gradient bucket)


@dataclass(frozen=True)
class Setup:
    """One training configuration, per process (``batch_size`` per process; ``shape`` the sample's shape)."""

    strategy: str
    num_processes: int
    precision: str
    optimizer: str
    activation_checkpointing: bool
    batch_size: int
    shape: tuple[int, ...]
    device: str = "cuda"

    @property
    def sharded(self) -> bool:
        """Whether parameters are sharded (a fake process group, FSDP's tracker)."""
        return self.strategy in ("fsdp", "deepspeed_stage_3")


def build_optimizer(name: str, model: nn.Module, device: str) -> torch.optim.Optimizer:
    """AdamW or SGD (momentum 0.9) as torch runs it on `device`: one tensor at a time on CPU, batched (foreach) on GPU."""
    params = [p for p in model.parameters() if p.requires_grad]
    foreach = device == "cuda"
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-4, foreach=foreach)
    return torch.optim.SGD(params, lr=1e-2, momentum=0.9, foreach=foreach)


def precision_for(setup: Setup) -> Precision:
    """The strategy's own `Precision` for this setup (DeepSpeed's refuses the true modes, with its own message)."""
    mode = PRECISIONS[setup.precision]
    if setup.strategy.startswith("deepspeed"):
        return DeepSpeedPrecision(mode)
    return (FSDPPrecision if setup.strategy == "fsdp" else Precision)(mode)


def module_dtype(precision: Precision) -> torch.dtype | None:
    """The dtype the strategy converts the module to before wrapping it: the true modes', DeepSpeed's engine dtype."""
    if isinstance(precision, DeepSpeedPrecision):
        return precision.dtype
    return precision.parameter_dtype


def prepare(model: nn.Module, blocks: Blocks, setup: Setup, mesh: object) -> nn.Module:
    """`model` (on fake tensors, already in `module_dtype`) as the strategy sets it up: checkpointed blocks, shards,
    precision wrapper."""
    precision = precision_for(setup)
    if setup.activation_checkpointing:
        apply_activation_checkpointing(model, blocks.classes)
    if setup.sharded:
        policy = precision.mp_policy() if isinstance(precision, FSDPPrecision) else None
        apply_fsdp(model, mesh, mp_policy=policy)  # FSDPStrategy's default units: the blocks, then the root
    precision.convert_module(model)
    return model


def trace(model: nn.Module, blocks: Blocks, setup: Setup) -> Tally:
    """One fake training iteration of `model` (a meta module, consumed) as `setup` runs it, on one process."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    cpu = torch.device("cpu")
    with contextlib.ExitStack() as stack:
        mesh = stack.enter_context(fake_mesh(setup.num_processes)) if setup.sharded else None
        stack.enter_context(FakeTensorMode())
        model = prepare(fake_parameters(model, cpu, module_dtype(precision_for(setup))), blocks, setup, mesh)
        optimizer = build_optimizer(setup.optimizer, model, setup.device)
        prime_optimizer(model, optimizer)
        batch = make_batch(model, setup.batch_size, setup.shape, cpu)
        tally = tracked_iteration(model, optimizer, batch, sharded=setup.sharded)
        trainable = [(p.numel(), p.element_size()) for p in model.parameters() if p.requires_grad]  # (a DTensor's: whole)
    if setup.strategy == "ddp":
        return _with_buckets(tally, sum(n * size for n, size in trainable))
    if setup.strategy.startswith("deepspeed"):
        return _zero_layout(tally, setup, trainable)
    return tally


def _with_buckets(tally: Tally, bucket_bytes: int) -> Tally:
    """DDP: the reducer's flat gradient buckets, held through every phase (temporaries: communication buffers)."""
    for phase in tally.phases.values():
        phase["temporaries"] += bucket_bytes
    return tally


def _zero_layout(tally: Tally, setup: Setup, trainable: list[tuple[int, int]]) -> Tally:
    """DeepSpeed ZeRO-2/3 on the fake run of the module in the engine's dtype (see the module docstring).

    Each process keeps 1/N of: float32 master weights, float32 optimizer state, float32 gradients (the averaged
    partition). Stage 2 also allocates one gradient bucket of ``reduce_bucket_size`` elements in the engine's dtype at
    backward (``contiguous_gradients``; ``setup_buckets`` in DeepSpeed's ``stage_1_and_2.py`` makes it that size
    whatever the model's: 2 GB in float32 for a model of a few million parameters, measured with `MemTracker` on a
    one-process ZeRO-2 run of a 3.6M-parameter Llama); stage 3's gathered parameters are those of the FSDP-like fake run.
    """
    n = setup.num_processes
    elements = sum(count for count, _ in trainable)
    engine_bytes = max((size for _, size in trainable), default=4)
    optimizer = (4 + 4 * _STATE_PER_ELEMENT[setup.optimizer]) * elements // n
    gradients = 4 * elements // n
    bucket = 0 if setup.sharded else _REDUCE_BUCKET_ELEMENTS * engine_bytes
    for name, phase in tally.phases.items():
        phase["optimizer"] = optimizer
        phase["gradients"] = gradients
        if name == "backward":
            phase["temporaries"] += bucket
    tally.optimizer, tally.gradients = optimizer, gradients
    return tally
