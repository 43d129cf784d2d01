"""Each strategy's memory layout, for the estimate: the module prepared as the strategy prepares it, on fake tensors.

    tally = trace(meta_model, blocks, setup)      # one fake iteration, as `setup.strategy` runs it on one process

* ``single``: the module as it is; mixed precision through the strategy's own `Precision` (autocast).
* ``ddp``: the same, plus DDP's gradient buckets: the reducer keeps one flat buffer per bucket (25 MiB each by
  default) for the whole life of the module, one copy of every gradient in all (none with ``gradient_as_bucket_view``).
* ``fsdp``: the module sharded by `strategies.fsdp.apply_fsdp` itself, over a fake process group of
  ``num_processes``: each repeated block its own unit, then the root, the precision's `MixedPrecisionPolicy`, the
  blocks checkpointed first (as `FSDPStrategy.setup_module` does). The tracker sees the shards, the unsharded units
  and FSDP's all-gather / reduce-scatter buffers of a real run.
* ``deepspeed_stage_2`` / ``deepspeed_stage_3``: the module as it is, in the engine's dtype, through the strategy's
  `DeepSpeedPrecision`: the compute of the iteration. DeepSpeed's engine cannot run on fake tensors, so its
  partitions and buffers are counted around that run for the whole model (`trainer.planning.zero`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from strategies.activation_checkpointing import apply_activation_checkpointing
from strategies.blocks import Blocks
from strategies.fsdp import apply_fsdp
from strategies.precision import DeepSpeedPrecision, FSDPPrecision, Precision
from trainer.planning.models import make_batch, stage_loss
from trainer.planning.optimizers import OptimizerSpec, resolve_optimizer
from trainer.planning.trace import Tally, fake_mesh, fake_parameters, prime_optimizer, scalar_reads_as_one, tracked_iteration

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

STRATEGIES = ("single", "ddp", "fsdp", "deepspeed_stage_2", "deepspeed_stage_3")
PRECISIONS = {"32-true": "no", "bf16-mixed": "bf16", "bf16-true": "bf16-true"}  # ours -> the strategies' modes
DEVICES = ("cuda", "cpu")


@dataclass(frozen=True)
class Setup:
    """One training configuration, per process (``batch_size`` per process; ``shape`` the sample's shape).

    ``optimizer`` is an `OptimizerSpec`; anything `resolve_optimizer` takes (``"adamw"``, ``"torch.optim.SGD"``, a class,
    ``functools.partial(SGD, momentum=0.9)``) is resolved to one.
    """

    strategy: str
    num_processes: int
    precision: str
    optimizer: OptimizerSpec
    activation_checkpointing: bool
    batch_size: int
    shape: tuple[int, ...]
    device: str = "cuda"

    def __post_init__(self) -> None:
        optimizer: Any = self.optimizer
        if not isinstance(optimizer, OptimizerSpec):
            object.__setattr__(self, "optimizer", resolve_optimizer(optimizer))

    @property
    def sharded(self) -> bool:
        """Whether parameters are sharded (gathered for each forward and backward)."""
        return self.strategy in ("fsdp", "deepspeed_stage_3")


def build_optimizer(optimizer: OptimizerSpec, model: nn.Module, device: str) -> torch.optim.Optimizer:
    """`optimizer` over the trainable parameters as torch runs it on `device`: where torch chooses, one tensor at a time
    on CPU, batched (foreach) on GPU."""
    return optimizer.build((p for p in model.parameters() if p.requires_grad), device)


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


def prepare(model: nn.Module, blocks: Blocks, setup: Setup, mesh: DeviceMesh | None) -> nn.Module:
    """`model` (on fake tensors, already in `module_dtype`) as the strategy sets it up: checkpointed blocks, shards,
    precision wrapper."""
    precision = precision_for(setup)
    if setup.activation_checkpointing:
        apply_activation_checkpointing(model, blocks.classes)
    if setup.strategy == "fsdp":
        policy = precision.mp_policy() if isinstance(precision, FSDPPrecision) else None
        apply_fsdp(model, mesh, mp_policy=policy)  # FSDPStrategy's default units: the blocks, then the root
    precision.convert_module(model)
    return model


def trace(model: nn.Module, blocks: Blocks, setup: Setup, *, stage_input: tuple[tuple[int, ...], torch.dtype, bool] | None = None) -> Tally:
    """One fake training iteration of `model` (a meta module, consumed) as `setup` runs it, on one process.

    `stage_input`: the shape, dtype and ``requires_grad`` of a pipeline stage's input (`trainer.planning.stages`),
    instead of the batch; the stage backpropagates the mean of its output."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    cpu = torch.device("cpu")
    with contextlib.ExitStack() as stack:
        fsdp = setup.strategy == "fsdp"
        mesh = stack.enter_context(fake_mesh(setup.num_processes)) if fsdp else None
        stack.enter_context(FakeTensorMode())
        stack.enter_context(scalar_reads_as_one())
        model = prepare(fake_parameters(model, cpu, module_dtype(precision_for(setup))), blocks, setup, mesh)
        optimizer = build_optimizer(setup.optimizer, model, setup.device)
        prime_optimizer(model, optimizer)
        if stage_input is None:
            batch = make_batch(model, setup.batch_size, setup.shape, cpu)
            tally = tracked_iteration(model, optimizer, batch, sharded=fsdp)
        else:
            batch = torch.empty(stage_input[0], dtype=stage_input[1], device=cpu, requires_grad=stage_input[2])
            tally = tracked_iteration(model, optimizer, batch, sharded=fsdp, loss_fn=stage_loss)
        trainable = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
    return _with_buckets(tally, trainable) if setup.strategy == "ddp" else tally


def _with_buckets(tally: Tally, bucket_bytes: int) -> Tally:
    """DDP: the reducer's flat gradient buckets, held through every phase (temporaries: communication buffers)."""
    for phase in tally.phases.values():
        phase["temporaries"] += bucket_bytes
    return tally
