"""How much memory one training iteration needs, per process, before anything is allocated.

    from trainer.utils import estimate_memory

    est = estimate_memory("./llama-70b", strategy="fsdp", num_processes=64, precision="bf16-mixed",
                          activation_checkpointing=True, batch_size=1, seq_len=4096)
    est.peak, est.parameters, est.optimizer, est.activations      # bytes, per process

The model runs one real training iteration (forward, backward, optimizer step) on fake tensors, under PyTorch's
memory trackers, prepared by the strategies' own code (`trainer.planning.layouts`); see `trainer.planning.trace`.
A model of many identical blocks is traced with 4 and 5 of them and extrapolated to all of them (every number is
linear in the block count), so a 70B model estimates in seconds.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from strategies.blocks import find_blocks
from trainer.planning.layouts import DEVICES, PRECISIONS, STRATEGIES, Setup, trace
from trainer.planning.models import ModelSource, is_language_model, keep_blocks, load_meta_model, meta_copy
from trainer.planning.optimizers import OptimizerLike, resolve_optimizer
from trainer.planning.trace import CATEGORIES, Tally
from trainer.planning.zero import zero_layout

if TYPE_CHECKING:
    from torch import nn

_TRACED_BLOCKS = (4, 5)  # models with more blocks are traced with these many and extrapolated


@dataclass(frozen=True)
class MemoryEstimate:
    """The per-process memory of one training iteration, in bytes.

    ``parameters``, ``gradients``, ``optimizer`` (state, and DeepSpeed's float32 master partition), ``activations``
    (what forward keeps for backward) are each category at its largest; ``temporaries`` what else is live at the peak
    (unsharded FSDP units, communication buffers, casts, gradients of activations, optimizer scratch); ``peak`` the
    most held at once, ``peak_phase`` when (``forward``, ``backward`` or ``step``), ``at_peak`` every category then.
    ``weights_only`` is the whole model's weights in the parameter dtype: what a weights-only estimate reports.
    """

    strategy: str
    num_processes: int
    precision: str
    optimizer_name: str
    activation_checkpointing: bool
    batch_size: int
    shape: tuple[int, ...]
    device: str
    parameters: int
    gradients: int
    optimizer: int
    activations: int
    temporaries: int
    peak: int
    peak_phase: str
    at_peak: dict[str, int] = field(default_factory=dict)
    weights_only: int = 0
    num_parameters: int = 0
    blocks: int = 0
    traced_blocks: tuple[int, ...] = ()
    pp: int = 1
    stages: tuple[MemoryEstimate, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: ``{"per_process": {...bytes}, "config": {...}, "model": {...}}``."""
        values = asdict(self)
        per_process = {name: values[name] for name in (*CATEGORIES, "peak")}
        return {
            "per_process": {**per_process, "peak_phase": self.peak_phase, "at_peak": dict(self.at_peak)},
            "weights_only": self.weights_only,
            "config": {"strategy": self.strategy, "num_processes": self.num_processes, "precision": self.precision,
                       "optimizer": self.optimizer_name, "activation_checkpointing": self.activation_checkpointing,
                       "batch_size": self.batch_size, "shape": list(self.shape), "device": self.device},
            "model": {"num_parameters": self.num_parameters, "blocks": self.blocks, "traced_blocks": list(self.traced_blocks)},
            **({"pp": self.pp, "stages": [stage.to_dict()["per_process"] for stage in self.stages]} if self.pp > 1 else {}),
        }


def estimate_memory(
    model: ModelSource,
    *,
    strategy: str = "single",
    num_processes: int = 1,
    precision: str = "32-true",
    optimizer: OptimizerLike = "adamw",
    optimizer_kwargs: dict[str, Any] | None = None,
    activation_checkpointing: bool = False,
    batch_size: int = 1,
    seq_len: int | None = None,
    input_shape: tuple[int, ...] | list[int] | None = None,
    device: str = "cuda",
    pp: int = 1,
    tp: int = 1,
    pipeline_schedule: str = "1F1B",
    microbatches: int | None = None,
) -> MemoryEstimate:
    """Estimate the per-process peak memory of one training iteration, and its breakdown.

    Args:
        model: an `nn.Module` (real or on the meta device; it is not touched), a zero-argument factory returning one
            (run on the meta device), ``"package.module:factory"``, or a directory holding a Hugging Face ``config.json``.
        strategy: ``"single"``, ``"ddp"``, ``"fsdp"`` (each repeated block its own unit, then the root),
            ``"deepspeed_stage_2"`` or ``"deepspeed_stage_3"``.
        num_processes: processes of the run (the data-parallel size).
        precision: ``"32-true"``, ``"bf16-mixed"`` or ``"bf16-true"``.
        optimizer: the optimizer the run steps, as you write it: a `torch.optim` short name meaning that class with
            torch's defaults (``"adamw"``, ``"sgd"``: no momentum, no state; ``"adagrad"``, ``"rmsprop"``, ...), a class
            path (``"torch.optim.SGD"``, ``"mypkg.optim:Lion"``), an Optimizer class, or a callable params -> Optimizer
            (``functools.partial(torch.optim.SGD, momentum=0.9)``). Its real ``step()`` runs on the fake tensors.
        optimizer_kwargs: keyword arguments for it (``{"momentum": 0.9}``).
        activation_checkpointing: recompute each repeated block in backward (non-reentrant), as the strategies do.
        batch_size: samples per process.
        seq_len: tokens per sample, for a language model (a ``transformers`` model with a vocabulary).
        input_shape: the shape of one sample otherwise (the batch is ``(batch_size, *input_shape)``, the loss the mean
            of the output).
        device: ``"cuda"`` (the optimizer's batched implementation, with its temporaries) or ``"cpu"`` (one tensor at
            a time). The trace itself runs on the CPU, with CPU kernels (attention included).
        pp: pipeline stages, one per process (`trainer.planning.stages`): the model split as `strategies.pipeline`
            splits it, each stage traced with the microbatches its schedule keeps in flight. The estimate is the stage
            with the largest peak; ``stages`` holds every stage's. ``num_processes`` is then the data-parallel size
            (``strategy='fsdp'`` shards each stage over it) and ``batch_size`` the batch of one step of one pipeline.
        tp: tensor-parallel processes. Not modelled yet: only 1 (``NotImplementedError``).
        pipeline_schedule: with ``pp > 1``, ``"1F1B"`` or ``"GPipe"`` (the schedules of one stage per process).
        microbatches: with ``pp > 1``, microbatches per step (None: ``pp``, as `PipelineConfig`'s default).
    """
    if tp != 1:
        raise NotImplementedError(
            f"estimate_memory(tp={tp}): the planner does not model tensor parallelism yet; estimate with tp=1 and divide "
            "the sharded layers' parameters by hand, or measure one iteration"
        )
    pp = _positive("pp", pp)
    setup = check_setup(strategy=strategy, num_processes=num_processes, precision=precision, optimizer=optimizer,
                        optimizer_kwargs=optimizer_kwargs, activation_checkpointing=activation_checkpointing,
                        batch_size=batch_size, device=device, shape=_shape(seq_len, input_shape))
    base = load_meta_model(model)
    if pp > 1:
        return _estimate_stages(base, setup, pp=pp, schedule=pipeline_schedule, microbatches=microbatches)
    return estimate_setup(base, setup)


def _estimate_stages(base: Any, setup: Setup, *, pp: int, schedule: str, microbatches: int | None) -> MemoryEstimate:
    from trainer.planning.stages import stage_tallies  # lazy: only a pipelined estimate

    stages = tuple(_estimate(setup, tally, base, 0, ()) for tally in stage_tallies(base, setup, pp=pp, schedule=schedule, microbatches=microbatches))
    largest = max(stages, key=lambda stage: stage.peak)
    return replace(largest, pp=pp, stages=stages)


def estimate_setup(base: Any, setup: Setup) -> MemoryEstimate:
    """`estimate_memory` for a checked `setup` and a meta model (`load_meta_model`), which stays untouched."""
    tally, blocks, traced = tally_setup(base, setup)
    return _estimate(setup, tally, base, blocks, traced)


def tally_setup(base: Any, setup: Setup) -> tuple[Tally, int, tuple[int, ...]]:
    """The tally of one iteration of `base` as `setup` runs it, its block count, and the block counts traced."""
    _check_shape_fits(base, setup)
    blocks = find_blocks(base)
    # FSDPStrategy shards a model without blocks as one unit (its default); checkpointing needs the blocks
    if setup.activation_checkpointing and not blocks.classes:
        raise ValueError(
            f"activation_checkpointing needs the model's repeated blocks (to checkpoint them), but {type(base).__name__} has "
            "no _no_split_modules and no nn.ModuleList of same-class modules; hold the blocks in an nn.ModuleList"
        )
    if blocks.count > _TRACED_BLOCKS[-1]:
        low, high = (trace(keep_blocks(meta_copy(base), blocks, k), blocks, setup) for k in _TRACED_BLOCKS)
        tally = low.scaled(high, (blocks.count - _TRACED_BLOCKS[0]) / (_TRACED_BLOCKS[1] - _TRACED_BLOCKS[0]))
        traced: tuple[int, ...] = _TRACED_BLOCKS
    else:
        tally, traced = trace(meta_copy(base), blocks, setup), (blocks.count,)
    if setup.strategy.startswith("deepspeed"):  # the engine's partitions and buffers, for the whole model
        tally = zero_layout(tally, setup, base)
    return tally, blocks.count, traced


def _estimate(setup: Setup, tally: Tally, base: Any, blocks: int, traced: tuple[int, ...]) -> MemoryEstimate:
    count = sum(p.numel() for p in base.parameters())
    dtype_bytes = 2 if setup.precision == "bf16-true" else 4
    return MemoryEstimate(
        strategy=setup.strategy, num_processes=setup.num_processes, precision=setup.precision, optimizer_name=setup.optimizer.name,
        activation_checkpointing=setup.activation_checkpointing, batch_size=setup.batch_size, shape=setup.shape,
        device=setup.device, parameters=tally.parameters, gradients=tally.gradients, optimizer=tally.optimizer,
        activations=tally.activations, temporaries=tally.temporaries, peak=tally.peak, peak_phase=tally.peak_phase,
        at_peak=tally.at_peak, weights_only=count * dtype_bytes, num_parameters=count, blocks=blocks, traced_blocks=traced,
    )


# argument checks ---------------------------------------------------------------------------------------------------


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name}={value!r} is not supported; choose one of {', '.join(repr(c) for c in choices)}")
    return value


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}={value!r} must be a positive int, e.g. {name}=8")
    return value


def _shape(seq_len: Any, input_shape: Any) -> tuple[int, ...]:
    if (seq_len is None) == (input_shape is None):
        raise ValueError(
            f"pass seq_len (tokens per sample, for a language model) or input_shape (one sample's shape, e.g. (64, 512)), "
            f"exactly one of them; got seq_len={seq_len!r}, input_shape={input_shape!r}"
        )
    if seq_len is not None:
        return (_positive("seq_len", seq_len),)
    if isinstance(input_shape, (str, bytes)) or not isinstance(input_shape, (tuple, list)) or not input_shape:
        raise TypeError(f"input_shape={input_shape!r} must be a non-empty tuple of positive ints, e.g. (64, 512)")
    return tuple(_positive("input_shape entry", n) for n in input_shape)


def check_setup(*, strategy: str, num_processes: Any, precision: str, optimizer: OptimizerLike, activation_checkpointing: Any,
                batch_size: Any, device: Any, shape: tuple[int, ...], optimizer_kwargs: dict[str, Any] | None = None) -> Setup:
    """A `Setup` from checked arguments, or an error naming the bad value and the choices."""
    strategy = _choice("strategy", strategy, STRATEGIES)
    processes = _positive("num_processes", num_processes)
    if strategy == "single" and processes != 1:
        raise ValueError(f"strategy='single' runs one process, but num_processes={processes}; use strategy='ddp' or 'fsdp', or num_processes=1")
    precision = _choice("precision", precision, tuple(PRECISIONS))
    if strategy.startswith("deepspeed") and precision == "bf16-true":
        raise ValueError(
            f"precision='bf16-true' with strategy={strategy!r}: DeepSpeed's engine keeps float32 master weights; use "
            "precision='bf16-mixed', or strategy='fsdp' for true bf16 parameters"
        )
    if not isinstance(activation_checkpointing, bool):
        raise TypeError(f"activation_checkpointing={activation_checkpointing!r} must be True or False")
    return Setup(strategy=strategy, num_processes=processes, precision=precision, optimizer=resolve_optimizer(optimizer, optimizer_kwargs),
                 activation_checkpointing=activation_checkpointing, batch_size=_positive("batch_size", batch_size), shape=shape,
                 device=_choice("device", device, DEVICES))


def _check_shape_fits(model: nn.Module, setup: Setup) -> None:
    language = is_language_model(model)
    if language and len(setup.shape) != 1:
        raise ValueError(f"{type(model).__name__} is a language model: pass seq_len (tokens per sample), not input_shape={setup.shape}")
    if not language and len(setup.shape) == 1 and getattr(model, "config", None) is not None:
        raise ValueError(f"{type(model).__name__} has a config without vocab_size: pass input_shape, not seq_len")


def read_size(text: str) -> int:
    """``"80GiB"``, ``"80 GB"``, ``"512MiB"``, ``"1e9"`` as bytes (GiB/MiB/KiB: powers of 1024; GB/MB/KB: of 1000)."""
    units = {"tib": 2**40, "gib": 2**30, "mib": 2**20, "kib": 2**10, "tb": 10**12, "gb": 10**9, "mb": 10**6, "kb": 10**3, "b": 1, "": 1}
    cleaned = str(text).strip().lower().replace(" ", "")
    number = cleaned.rstrip("tgmkib")
    unit = cleaned[len(number):]
    try:
        value = float(number) * units[unit]
    except (ValueError, KeyError):
        raise ValueError(f"budget={text!r} is not a size; write e.g. '80GiB', '40GB' or '512MiB'") from None
    if value <= 0:
        raise ValueError(f"budget={text!r} must be more than 0 bytes, e.g. '80GiB'")
    return int(value)


def format_bytes(value: int) -> str:
    """Bytes as a short human size (GiB/MiB/KiB)."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= size:
            return f"{value / size:.2f} {unit}"
    return f"{value} B"

