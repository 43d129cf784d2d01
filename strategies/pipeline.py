"""Pipeline parallelism: the model split into stages over the ``pp`` dimension, run by a torch schedule.

`PipelineConfig` says how (torch's schedule names, microbatches, the split); `Pipeline` does it on one process:

    pipeline = Pipeline(config, group=pp_group, pp_rank=..., pp_size=..., device=...)
    model = pipeline.setup(model, shard=...)      # this process's stages' layers, under their own names
    loss = pipeline.step(x, target=y, loss_fn=F.cross_entropy, accumulation_steps=2)   # forward + backward
    loss = pipeline.eval(x, target=y, loss_fn=F.cross_entropy)                          # forward only
    out = pipeline.forward(x)                                                           # the last stage's outputs

After torchtitan (``torchtitan/distributed/pipeline_parallel.py``): the split by module name (`strategies.pipeline_split`),
the schedule built from torch's names with ``scale_grads=False`` and each microbatch's loss divided by microbatches ×
accumulation steps (torch's default rescales gradients already accumulated, which is wrong under accumulation), and
looped or V placement of the stages on the processes. What torchtitan leaves to its loop is done here: the batch's loss
is broadcast from the last stage to every process of the pipeline; schedules whose ``eval()`` fails in torch
(ZBVZeroBubble, DualPipeV: ``can't steal_bwd_input``) evaluate through a forward-only order built from their own forward
actions; and one stage's exception ends the step on every process within seconds (`PipelineStageError`, naming the
stage and the error) instead of leaving the others waiting in a receive until the process-group timeout.
"""

from __future__ import annotations

import copy
import gc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from strategies import pipeline_split as split

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

SCHEDULES = ("GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")
SINGLE_STAGE = ("GPipe", "1F1B")  # one stage per process
V_SCHEDULES = ("ZBVZeroBubble", "DualPipeV")  # two stages per process, placed in a V
_FAILURE_KEY = "trainwright/pipeline_failure"


class PipelineStageError(RuntimeError):
    """A pipeline stage raised: every process of the run fails with this error, which names the stage and the error."""


def _positive(name: str, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"PipelineConfig({name}={value!r}) must be a positive int or None")


@dataclass(frozen=True)
class PipelineConfig:
    """How a model is split into pipeline stages and scheduled (see the module docstring).

    Args:
        schedule: one of torch's schedule names: ``"GPipe"``, ``"1F1B"`` (one stage per process),
            ``"Interleaved1F1B"``, ``"LoopedBFS"``, ``"InterleavedZeroBubble"`` (several, looped),
            ``"ZBVZeroBubble"``, ``"DualPipeV"`` (two, in a V). Case does not matter.
        microbatches: microbatches per data-parallel process and step (the batch is split into them); None: the
            number of stages.
        layers_per_stage: layers of the model's layer container per stage (the number of stages follows); None: see
            `stages_per_rank`.
        stages_per_rank: stages each process holds; None: 1 for one-stage schedules, 2 for the others.
        module_fqns_per_stage: the module names of each stage, e.g. ``[["embed", "layers.0"], ["layers.1", "head"]]``
            (instead of the automatic split: equal layer counts).

    Raises:
        ValueError: an unknown schedule, a size that is not a positive int, or a stage count the schedule cannot
            run (one-stage schedules: 1 per process; V schedules: 2; the others: at least 2).
    """

    schedule: str = "1F1B"
    microbatches: int | None = None
    layers_per_stage: int | None = None
    stages_per_rank: int | None = None
    module_fqns_per_stage: Sequence[Sequence[str]] | None = None

    def __post_init__(self) -> None:
        names = {name.lower(): name for name in SCHEDULES}
        if not isinstance(self.schedule, str) or self.schedule.lower() not in names:
            raise ValueError(f"PipelineConfig(schedule={self.schedule!r}) is not a schedule; choose one of {', '.join(SCHEDULES)}")
        object.__setattr__(self, "schedule", names[self.schedule.lower()])
        for name in ("microbatches", "layers_per_stage", "stages_per_rank"):
            _positive(name, getattr(self, name))
        given = [n for n in ("layers_per_stage", "stages_per_rank", "module_fqns_per_stage") if getattr(self, n) is not None]
        if len(given) > 1:
            raise ValueError(f"PipelineConfig: pass one of layers_per_stage, stages_per_rank, module_fqns_per_stage, not {' and '.join(given)}")
        if self.module_fqns_per_stage is not None:
            if isinstance(self.module_fqns_per_stage, str) or any(isinstance(s, str) for s in self.module_fqns_per_stage):
                raise ValueError(f"module_fqns_per_stage={self.module_fqns_per_stage!r} must be a list of lists of module names, one per stage")
            object.__setattr__(self, "module_fqns_per_stage", tuple(tuple(stage) for stage in self.module_fqns_per_stage))
        if self.stages_per_rank is not None:
            self.check_stages_per_rank(self.stages_per_rank)

    def check_stages_per_rank(self, stages_per_rank: int) -> None:
        """Refuse a stage count per process the schedule cannot run (`ValueError`)."""
        if self.schedule in V_SCHEDULES and stages_per_rank != 2:
            raise ValueError(
                f"schedule {self.schedule!r} places two stages on each process in a V, but stages_per_rank={stages_per_rank}; "
                "use stages_per_rank=2 (the default), or a looped schedule such as 'Interleaved1F1B'"
            )
        if self.schedule in SINGLE_STAGE and stages_per_rank != 1:
            raise ValueError(
                f"schedule {self.schedule!r} runs one stage per process, but the split gives {stages_per_rank}; use an "
                "interleaved schedule ('Interleaved1F1B', 'LoopedBFS', 'InterleavedZeroBubble') or one stage per process"
            )
        if self.schedule not in SINGLE_STAGE and stages_per_rank < 2:
            raise ValueError(
                f"schedule {self.schedule!r} runs several stages per process, but the split gives {stages_per_rank}; use "
                "'1F1B' or 'GPipe' for one stage per process, or stages_per_rank=2"
            )

    def plan(self, model: nn.Module, pp: int) -> list[list[str]]:
        """The module names of every stage of `model` on `pp` processes (checked: `ValueError` for a split the layers,
        the processes or the schedule do not allow)."""
        if self.module_fqns_per_stage is not None:
            stages = len(self.module_fqns_per_stage)
            if stages % pp:
                raise ValueError(f"module_fqns_per_stage has {stages} stages, which the pipeline size {pp} does not divide")
            self.check_stages_per_rank(stages // pp)
            return split.check_split(model, self.module_fqns_per_stage, stages)
        if self.layers_per_stage is not None:
            container = split.layer_container(model)
            layers = len(list(model.get_submodule(container).children()))
            if layers % self.layers_per_stage or (layers // self.layers_per_stage) % pp:
                raise ValueError(
                    f"layers_per_stage={self.layers_per_stage}: {type(model).__name__}'s {layers} layers ({container}) do not "
                    f"divide into stages of {self.layers_per_stage} spread evenly over {pp} processes; choose a layers_per_stage "
                    f"that divides {layers} into a multiple of {pp} stages"
                )
            stages = layers // self.layers_per_stage
            self.check_stages_per_rank(stages // pp)
            return split.auto_split(model, stages)
        per_rank = self.stages_per_rank or (1 if self.schedule in SINGLE_STAGE else 2)
        self.check_stages_per_rank(per_rank)
        return split.auto_split(model, pp * per_rank)

    def microbatches_for(self, num_stages: int, pp: int) -> int:
        """The microbatches per step: the configured number, or `num_stages`; refused below the pipeline size."""
        microbatches = self.microbatches or num_stages
        if microbatches < pp:
            raise ValueError(
                f"PipelineConfig(microbatches={microbatches}) is fewer than the {pp} processes of the pipeline, so schedule "
                f"{self.schedule!r} cannot fill it; use at least {pp} microbatches (the default is the number of stages, {num_stages})"
            )
        return microbatches


class Pipeline:
    """The pipeline stages of one process and the schedule that runs them (see the module docstring).

    Args:
        config: the split and the schedule.
        group: the process group of the ``pp`` dimension (this process's pipeline).
        pp_rank: this process's place in the pipeline; pp_size: the pipeline's processes.
        device: where the stages compute.
    """

    def __init__(self, config: PipelineConfig, *, group: ProcessGroup | None, pp_rank: int, pp_size: int, device: torch.device) -> None:
        self.config = config
        self.group = group
        self.pp_rank = pp_rank
        self.pp_size = pp_size
        self.device = device
        self.stage_fqns: list[list[str]] = []  # every stage's module names
        self.stage_indices: tuple[int, ...] = ()  # the stages this process holds
        self.model: nn.Module | None = None  # the model set up: it holds every parameter of this process's stages
        self.parts: list[nn.Module] = []  # this process's stages' modules (views sharing the set-up model's layers)
        self.stages: list[Any] = []  # torch's PipelineStage objects, one per part
        self.schedule: Any = None
        self.microbatches = 0
        self._loss_fn: Callable[..., torch.Tensor] | None = None
        self._loss_scale = 1.0
        self._raw_losses: list[torch.Tensor] = []
        self._forward_only: Any = None

    @property
    def num_stages(self) -> int:
        return len(self.stage_fqns)

    @property
    def has_first_stage(self) -> bool:
        return 0 in self.stage_indices

    @property
    def has_last_stage(self) -> bool:
        return self.num_stages - 1 in self.stage_indices

    @property
    def last_stage_rank(self) -> int:
        """The pipeline rank holding the last stage (the first process for a V schedule)."""
        return 0 if self.config.schedule in V_SCHEDULES else self.pp_size - 1

    def setup(self, model: nn.Module, shard: Callable[[nn.Module], nn.Module] | None = None) -> nn.Module:
        """Split `model` (in place: it keeps this process's stages' layers) and build the stages and the schedule.

        `shard` is applied to each stage's module (tensor parallelism, FSDP), as torchtitan applies its parallelize
        function to each model part. Returns `model`, which holds every parameter this process trains.
        """
        from torch.distributed.pipelining import PipelineStage
        from torch.distributed.pipelining.schedules import get_schedule_class

        self.stage_fqns = self.config.plan(model, self.pp_size)
        per_rank = self.num_stages // self.pp_size
        self.stage_indices = split.stage_indices(self.pp_rank, self.pp_size, per_rank, self.config.schedule in V_SCHEDULES)
        self.microbatches = self.config.microbatches_for(self.num_stages, self.pp_size)
        keeps = [set(self.stage_fqns[i]) for i in self.stage_indices]
        views = [split.prune(model, keep, in_place=False) for keep in keeps] if len(keeps) > 1 else []
        split.prune(model, set().union(*keeps), in_place=True)
        self.model = model
        self.parts = views or [model]
        if shard is not None:
            self.parts = [shard(part) for part in self.parts]
        self.stages = [
            PipelineStage(part, index, self.num_stages, self.device, group=self.group)
            for part, index in zip(self.parts, self.stage_indices)
        ]
        cls = get_schedule_class(self.config.schedule)
        common: dict[str, Any] = {"n_microbatches": self.microbatches, "loss_fn": self._scaled_loss, "scale_grads": False}
        try:
            self.schedule = cls(self.stages, **common) if per_rank > 1 else cls(self.stages[0], **common)
        except (ValueError, AssertionError, RuntimeError) as err:
            raise ValueError(
                f"schedule {self.config.schedule!r} cannot run {self.num_stages} stages on {self.pp_size} processes with "
                f"microbatches={self.microbatches}: {err}; change PipelineConfig's microbatches or split"
            ) from err
        return model

    def _scaled_loss(self, output: Any, target: Any) -> torch.Tensor:
        """The user's loss of one microbatch, kept for the report, divided by microbatches × accumulation steps."""
        assert self._loss_fn is not None  # set by step() before the schedule runs
        raw = self._loss_fn(output, target)
        self._raw_losses.append(raw.detach())
        return raw / self._loss_scale

    def check_batch(self, batch: Any) -> None:
        """A batch must split into the microbatches (`ValueError`; the same on every process: each sees the batch)."""
        size = batch.shape[0] if isinstance(batch, torch.Tensor) else None
        if size is not None and size % self.microbatches:
            raise ValueError(
                f"a batch of {size} samples does not split into {self.microbatches} pipeline microbatches; use a batch size "
                f"that {self.microbatches} divides (drop_last=True in the loader drops a short last batch), or change "
                "PipelineConfig(microbatches=...)"
            )

    def step(self, *args: Any, target: Any, loss_fn: Callable[..., torch.Tensor], accumulation_steps: int = 1) -> torch.Tensor:
        """Forward and backward of every microbatch of the batch `args`; gradients accumulate into the parameters.

        Every process passes the whole batch (the first stage reads `args`, the last `target`). Returns the batch's
        loss (the mean of the microbatches' losses) on every process of the pipeline.
        """
        self.check_batch(args[0] if args else target)
        self._loss_fn, self._loss_scale, self._raw_losses = loss_fn, float(self.microbatches * accumulation_steps), []
        inputs = args if self.has_first_stage else ()
        labels = target if self.has_last_stage else None
        losses: list[torch.Tensor] = []
        self._guarded(lambda: self.schedule.step(*inputs, target=labels, losses=losses, return_outputs=False))
        # (the last `microbatches`: torch's first step also runs the loss once while it infers the stages' shapes)
        mean = torch.stack(self._raw_losses[-self.microbatches:]).mean() if self.has_last_stage else torch.zeros((), device=self.device)
        return self._from_last_stage(mean)

    def forward(self, *args: Any) -> Any:
        """The last stage's outputs for the batch `args`, forward only, on every process of the pipeline."""
        self.check_batch(args[0] if args else None)
        inputs = args if self.has_first_stage else ()
        outputs = self._guarded(lambda: self._forward_schedule().eval(*inputs))
        return self._object_from_last_stage(outputs if self.has_last_stage else None)

    def eval(self, *args: Any, target: Any, loss_fn: Callable[..., torch.Tensor]) -> torch.Tensor:
        """The loss of the batch `args` against `target`, forward only (the whole batch's loss, as one process computes
        it), on every process of the pipeline."""
        self.check_batch(args[0] if args else target)
        inputs = args if self.has_first_stage else ()
        outputs = self._guarded(lambda: self._forward_schedule().eval(*inputs))
        loss = loss_fn(outputs, target).detach() if self.has_last_stage else torch.zeros((), device=self.device)
        return self._from_last_stage(loss)

    def _forward_schedule(self) -> Any:
        """A copy of the schedule without its loss (forward only); for the V schedules, whose ``eval()`` fails in torch,
        with an order of only their own forward actions and the sends and receives of activations."""
        if self._forward_only is None:
            from torch.distributed.pipelining.schedules import _ComputationType as Kind

            forward_only = copy.copy(self.schedule)
            forward_only._loss_fn = None
            forward_only._has_backward = False
            order = getattr(self.schedule, "pipeline_order_with_comms", None)
            if order is not None and self.config.schedule in V_SCHEDULES:
                keep = (Kind.FORWARD, Kind.SEND_F, Kind.RECV_F, Kind.UNSHARD, Kind.RESHARD)
                forward_only.pipeline_order_with_comms = {
                    rank: [a for a in _expanded(actions) if a.computation_type in keep] for rank, actions in order.items()
                }
            self._forward_only = forward_only
        return self._forward_only

    def _from_last_stage(self, value: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        if self.pp_size > 1:
            value = value.to(self.device).contiguous()
            dist.broadcast(value, group_src=self.last_stage_rank, group=self.group)
        return value

    def _object_from_last_stage(self, value: Any) -> Any:
        import torch.distributed as dist

        if self.pp_size == 1:
            return value
        holder = [value]
        dist.broadcast_object_list(holder, group_src=self.last_stage_rank, group=self.group, device=self.device)
        return holder[0]

    def _guarded(self, run: Callable[[], Any]) -> Any:
        """`run()`, where an exception on any process ends the step on every process within seconds.

        The process where a stage raised records which stage and what error in the process group's store, then
        leaves every process group: its connections close, so a process waiting to receive from it (and, in turn, one
        waiting on that one) fails at once instead of at the timeout. Each then raises `PipelineStageError` with the
        recorded cause.
        """
        try:
            return run()
        except Exception as err:
            raise self._fail(err) from err

    def _fail(self, err: Exception) -> PipelineStageError:
        import datetime

        import torch.distributed as dist

        if not dist.is_initialized():
            return PipelineStageError(f"pipeline stages {list(self.stage_indices)} failed: {type(err).__name__}: {err}")
        store = dist.distributed_c10d._get_default_store()
        rank = dist.get_rank()
        while err.__cause__ is not None and isinstance(err.__cause__, Exception):  # torch's schedule wraps the stage's error
            err = err.__cause__
        own = f"stage {list(self.stage_indices)} on process {rank} failed: {type(err).__name__}: {err}"
        communication = any(part in str(err) for part in ("Connection closed by peer", "Connection reset by peer", "Read error"))
        if not communication:
            store.compare_set(_FAILURE_KEY, "", own)
        dist.destroy_process_group()  # every group: this process's connections close, its peers' waits fail now
        gc.collect()
        try:
            store.wait([_FAILURE_KEY], datetime.timedelta(seconds=5))
            cause = store.get(_FAILURE_KEY).decode()
        except Exception:  # the failed process took the store with it: report what this one saw
            cause = own
        error = PipelineStageError(
            f"pipeline {cause} (every process of the run stops; the process groups are closed). On process {rank}: "
            f"{type(err).__name__}: {str(err)[:200]}"
        )
        # it names the failed stage: not for the hung-rank report (strategies.process_group), which would wait for peers
        error._trainwright_reported = True  # type: ignore[attr-defined]
        return error


def _expanded(actions: list[Any]) -> list[Any]:
    """Actions with DualPipeV's overlapped forward-backward pairs opened into their parts."""
    out: list[Any] = []
    for action in actions:
        if action is None:
            continue
        subs = getattr(action, "sub_actions", None)
        out.extend(subs if subs else [action])
    return out
