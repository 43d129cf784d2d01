"""One training iteration under PyTorch's memory trackers, on fake tensors (an estimate) or real ones (a measurement).

    tally = tracked_iteration(model, optimizer, batch, sharded=False)

`torch.distributed._tools.mem_tracker.MemTracker` (or, for a module sharded by ``fully_shard``,
`fsdp2_mem_tracker.FSDPMemTracker`) follows every tensor storage that the iteration creates or holds, by what it is:
parameter, gradient, optimizer state, activation, temporary. Under `FakeTensorMode` the same code runs without
allocating anything (fake tensors carry shapes, dtypes and devices only), so the trackers' numbers are the peak the
real iteration would reach, computed on the CPU in seconds. The estimate and the measurement it is checked against
run this one function; only the tensors differ.

The optimizer must hold its state before the tracked iteration (one untracked iteration, or `prime_optimizer`), so the
iteration is the steady state of training. ``zero_grad()`` sets gradients to None, torch's default.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from strategies.mesh import ParallelDims
from trainer.planning.models import compute_loss

if TYPE_CHECKING:
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed.device_mesh import DeviceMesh

CATEGORIES = ("parameters", "gradients", "optimizer", "activations", "temporaries")

# the trackers' categories (MemTracker's and FSDPMemTracker's names) -> ours; anything else is a temporary
_CATEGORY_OF = {
    "Parameter": "parameters", "Buffer": "parameters", "Sharded Param": "parameters",
    "Gradient": "gradients", "Sharded Grad": "gradients",
    "Optstate": "optimizer", "OptState": "optimizer",
    "Activation": "activations", "Inputs": "activations", "Other": "activations",  # "Other": the batch, tracked externally
}


PHASES = ("forward", "backward", "step")


@dataclass
class Tally:
    """Bytes of one iteration: each category where it is largest, and the categories at each phase's peak.

    ``parameters`` and ``optimizer`` are what is held after the step; ``gradients`` after backward; ``activations``
    after forward (what backward will need). ``phases`` holds, for forward, backward and the optimizer step, every
    category at that phase's peak; ``temporaries`` are the rest of a peak: unsharded FSDP units, communication
    buffers, casts, gradients of activations, the optimizer's scratch tensors.
    """

    parameters: int = 0
    gradients: int = 0
    optimizer: int = 0
    activations: int = 0
    phases: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=lambda name: sum(self.phases[name].values()))

    @property
    def at_peak(self) -> dict[str, int]:
        return dict(self.phases[self.peak_phase])

    @property
    def peak(self) -> int:
        return sum(self.at_peak.values())

    @property
    def temporaries(self) -> int:
        return self.at_peak["temporaries"]

    def scaled(self, other: Tally, factor: float) -> Tally:
        """``self + factor * (other - self)``: a linear extrapolation from two tallies.

        Each phase's peak is extrapolated as a total: the moment of a phase's peak may differ between the two (a
        category at the peak of one is not at the peak of the other), so its categories are extrapolated each and the
        temporaries made up to the total.
        """
        def mix(a: int, b: int) -> int:
            return max(0, round(a + factor * (b - a)))

        phases = {}
        for phase, mine in self.phases.items():
            theirs = other.phases[phase]
            mixed = {k: mix(mine[k], theirs[k]) for k in CATEGORIES}
            total = mix(sum(mine.values()), sum(theirs.values()))
            mixed["temporaries"] = max(0, total - sum(v for k, v in mixed.items() if k != "temporaries"))
            phases[phase] = mixed
        return Tally(**{name: mix(getattr(self, name), getattr(other, name)) for name in CATEGORIES[:4]}, phases=phases)


def _ours(snapshot: dict[Any, dict[Any, int]]) -> dict[str, int]:
    """A tracker snapshot (per device, per tracker category) as bytes per category of ours, devices summed; the meta
    device holds no memory (DeepSpeed keeps meta copies of its parameters' shapes, which the tracker counts)."""
    out = dict.fromkeys(CATEGORIES, 0)
    for device, per_device in snapshot.items():
        if torch.device(device).type == "meta":
            continue
        for key, value in per_device.items():
            name = getattr(key, "value", key)
            if name != "Total":
                out[_CATEGORY_OF.get(name, "temporaries")] += value
    return out


def make_tracker(model: nn.Module, optimizer: torch.optim.Optimizer, batch: torch.Tensor, *, sharded: bool) -> Any:
    """The tracker for this module: `FSDPMemTracker` when it is sharded by ``fully_shard``, else `MemTracker`."""
    if sharded:
        from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker

        sharded_tracker = FSDPMemTracker(model, optimizer)
        sharded_tracker.track_inputs((batch,))
        return global_peak_only(sharded_tracker)
    tracker = memory_tracker()
    tracker.track_external(model, optimizer, batch)
    return tracker


def memory_tracker() -> Any:
    """A `MemTracker` that keeps the global peak only (`global_peak_only`)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    return global_peak_only(MemTracker())


def global_peak_only(tracker: MemTracker) -> Any:
    """`tracker` without its per-module peaks (unused here; they walk every module at every op)."""
    tracker._update_peak_stats = functools.partial(_update_global_peak, tracker)  # type: ignore[method-assign]
    return tracker


def tracked_iteration(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: torch.Tensor,
    *,
    sharded: bool,
    loss_fn: Callable[[nn.Module, torch.Tensor], torch.Tensor] = compute_loss,
) -> Tally:
    """Run forward, backward, ``optimizer.step()`` and ``zero_grad()`` once under a tracker; return its tally."""
    tracker = make_tracker(model, optimizer, batch, sharded=sharded)

    def step() -> None:
        optimizer.step()
        optimizer.zero_grad()

    with tracker:
        return iterate(tracker, lambda: loss_fn(model, batch), torch.Tensor.backward, step)


def iterate(tracker: MemTracker, forward: Callable[[], torch.Tensor], backward: Callable[[torch.Tensor], Any],
            step: Callable[[], Any]) -> Tally:
    """One iteration inside an entered `tracker` (its peak restarted first): ``loss = forward()``, ``backward(loss)``,
    ``step()``; each phase's peak, and what is held after each phase (see `Tally`)."""
    _phase_peak(tracker)
    phases: dict[str, dict[str, int]] = {}
    loss = forward()
    after_forward = _ours(tracker.get_tracker_snapshot("current"))
    phases["forward"] = _phase_peak(tracker)
    backward(loss)
    del loss
    after_backward = _ours(tracker.get_tracker_snapshot("current"))
    phases["backward"] = _phase_peak(tracker)
    step()
    after_step = _ours(tracker.get_tracker_snapshot("current"))
    phases["step"] = _phase_peak(tracker)
    return Tally(
        parameters=after_step["parameters"],
        gradients=after_backward["gradients"],
        optimizer=after_step["optimizer"],
        activations=after_forward["activations"],
        phases=phases,
    )


def _update_global_peak(tracker: MemTracker, _state: Any) -> None:
    """The trackers' peak update without their per-module peaks."""
    for dev, snap in tracker._curr_mem_snap.items():
        if tracker._peak_mem.get(dev, 0) < snap["Total"]:
            tracker._peak_mem[dev] = snap["Total"]
            tracker._peak_mem_snap[dev] = dict(snap)


def _phase_peak(tracker: MemTracker) -> dict[str, int]:
    """The categories at the tracker's peak since the last call, then the peak restarted from the current memory
    (the trackers keep one peak per device, in ``_peak_mem`` / ``_peak_mem_snap``)."""
    peak = _ours(tracker.get_tracker_snapshot("peak"))
    current = tracker.get_tracker_snapshot("current")
    tracker._peak_mem = {dev: snap["Total"] for dev, snap in current.items()}
    tracker._peak_mem_snap = {dev: dict(snap) for dev, snap in current.items()}
    return peak


def prime_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Give `optimizer` its state (as a first step would) with zero gradients, then drop the gradients."""
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad()


@contextmanager
def scalar_reads_as_one() -> Iterator[None]:
    """Inside `FakeTensorMode`: a value read out of a fake tensor that has none (``.item()``) is 1 instead of an error.

    Some optimizers read a number out of their state in ``step()`` (Adafactor and ASGD their step count, Adafactor a
    norm); a fake tensor has no value to read. A 1 keeps their arithmetic going; what they allocate depends on
    shapes, not on those numbers (ASGD's averaging coefficient is 1 for its first million steps by default).
    """
    from torch._subclasses.fake_tensor import DataDependentOutputException
    from torch.utils._python_dispatch import TorchDispatchMode

    class _ReadsAsOne(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            try:
                return func(*args, **(kwargs or {}))
            except DataDependentOutputException:  # (a fake tensor made from a Python number still reads as it)
                if func is not torch.ops.aten._local_scalar_dense.default:
                    raise
                dtype = args[0].dtype
                return True if dtype is torch.bool else 1.0 if dtype.is_floating_point else 1

    with _ReadsAsOne():
        yield


def fake_parameters(model: nn.Module, device: torch.device, dtype: torch.dtype | None = None) -> nn.Module:
    """Replace `model`'s (meta) parameters and buffers by empty tensors on `device`, in place; run under `FakeTensorMode`
    they are fake. Tied parameters stay tied. With `dtype`, floating-point ones are made in it (``module.to(dtype)``,
    which cannot swap fake parameters in place)."""
    made: dict[int, Any] = {}
    for sub in model.modules():
        for slots, is_param in ((sub._parameters, True), (sub._buffers, False)):
            for name, tensor in list(slots.items()):
                if tensor is None:
                    continue
                if id(tensor) not in made:
                    kind = dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
                    empty = torch.empty(tensor.shape, dtype=kind, device=device)
                    made[id(tensor)] = nn.Parameter(empty, requires_grad=tensor.requires_grad) if is_param else empty
                slots[name] = made[id(tensor)]
    return model


@contextmanager
def fake_mesh(num_processes: int) -> Iterator[DeviceMesh]:
    """A 1-D CPU `DeviceMesh` over a fake process group of `num_processes` (collectives do nothing), torn down after."""
    import torch.distributed as dist

    if dist.is_initialized():
        raise RuntimeError(
            "estimate_memory for a sharded strategy builds its own (fake) process group and cannot run while this process "
            "has joined one; estimate before init_process_group, or run `trainer estimate-memory` in its own process"
        )
    dist.init_process_group("fake", rank=0, world_size=num_processes)
    try:
        yield ParallelDims(world_size=num_processes).build_mesh("cpu")  # plain FSDP's mesh, built as FSDPStrategy builds it
    finally:
        dist.destroy_process_group()
