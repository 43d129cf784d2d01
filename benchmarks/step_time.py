"""Time per training step: a raw PyTorch loop against the `Accelerator` face and the `Trainer`.

The clock is inside the model: ``Net.forward`` counts its calls and reads ``time.perf_counter()`` at call
``start`` and at call ``stop``, so every contender is timed over the same steady-state window of
``stop - start`` whole steps (forward, backward, optimizer step, logging, progress bar, fetching the next
batch), with the same tiny instrumentation cost, and without the fixed costs of setting up or ending a run.
Those fixed costs are reported separately (whole session time minus ``steps × per-step time``).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import itertools
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from benchmarks.common import Row, Section, interleaved


@dataclass(frozen=True)
class Workload:
    """A model size, a batch size and the timed window (in steps)."""

    name: str
    sizes: tuple[int, ...]
    batch_size: int
    start: int
    steps: int

    @property
    def num_batches(self) -> int:
        return self.start + self.steps + 2


TINY = Workload("tiny MLP 32-64-10, batch 32", (32, 64, 10), 32, start=30, steps=600)
MEDIUM = Workload("medium MLP 1024-4x1024-10, batch 256", (1024, 1024, 1024, 1024, 1024, 10), 256, start=3, steps=10)


class StepClock:
    """Reads the time at the `start`-th and `stop`-th call of `tick`."""

    def __init__(self, start: int, stop: int) -> None:
        self.calls = 0
        self.start = start
        self.stop = stop
        self.t0 = 0.0
        self.t1 = 0.0

    def tick(self) -> None:
        self.calls += 1
        if self.calls == self.start:
            self.t0 = time.perf_counter()
        elif self.calls == self.stop:
            self.t1 = time.perf_counter()

    def per_step(self) -> float:
        if self.t1 <= self.t0 or self.calls < self.stop:
            raise RuntimeError(f"the timed window was not reached: {self.calls} forward calls, needed {self.stop}")
        return (self.t1 - self.t0) / (self.stop - self.start)


class Net(nn.Module):
    """An MLP (ReLU between the layers) whose forward ticks a `StepClock`."""

    def __init__(self, sizes: tuple[int, ...], clock: StepClock) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for i, (a, b) in enumerate(itertools.pairwise(sizes)):
            layers.append(nn.Linear(a, b))
            if i < len(sizes) - 2:
                layers.append(nn.ReLU())
        self.layers = nn.Sequential(*layers)
        self.clock = clock

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.clock.tick()
        return self.layers(x)


@dataclass
class Session:
    """What one run of a contender produced."""

    per_step: float
    total: float
    state: dict[str, torch.Tensor]


def make_data(work: Workload, seed: int = 0) -> TensorDataset:
    gen = torch.Generator().manual_seed(seed)
    n = work.num_batches * work.batch_size
    x = torch.randn(n, work.sizes[0], generator=gen)
    y = torch.randint(0, work.sizes[-1], (n,), generator=gen)
    return TensorDataset(x, y)


def _net(work: Workload) -> Net:
    torch.manual_seed(0)
    return Net(work.sizes, StepClock(work.start, work.start + work.steps))


@contextlib.contextmanager
def _quiet() -> Any:
    """Send stdout/stderr (progress bars, summaries) to /dev/null: formatting still runs, the terminal does not."""
    with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
        yield


def _raw_session(work: Workload, batches: Callable[[], Iterable[Any]], *, unlabelled: bool = False) -> Session:
    """The plain PyTorch step over ``batches()`` (made inside the timed session, as a loader would be).

    `unlabelled`: zero the gradients and step as both faces do, without torch's per-call profiler labels and hook
    checks (`zero_grad_to_none`, `step_optimizer`), so the framework's own cost shows against the same torch work.
    """
    model = _net(work)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    zero_grad: Callable[[], Any] = optimizer.zero_grad
    step: Callable[[], Any] = optimizer.step
    if unlabelled:
        from strategies.optim import step_optimizer, zero_grad_to_none

        zero_grad, step = functools.partial(zero_grad_to_none, optimizer), functools.partial(step_optimizer, optimizer)
    begin = time.perf_counter()
    model.train()
    for x, y in batches():
        zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        step()
    total = time.perf_counter() - begin
    return Session(model.clock.per_step(), total, model.state_dict())


def raw_loop(work: Workload, data: TensorDataset) -> Session:
    """The plain PyTorch loop every other contender is compared with."""
    return _raw_session(work, lambda: DataLoader(data, batch_size=work.batch_size))


def raw_sliced_loop(work: Workload, data: TensorDataset) -> Session:
    """The plain loop without a DataLoader: batches are slices of the tensors (the floor for any loader)."""
    inputs, targets = data.tensors
    size = work.batch_size
    return _raw_session(work, lambda: ((inputs[s:s + size].clone(), targets[s:s + size].clone()) for s in range(0, len(inputs), size)))


def raw_indexed_loop(work: Workload, data: TensorDataset, *, unlabelled: bool = False) -> Session:
    """The limit for our prepared loader: the raw loop over the same batches, each fetched by one indexed read per
    tensor, as the prepared loader fetches them. What a framework row costs beyond this row is its own overhead.
    With `unlabelled`, it zeroes and steps as the faces do (see `_raw_session`)."""
    inputs, targets = data.tensors
    order, size = torch.arange(len(inputs)), work.batch_size
    spans = (order[s:s + size] for s in range(0, len(inputs), size))
    return _raw_session(work, lambda: ((inputs[idx], targets[idx]) for idx in spans), unlabelled=unlabelled)


def accelerator_loop(work: Workload, data: TensorDataset, *, accumulate: bool = False, accelerator_cls: Any = None) -> Session:
    """The same loop written for Accelerate: only ``prepare`` and ``accelerator.backward`` differ."""
    if accelerator_cls is None:
        from trainer import Accelerator as accelerator_cls
    model = _net(work)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    begin = time.perf_counter()
    accelerator = accelerator_cls()
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(data, batch_size=work.batch_size))
    model.train()
    for x, y in loader:
        with accelerator.accumulate(model) if accumulate else contextlib.nullcontext():
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
    total = time.perf_counter() - begin
    net = accelerator.unwrap_model(model)
    return Session(net.clock.per_step(), total, net.state_dict())


def _module_class() -> type:
    from trainer import TrainModule

    class Module(TrainModule):
        def __init__(self, net: Net, log: bool) -> None:
            super().__init__()
            self.net = net
            self.log_every_step = log

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = F.cross_entropy(self.net(x), y)
            if self.log_every_step:
                self.log("train_loss", loss)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    return Module


def trainer_fit(work: Workload, data: TensorDataset, *, defaults: bool, without: str = "") -> Session:
    """`Trainer.fit` for one epoch: barebones, or with the default callbacks and ``self.log`` every step.

    `without` drops one part of the defaults (``"self.log"``, ``"progress bar"``, ``"tracker"``, ``"checkpoint"``)
    for the per-part cost breakdown.
    """
    from trainer import Trainer

    module = _module_class()(_net(work), log=defaults and without != "self.log")
    project = tempfile.mkdtemp(prefix="bench-trainer-")
    off: dict[str, dict[str, Any]] = {"progress bar": {"enable_progress_bar": False}, "tracker": {"log_with": None},
                                     "checkpoint": {"enable_checkpointing": False}}
    try:
        with _quiet():
            begin = time.perf_counter()
            if defaults:
                trainer = Trainer(max_epochs=1, project_dir=project, **off.get(without, {}))
            else:
                trainer = Trainer(max_epochs=1, project_dir=project, enable_progress_bar=False, enable_checkpointing=False,
                                  enable_model_summary=False, log_with=None)
            trainer.fit(module, DataLoader(data, batch_size=work.batch_size))
            total = time.perf_counter() - begin
    finally:
        shutil.rmtree(project, ignore_errors=True)
    return Session(module.net.clock.per_step(), total, module.net.state_dict())


def lightning_fit(work: Workload, data: TensorDataset, *, defaults: bool) -> Session:
    """Lightning's Trainer on the same module (only when ``lightning`` is installed)."""
    import lightning as L

    class Module(L.LightningModule):
        def __init__(self, net: Net, log: bool) -> None:
            super().__init__()
            self.net, self.log_every_step = net, log

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            loss = F.cross_entropy(self.net(batch[0]), batch[1])
            if self.log_every_step:
                self.log("train_loss", loss)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    module = Module(_net(work), defaults)
    project = tempfile.mkdtemp(prefix="bench-lightning-")
    flags = {} if defaults else {"enable_progress_bar": False, "enable_checkpointing": False, "logger": False,
                                 "enable_model_summary": False}
    try:
        with _quiet():
            begin = time.perf_counter()
            trainer = L.Trainer(max_epochs=1, accelerator="cpu", devices=1, default_root_dir=project, **flags)
            trainer.fit(module, DataLoader(data, batch_size=work.batch_size))
            total = time.perf_counter() - begin
    finally:
        shutil.rmtree(project, ignore_errors=True)
    return Session(module.net.clock.per_step(), total, module.net.state_dict())


def contenders(work: Workload, data: TensorDataset) -> tuple[dict[str, Callable[[], Session]], list[str]]:
    """Every contender for `work`, and notes on the ones skipped."""
    runs: dict[str, Callable[[], Session]] = {
        "raw PyTorch loop": lambda: raw_loop(work, data),
        "raw PyTorch loop, again (noise control)": lambda: raw_loop(work, data),
        "raw loop without DataLoader (sliced batches)": lambda: raw_sliced_loop(work, data),
        LIMIT: lambda: raw_indexed_loop(work, data),
        UNLABELLED: lambda: raw_indexed_loop(work, data, unlabelled=True),
        "Accelerator": lambda: accelerator_loop(work, data),
        "Accelerator + accumulate()": lambda: accelerator_loop(work, data, accumulate=True),
        "Trainer barebones": lambda: trainer_fit(work, data, defaults=False),
        "Trainer defaults + self.log": lambda: trainer_fit(work, data, defaults=True),
    }
    if work.name == TINY.name:  # the per-part breakdown of the Trainer defaults, on the small step where it shows
        for part in BREAKDOWN:
            runs[f"Trainer defaults without {part}"] = functools.partial(trainer_fit, work, data, defaults=True, without=part)
    notes = []
    if importlib.util.find_spec("accelerate") is not None:
        from accelerate import Accelerator as HFAccelerator

        runs["HF Accelerate"] = lambda: accelerator_loop(work, data, accelerator_cls=HFAccelerator)
    else:
        notes.append("Hugging Face Accelerate is not installed: its row is skipped.")
    if importlib.util.find_spec("lightning") is not None:
        runs["Lightning Trainer barebones"] = lambda: lightning_fit(work, data, defaults=False)
        runs["Lightning Trainer defaults + self.log"] = lambda: lightning_fit(work, data, defaults=True)
    else:
        notes.append("Lightning is not installed: its rows are skipped.")
    return runs, notes


def check_identical_weights(work: Workload) -> str:
    """Train every contender on the same unshuffled data from the same seed; the weights must match bit for bit."""
    short = Workload(work.name, work.sizes, work.batch_size, start=1, steps=min(work.steps, 60))
    data = make_data(short)
    runs, _ = contenders(short, data)
    reference = runs.pop("raw PyTorch loop")().state
    for name, run in runs.items():
        state = run().state
        different = [k for k in reference if not torch.equal(reference[k], state[k])]
        if different:
            return f"CHECK FAILED: {name} did not reproduce the raw loop's weights bit for bit (differs in {different})."
    return f"{', '.join(runs)}: weights identical to the raw loop, bit for bit, after {short.num_batches} fp32 steps (checked)."


LIMIT = "limit: raw loop, batches by one indexed read each"
UNLABELLED = "limit, zero_grad and step without torch's profiler labels (as the faces)"
BREAKDOWN = ("self.log", "progress bar", "tracker", "checkpoint")

TARGETS = {
    ("tiny", "Accelerator"): "≤ 1.05",
    ("tiny", "Trainer defaults + self.log"): "≤ 1.10",
    ("medium", "Accelerator"): "≤ 1.01",
    ("medium", "Trainer defaults + self.log"): "≤ 1.01",
}
LIMIT_TARGETS = {  # against the limit: the framework's own per-step cost
    ("tiny", "Accelerator"): "≤ 1.05",
    ("tiny", "Trainer defaults + self.log"): "≤ 1.05",
}


def _threaded_once() -> None:
    """Start and join one thread. From then on pthread mutexes are locked where a process that never started one does
    not lock them (about 1 % of a tiny step by perf samples), for good. Lightning's progress bar starts one (tqdm's
    monitor), so without this the rows before its first run would be timed in the other state: now every row of every
    round shares it."""
    thread = threading.Thread(target=lambda: None)
    thread.start()
    thread.join()


def run(*, quick: bool) -> list[Section]:
    """Measure both workloads; one table each."""
    _threaded_once()
    sections = []
    for key, work in (("tiny", TINY), ("medium", MEDIUM)):
        if quick:
            work = Workload(work.name, work.sizes, work.batch_size, work.start, max(work.steps // 3, 5))
        data = make_data(work)
        runs, notes = contenders(work, data)
        # Full runs: a multiple of the contender count, so the rotation puts every contender in every position equally.
        rounds = 3 if quick else len(runs) * (2 if key == "tiny" else 1)
        sessions: dict[str, list[Session]] = {name: [] for name in runs}

        def timed(name: str, runs: dict[str, Any] = runs, sessions: dict[str, list[Session]] = sessions) -> Callable[[], float]:
            def call() -> float:
                session = runs[name]()
                sessions[name].append(session)
                return session.per_step
            return call

        rows = interleaved({name: timed(name) for name in runs}, "raw PyTorch loop", rounds, unit="µs/step", scale=1e6)
        for (k, name), target in TARGETS.items():
            if k == key and name in rows:
                rows[name].target = target
        notes.insert(0, check_identical_weights(work))
        notes.append(f"{rounds} interleaved rounds; each timed window is {work.steps} steps after {work.start} warm-up steps.")
        fixed = {name: statistics.median(1e3 * (s.total - s.per_step * work.num_batches) for s in sessions[name]) for name in runs}
        notes.append("Fixed cost per run beyond its steps (setup, end-of-run checkpoint, teardown; median, ms): "
                     + ", ".join(f"{name} {value:.0f}" for name, value in fixed.items()) + ".")
        sections.append(Section(f"Time per training step — {work.name}", "raw loop", list(rows.values()), notes))
        sections.append(_against_limit(key, work, rows))
        if key == "tiny":
            sections[-1].notes.append(part_costs(work, data, 3 if quick else 9))
    return sections


@contextlib.contextmanager
def _timers(targets: dict[str, list[tuple[Any, str]]]) -> Any:
    """Wrap each function ``owner.name`` of a part in a timer that adds its seconds to ``totals[part]`` (a call inside
    another of the same part counts once, in the outer one); restore them after."""
    totals = dict.fromkeys(targets, 0.0)
    running = dict.fromkeys(targets, 0)
    saved = []
    for part, owner, name in ((part, owner, name) for part, functions in targets.items() for owner, name in functions):
        original = getattr(owner, name)

        def timed(*args: Any, _original: Any = original, _part: str = part, **kwargs: Any) -> Any:
            if running[_part]:
                return _original(*args, **kwargs)
            running[_part] += 1
            start = time.perf_counter()
            try:
                return _original(*args, **kwargs)
            finally:
                totals[_part] += time.perf_counter() - start
                running[_part] -= 1

        saved.append((owner, name, owner.__dict__[name]))
        setattr(owner, name, timed)
    try:
        yield totals
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


def part_costs(work: Workload, data: TensorDataset, rounds: int) -> str:
    """µs per step spent inside each framework part of a `Trainer()` step with ``self.log`` every step, read by
    timers wrapped around those parts in runs of their own (median over `rounds` runs)."""
    from callbacks.progress import ProgressBar
    from trainer.accelerator.stepper import Stepper
    from trainer.fit.module import TrainModule
    from trainer.fit.results import ResultsStore
    from trainer.fit.trainer import Trainer

    targets = {
        "self.log": [(TrainModule, "log")],
        "progress bar (its per-batch hook)": [(ProgressBar, "on_train_batch_end")],
        "CSV tracker (step values to floats and a written, flushed row, every log_every_n_steps)":
            [(ResultsStore, "flush_step"), (Trainer, "send_to_trackers")],
        "zero_grad": [(Stepper, "zero_grad")],
        "backward (with torch's)": [(Stepper, "backward")],
        "optimizer step (with torch's)": [(Stepper, "optimizer_step")],
    }
    per_part: dict[str, list[float]] = {part: [] for part in targets}
    steps: list[float] = []
    for _ in range(rounds):
        with _timers(targets) as totals:
            session = trainer_fit(work, data, defaults=True)
        steps.append(session.per_step * 1e6)
        for part, seconds in totals.items():
            per_part[part].append(seconds / work.num_batches * 1e6)
    parts = {part: statistics.median(values) for part, values in per_part.items()}
    return ("Inside a `Trainer()` step with self.log (timers around each part, in runs of their own; µs per step, median of "
            f"{rounds} runs; each timer adds about 0.2 µs): " + "; ".join(f"{part} {value:.1f}" for part, value in parts.items())
            + f"; the whole step {statistics.median(steps):.1f} (forward, loss, data and the loop are the rest).")


def _against_limit(key: str, work: Workload, rows: dict[str, Row]) -> Section:
    """The same runs, each round's time divided by the limit's time in that round."""
    limit = rows[LIMIT].times
    again = []
    for name, row in rows.items():
        if name.startswith("raw PyTorch loop, again") or name == "raw loop without DataLoader (sliced batches)":
            continue
        copy = Row(name, row.unit, list(row.times), [t / base for t, base in zip(row.times, limit)], LIMIT_TARGETS.get((key, name), ""))
        again.append(copy)
    notes = ["The same rounds as the table above; each time divided by the limit's time in its round."]
    defaults = rows.get("Trainer defaults + self.log")
    parts = [(part, rows[f"Trainer defaults without {part}"]) for part in BREAKDOWN if f"Trainer defaults without {part}" in rows]
    if defaults is not None and parts:
        cost = {part: statistics.median(a - b for a, b in zip(defaults.times, row.times)) for part, row in parts}
        # the loop's own cost against the same torch work: the limit row that skips torch's labels as the faces do
        base, base_name = (rows[UNLABELLED].times, "limit without torch's labels") if UNLABELLED in rows else (limit, "limit")
        own = statistics.median(a - b for a, b in zip(rows["Trainer barebones"].times, base))
        notes.append("Per-step cost of the Trainer defaults (median over rounds of the paired differences, µs): the loop itself "
                     f"(barebones − {base_name}) {own:.1f}; " + "; ".join(f"{part} {value:.1f}" for part, value in cost.items()) + ".")
    if UNLABELLED in rows and key == "tiny":  # the faces skip torch's labels in zero_grad and step: their own cost against a loop that does too
        same_torch = rows[UNLABELLED].times
        own_costs = {name: statistics.median(a - b for a, b in zip(rows[name].times, same_torch))
                     for name in ("Accelerator", "Trainer barebones", "Trainer defaults + self.log") if name in rows}
        notes.append(f"Against the limit row that also skips torch's labels ({UNLABELLED!r}: the same torch work as the faces), "
                     "the faces' own per-step cost (median paired difference, µs): "
                     + "; ".join(f"{name} {value:+.1f}" for name, value in own_costs.items()) + ".")
    return Section(f"Time per training step against the limit — {work.name}", "limit", again, notes)
