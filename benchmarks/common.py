"""Timing and reporting shared by the benchmark sections.

Every section measures its contenders in *interleaved rounds*: in each round every contender runs once (in
an order rotated from round to round), and each contender's time is divided by the baseline's time of the
same round. A section reports, per contender, the median of its own times and the min / median / max of its
per-round ratios. Pairing within a round cancels most of the drift of a shared, busy machine.
"""

from __future__ import annotations

import gc
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def repo_env(**extra: str) -> dict[str, str]:
    """The environment for child processes: the repository importable, threads as in this process."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])
    env.update(extra)
    return env


@dataclass
class Row:
    """One contender's result: its times (one per round) and its ratios to the baseline of the same round."""

    name: str
    unit: str
    times: list[float] = field(default_factory=list)
    ratios: list[float] = field(default_factory=list)
    target: str = ""
    note: str = ""
    met: bool | None = None  # set when the target is not a plain "≤ ratio"

    @property
    def median(self) -> float:
        return statistics.median(self.times) if self.times else float("nan")

    def ratio_stats(self) -> tuple[float, float, float]:
        if not self.ratios:
            return (float("nan"),) * 3  # type: ignore[return-value]
        return min(self.ratios), statistics.median(self.ratios), max(self.ratios)


@dataclass
class Section:
    """A titled table of rows, plus free-text notes (skipped contenders, checks that ran)."""

    title: str
    baseline: str
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    with_ratios: bool = True


def interleaved(
    contenders: dict[str, Callable[[], float]], baseline: str, rounds: int, *, unit: str, scale: float = 1.0,
    before: Callable[[], None] | None = None,
) -> dict[str, Row]:
    """Run every contender once per round (rotating the order) and pair each time with the baseline's.

    Each callable returns the time it measured (seconds); `scale` converts it to `unit` for display. `before` runs
    before each contender (untimed: the contenders time themselves), after a garbage collection.
    """
    names = list(contenders)
    rows = {name: Row(name, unit) for name in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        measured: dict[str, float] = {}
        for name in order:
            gc.collect()
            if before is not None:
                before()
            measured[name] = contenders[name]() * scale
        for name in names:
            rows[name].times.append(measured[name])
            rows[name].ratios.append(measured[name] / measured[baseline])
    return rows


def format_section(section: Section) -> str:
    """The section as a markdown table (the same text goes to the terminal and to docs/benchmarks.md)."""
    unit = section.rows[0].unit if section.rows else ""
    if not section.with_ratios:
        lines = [f"### {section.title}", "", f"| | median ({unit}) | min | max |", "|---|---:|---:|---:|"]
        lines += [f"| {r.name} | {_num(r.median)} | {_num(min(r.times))} | {_num(max(r.times))} |" for r in section.rows]
        return "\n".join([*lines, "", *(f"- {note}" for note in section.notes)]).rstrip() + "\n"
    lines = [
        f"### {section.title}",
        "",
        f"| | median ({unit}) | × {section.baseline}: min | median | max | target |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for row in section.rows:
        lo, med, hi = row.ratio_stats()
        name = row.name + (f" ({row.note})" if row.note else "")
        lines.append(f"| {name} | {_num(row.median)} | {lo:.3f} | **{med:.3f}** | {hi:.3f} | {row.target} |")
    lines.extend(["", *(f"- {note}" for note in section.notes)])
    return "\n".join(lines).rstrip() + "\n"


def target_met(row: Row) -> bool | None:
    """Whether the row's median meets its target (``"≤ 1.05"`` style targets, or the row's own verdict)."""
    if row.met is not None or not row.target.startswith("≤ "):
        return row.met
    try:
        return row.ratio_stats()[1] <= float(row.target[2:].split()[0])
    except ValueError:
        return None


def format_summary(sections: list[Section]) -> str:
    """One line per target: the measurement, its median ratio and whether it meets the target."""
    lines = ["### Summary against the targets", "", "| measurement | median ratio | target | met |", "|---|---:|---|---|"]
    for section in sections:
        for row in section.rows:
            if row.target:
                met = target_met(row)
                verdict = "n/a" if met is None else ("yes" if met else "**no**")
                lines.append(f"| {section.title}: {row.name} | {row.ratio_stats()[1]:.3f} | {row.target} | {verdict} |")
    return "\n".join(lines) + "\n"


def _num(value: float) -> str:
    if value != value:  # nan
        return "n/a"
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.3f}"


def machine_description() -> str:
    """One paragraph on the hardware and software the numbers come from."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as handle:
            cpu = next(line.split(":", 1)[1].strip() for line in handle if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (
        f"{os.cpu_count()} CPU cores ({cpu}), no GPU; Python {platform.python_version()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} torch threads; {platform.system()} {platform.release()}; load average at start {load:.1f}."
    )


def run_python(code: str, *, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run ``python -c code`` in a fresh interpreter (from a neutral directory), raising on failure."""
    done = subprocess.run(
        [sys.executable, "-c", code], env=env or repo_env(), cwd="/", capture_output=True, text=True, timeout=timeout,
    )
    if done.returncode != 0:
        raise RuntimeError(f"python -c {code!r} failed with exit code {done.returncode}:\n{done.stderr[-2000:]}")
    return done


def timed_process(args: list[str], *, env: dict[str, str] | None = None, timeout: float = 300) -> float:
    """Wall time of a whole child process (seconds), raising when it fails."""
    start = time.perf_counter()
    done = subprocess.run(args, env=env or repo_env(), cwd="/", capture_output=True, text=True, timeout=timeout)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed with exit code {done.returncode}:\n{done.stderr[-2000:]}")
    return elapsed
