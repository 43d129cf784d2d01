"""Which configurations fit a memory budget, at a fixed global batch, and why the others do not.

    plans = plan_memory("./llama-8b", budget=80 * 2**30, max_processes=8, global_batch_size=64, seq_len=4096)
    for plan in plans: print(plan.describe())

Every combination of strategy × processes (powers of two up to ``max_processes``) × activation checkpointing ×
precision is tried; for each, the largest micro-batch that fits (the accumulation steps make up the global batch).
Each strategy × precision × activation checkpointing is traced at micro-batch 1 for each process count, and once at
micro-batch 2; the growth from 1 to 2 guesses the largest micro-batch that fits, and that micro-batch is traced
itself to decide (`_PeakModel`), so every configuration said to fit was estimated as it would run. The ones that fit come first, cheapest in memory traffic first: the bytes each process sends
per optimizer step (none on one process; a gradient all-reduce for DDP and ZeRO-2; for FSDP and ZeRO-3 two
parameter all-gathers and a gradient reduce-scatter per micro-batch), then without recomputation (no activation
checkpointing), then fewer accumulation steps.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from trainer.planning.layouts import PRECISIONS, STRATEGIES, Setup
from trainer.planning.memory import format_bytes, tally_setup
from trainer.planning.optimizers import OptimizerLike, resolve_optimizer
from trainer.planning.trace import Tally


@dataclass(frozen=True)
class Plan:
    """One configuration: whether it fits, with which micro-batch and accumulation, its estimate and traffic."""

    strategy: str
    num_processes: int
    precision: str
    activation_checkpointing: bool
    micro_batch_size: int
    accumulation_steps: int
    fits: bool
    peak: int
    traffic: int
    reason: str

    def describe(self) -> str:
        ac = "AC" if self.activation_checkpointing else "no AC"
        head = f"{self.strategy} ×{self.num_processes}, {self.precision}, {ac}"
        if not self.fits:
            return f"{head}: does not fit: {self.reason}"
        return (f"{head}: micro-batch {self.micro_batch_size} × {self.accumulation_steps} accumulation steps, "
                f"peak {format_bytes(self.peak)}, sends {format_bytes(self.traffic)} per step")

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _process_counts(max_processes: int) -> list[int]:
    counts, n = [], 1
    while n <= max_processes:
        counts.append(n)
        n *= 2
    return sorted({*counts, max_processes})


def _candidates(max_processes: int, strategies: tuple[str, ...], precisions: tuple[str, ...]) -> list[tuple[str, int, str, bool]]:
    return [(strategy, processes, precision, ac)
            for strategy in strategies for processes in _process_counts(max_processes)
            if (strategy == "single") == (processes == 1)
            for precision in precisions for ac in (False, True)]


class _PeakModel:
    """Peaks of one strategy × precision × activation checkpointing at any process count N and micro-batch B.

    Traced at (N, 1) for each N asked (DDP's trace does not depend on N), and at (N₀, 2) once: each phase's peak grows
    with B by its growth from 1 to 2 at N₀ (activations do not depend on N). That guess picks the micro-batch; the
    micro-batch chosen is then traced itself (`exact`), so a configuration said to fit was estimated as it runs.
    """

    def __init__(self, base: Any, setup: Setup) -> None:
        self.base, self.setup = base, setup
        self.traces: dict[tuple[int, int], Tally] = {}
        first = 1 if setup.strategy == "single" else 2
        one, two = self.trace(first, 1), self.trace(first, 2)
        self.growth = {phase: max(0, _total(two, phase) - _total(one, phase)) for phase in one.phases}

    def trace(self, processes: int, micro_batch: int) -> Tally:
        key = (2 if self.setup.strategy == "ddp" else processes, micro_batch)
        if key not in self.traces:
            self.traces[key] = tally_setup(self.base, replace(self.setup, num_processes=processes, batch_size=micro_batch))[0]
        return self.traces[key]

    def guess(self, processes: int, micro_batch: int) -> int:
        at_one = self.trace(processes, 1)
        return max(_total(at_one, phase) + self.growth[phase] * (micro_batch - 1) for phase in at_one.phases)

    def exact(self, processes: int, micro_batch: int) -> int:
        return self.trace(processes, micro_batch).peak


def _total(tally: Tally, phase: str) -> int:
    return sum(tally.phases[phase].values())


def _largest_fitting(model: _PeakModel, processes: int, budget: int, per_process: int) -> tuple[int, int]:
    """The largest micro-batch dividing `per_process` that fits (0 if none), and its peak (or the peak at 1)."""
    at_one = model.exact(processes, 1)
    if at_one > budget:
        return 0, at_one
    candidates = [m for m in range(per_process, 1, -1) if per_process % m == 0 and model.guess(processes, m) <= budget]
    for micro in candidates:  # largest first; the guess chose them, a trace of each decides
        peak = model.exact(processes, micro)
        if peak <= budget:
            return micro, peak
    return 1, at_one


def _traffic(setup: Setup, num_parameters: int, accumulation: int) -> int:
    """Bytes one process sends per optimizer step (ring collectives: (N-1)/N of the buffer per all-gather/reduce)."""
    if setup.num_processes == 1:
        return 0
    share = (setup.num_processes - 1) / setup.num_processes
    grad_bytes = num_parameters * (2 if setup.precision == "bf16-true" else 4)
    if setup.sharded:
        compute_bytes = num_parameters * (4 if setup.precision == "32-true" else 2)
        return int(share * (2 * compute_bytes + grad_bytes) * accumulation)
    return int(2 * share * grad_bytes)


def _refused(setup: Setup, reason: str) -> Plan:
    return Plan(strategy=setup.strategy, num_processes=setup.num_processes, precision=setup.precision,
                activation_checkpointing=setup.activation_checkpointing, micro_batch_size=0, accumulation_steps=0,
                fits=False, peak=0, traffic=0, reason=reason)


def _plan_one(models: dict[tuple[str, str, bool], _PeakModel], base: Any, setup: Setup, budget: int, global_batch_size: int) -> Plan:
    if global_batch_size % setup.num_processes:
        return _refused(setup, f"the global batch {global_batch_size} does not split over {setup.num_processes} processes")
    if setup.strategy.startswith("deepspeed") and setup.precision == "bf16-true":
        return _refused(setup, "DeepSpeed keeps float32 master weights: no true bf16")
    key = (setup.strategy, setup.precision, setup.activation_checkpointing)
    try:
        model = models[key] if key in models else models.setdefault(key, _PeakModel(base, setup))
    except ValueError as err:  # e.g. no repeated blocks to checkpoint or shard
        return _refused(setup, str(err))
    per_process = global_batch_size // setup.num_processes
    micro, peak = _largest_fitting(model, setup.num_processes, budget, per_process)
    if not micro:
        return replace(_refused(setup, f"peak {format_bytes(peak)} at micro-batch 1 > budget {format_bytes(budget)}"), peak=peak)
    accumulation = per_process // micro
    return Plan(strategy=setup.strategy, num_processes=setup.num_processes, precision=setup.precision,
                activation_checkpointing=setup.activation_checkpointing, micro_batch_size=micro,
                accumulation_steps=accumulation, fits=True, peak=peak,
                traffic=_traffic(setup, sum(p.numel() for p in base.parameters()), accumulation), reason="")


def plan_memory(base: Any, *, budget: int, max_processes: int, global_batch_size: int, shape: tuple[int, ...],
                optimizer: OptimizerLike = "adamw", device: str = "cuda", strategies: tuple[str, ...] = STRATEGIES,
                precisions: tuple[str, ...] = tuple(PRECISIONS)) -> list[Plan]:
    """Every configuration for a meta model `base` (`load_meta_model`), those that fit first (see the module docstring);
    `strategies` and `precisions` narrow the search."""
    models: dict[tuple[str, str, bool], _PeakModel] = {}
    optimizer = resolve_optimizer(optimizer)
    plans = [
        _plan_one(models, base, Setup(strategy=strategy, num_processes=processes, precision=precision, optimizer=optimizer,
                              activation_checkpointing=ac, batch_size=1, shape=shape, device=device), budget, global_batch_size)
        for strategy, processes, precision, ac in _candidates(max_processes, strategies, precisions)
    ]
    return sorted(plans, key=lambda p: (not p.fits, p.traffic, p.activation_checkpointing, p.accumulation_steps, p.peak))
