"""The memory of one pipeline stage: its share of the model, and the microbatches its schedule keeps in flight.

    tallies = stage_tallies(meta_model, setup, pp=2, schedule="1F1B", microbatches=4)   # one per stage

Each stage is the model split by the pipeline's own code (`PipelineConfig.plan`, `strategies.pipeline_split.prune`):
its modules only, traced for one microbatch as `setup` runs it (`trainer.planning.layouts.trace`: FSDP shards it over
the ``dp`` processes as it shards a whole model), its input the previous stage's output (the stages run in a chain on
fake tensors to find each one's input). The schedule's share is then added:

* the microbatches in flight: a stage holds the activations of ``k`` microbatches between their forward and their
  backward, ``k = min(pp - stage, microbatches)`` for 1F1B (the first stage the most), all ``microbatches`` for GPipe;
  each also keeps its output until its backward. Under 1F1B a stage with more microbatches than ``k`` runs forwards
  after its first backward, so with its gradients held, and a stage after the first keeps the gradients of one
  microbatch's input (the send torch's 1F1B fuses with the next receive) through the next forward and backward.
* the inputs: the first stage holds the whole batch (its microbatches are views of it), the last one the labels (a
  batch of the same size, as the loss of a language model takes the tokens); the others keep one receive buffer per
  microbatch for the activations (``PipelineStage`` allocates them once), and every stage but the last one per
  microbatch for the gradients of its output.

`measure_stage` measures the same on a real pipeline of a launched process group (one process per stage).
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from strategies import pipeline_split as split
from strategies.blocks import find_blocks
from strategies.pipeline import SINGLE_STAGE, Pipeline, PipelineConfig
from trainer.planning.layouts import Setup, build_optimizer, module_dtype, precision_for, trace
from trainer.planning.models import make_batch, meta_copy
from trainer.planning.trace import CATEGORIES, Tally, fake_parameters, iterate, memory_tracker

if TYPE_CHECKING:
    from torch.distributed._tools.mem_tracker import MemTracker

StageInput = tuple[tuple[int, ...], torch.dtype]


def check_pipeline(base: nn.Module, setup: Setup, *, pp: int, schedule: str, microbatches: int | None) -> tuple[PipelineConfig, list[list[str]], int]:
    """The pipeline's config, its stages' module names and its microbatches, or an error naming what is not modelled."""
    config = PipelineConfig(schedule=schedule, microbatches=microbatches)
    if config.schedule not in SINGLE_STAGE:
        raise NotImplementedError(
            f"estimate_memory(pp={pp}, pipeline_schedule={config.schedule!r}): the planner models one stage per process, "
            f"the schedules {', '.join(SINGLE_STAGE)}; estimate with '1F1B' (the same stages, fewer microbatches in flight "
            "than an interleaved schedule keeps), or measure one iteration"
        )
    if setup.strategy not in ("single", "fsdp"):
        raise NotImplementedError(
            f"estimate_memory(pp={pp}, strategy={setup.strategy!r}): pipeline stages are modelled with strategy='single' "
            "(no data parallelism) or 'fsdp' (each stage sharded over num_processes data-parallel processes)"
        )
    if setup.precision == "bf16-mixed":
        raise NotImplementedError(
            f"estimate_memory(pp={pp}, precision='bf16-mixed'): pipeline stages are modelled in '32-true' and 'bf16-true' "
            "(the dtype of what passes between stages under autocast is not modelled yet)"
        )
    stages = config.plan(base, pp)
    count = config.microbatches_for(len(stages), pp)
    if setup.batch_size % count:
        raise ValueError(
            f"batch_size={setup.batch_size} does not split into {count} pipeline microbatches; pass a batch_size that "
            f"{count} divides, or microbatches= that divides {setup.batch_size}"
        )
    return config, stages, count


def stage_tallies(base: nn.Module, setup: Setup, *, pp: int, schedule: str, microbatches: int | None) -> list[Tally]:
    """One tally per stage of `base` (a meta model, untouched) split over `pp` processes, with the schedule's share
    (see the module docstring); `setup.batch_size` is the batch of one step, split into the microbatches."""
    config, stages, count = check_pipeline(base, setup, pp=pp, schedule=schedule, microbatches=microbatches)
    one = replace(setup, batch_size=setup.batch_size // count)
    inputs = _stage_inputs(base, stages, one)
    tallies = []
    for index, keep in enumerate(stages):
        part = split.prune(meta_copy(base), set(keep), in_place=True)
        tally = trace(part, find_blocks(part), one, stage_input=(*inputs[index], index > 0))  # received: with gradient
        output = inputs[index + 1] if index + 1 < len(stages) else None
        in_flight = count if config.schedule == "GPipe" else min(pp - index, count)
        one_f_one_b = config.schedule == "1F1B"
        tallies.append(_scheduled(tally, inputs[index], output, count=count, in_flight=in_flight,
                                  forwards_after_backward=one_f_one_b and count > in_flight,
                                  pending_send=one_f_one_b and index > 0 and count > 1,
                                  target=count * _bytes(inputs[0]) if index == len(stages) - 1 else 0))
    return tallies


def _bytes(meta: StageInput | None) -> int:
    if meta is None:
        return 0
    shape, dtype = meta
    return int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()


def _scheduled(tally: Tally, given: StageInput, output: StageInput | None, *, count: int, in_flight: int,
               forwards_after_backward: bool, pending_send: bool, target: int) -> Tally:
    """One microbatch's `tally` with the schedule's share added (see the module docstring)."""
    held_input = _bytes(given)  # the traced microbatch's input, counted among its activations
    per_microbatch = tally.activations - held_input  # what one microbatch in flight keeps (its output included)
    phases: dict[str, dict[str, int]] = {}
    for name, traced in tally.phases.items():
        phase = dict(traced)
        phase["activations"] += (count - 1) * held_input + target  # every microbatch's input (and labels), held for the step
        phase["temporaries"] += count * _bytes(output)  # the receive buffers of the output's gradients
        if name != "step":
            phase["temporaries"] += held_input if pending_send else 0
        if name == "forward":
            phase["activations"] += (in_flight - 1) * per_microbatch
            phase["gradients"] = tally.gradients if forwards_after_backward else phase["gradients"]
        if name == "backward":  # the first backward, most microbatches in flight; or a later one, the gradients held
            first = {**phase, "activations": phase["activations"] + (in_flight - 1) * per_microbatch}
            others = in_flight - 1 if forwards_after_backward else in_flight - 2
            later = {**phase, "activations": phase["activations"] + max(others, 0) * per_microbatch, "gradients": tally.gradients}
            phase = max(first, later, key=lambda p: sum(p.values())) if count > 1 else first
        phases[name] = phase
    activations = tally.activations + (count - 1) * held_input + target + (in_flight - 1) * per_microbatch
    return Tally(parameters=tally.parameters, gradients=tally.gradients, optimizer=tally.optimizer, activations=activations, phases=phases)


def _stage_inputs(base: nn.Module, stages: list[list[str]], setup: Setup) -> list[StageInput]:
    """The shape and dtype of every stage's input for one microbatch: the batch, then each stage's output in turn (the
    stages run in a chain on fake tensors, without gradients)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    cpu = torch.device("cpu")
    with contextlib.ExitStack() as stack:
        stack.enter_context(FakeTensorMode())
        stack.enter_context(torch.no_grad())
        model = fake_parameters(meta_copy(base), cpu, module_dtype(precision_for(setup)))
        x: Any = make_batch(model, setup.batch_size, setup.shape, cpu)
        found: list[StageInput] = []
        for keep in stages:
            found.append((tuple(x.shape), x.dtype))
            x = split.prune(model, set(keep), in_place=False)(x)
            x = x[0] if isinstance(x, (tuple, list)) else x
        found.append((tuple(x.shape), x.dtype))
    return found


def measure_stage(model: nn.Module, setup: Setup, *, schedule: str, microbatches: int | None) -> Tally:
    """Inside a launched process group of one process per stage (``strategy='single'``, on the CPU): `model` (real;
    consumed) split by `Pipeline`, one untracked step, then one step under the tracker, with what the stage holds from
    before it (its receive buffers) tracked as temporaries."""
    import torch.distributed as dist
    from torch.distributed._tools.mem_tracker import _MemRefType

    cpu = torch.device("cpu")
    pipeline = Pipeline(PipelineConfig(schedule=schedule, microbatches=microbatches), group=None, pp_rank=dist.get_rank(),
                        pp_size=dist.get_world_size(), device=cpu)
    model = pipeline.setup(model)
    optimizer = build_optimizer(setup.optimizer, model, "cpu")
    batch = make_batch(model, setup.batch_size, setup.shape, cpu)

    def forward_backward() -> torch.Tensor:
        return pipeline.step(batch, target=batch, loss_fn=lambda out, _: out.float().mean())

    def step() -> None:
        optimizer.step()
        optimizer.zero_grad()

    forward_backward()
    step()
    tracker = _per_microbatch(memory_tracker())
    tracker.track_external(model, optimizer)
    if pipeline.has_first_stage:
        tracker.track_external(batch)
    for stage in pipeline.stages:
        for infos in [*stage.args_recv_info.values(), *stage.grad_recv_info.values()]:
            for info in infos:
                if isinstance(getattr(info, "buffer", None), torch.Tensor):
                    tracker._update_and_maybe_create_winfos(info.buffer, _MemRefType.TEMP)
    with tracker, warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The module hierarchy tracking", UserWarning)  # (the root's second forward)
        return iterate(tracker, forward_backward, lambda _: None, step)


def _per_microbatch(tracker: MemTracker) -> MemTracker:
    """`tracker` letting the stage's root module run once per microbatch (a `MemTracker` refuses a root's second
    forward as the next iteration; its per-module statistics, which refuse it, are not used here)."""
    pre_forward = tracker._pre_fw_hook

    def each_microbatch(module: nn.Module, inputs: Any) -> None:
        try:
            pre_forward(module, inputs)
        except NotImplementedError as err:
            if "multiple iterative calls" not in str(err):
                raise

    tracker._pre_fw_hook = each_microbatch  # type: ignore[method-assign]
    return tracker


def tally_dict(tally: Tally) -> dict[str, int]:
    """A tally's categories and its peak, as plain ints."""
    return {**{name: getattr(tally, name) for name in CATEGORIES}, "peak": tally.peak}
