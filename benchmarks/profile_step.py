"""Profile one contender of the step benchmark: where do the microseconds per step go?

    python benchmarks/profile_step.py trainer-defaults        # or: raw, limit, accelerator, accumulate, trainer
    python benchmarks/profile_step.py accelerator --steps 2000 --top 30
    python benchmarks/profile_step.py trainer-defaults --bytecodes

By default, cProfile: the functions sorted by their own time, with calls per step, so a per-step cost shows up
as "1 call/step" or more and a one-off cost as a fraction.

``--bytecodes`` counts the Python bytecodes a step executes instead, per function, over a window of steady-state
steps (``sys.settrace`` with opcode events). Unlike a time, the count is the same from run to run, so a change of a
few bytecodes is visible where a timing's noise (±3 µs per process here) hides it; on this benchmark's machine a
bytecode of the framework's per-step code costs roughly 10-15 ns. The framework's own lines (``trainer/``,
``callbacks/``, ``strategies/``) are listed line by line.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import linecache
import pstats
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

FRAMEWORK = ("trainer/", "callbacks/", "strategies/")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("contender", choices=["raw", "limit", "accelerator", "accumulate", "trainer", "trainer-defaults"])
    parser.add_argument("--steps", type=int, default=1000, help="steps in the profiled run (the counted window with --bytecodes)")
    parser.add_argument("--top", type=int, default=25, help="functions to show")
    parser.add_argument("--bytecodes", action="store_true", help="count bytecodes per step instead of timing with cProfile")
    args = parser.parse_args(argv)
    import torch

    from benchmarks import step_time as st

    torch.set_num_threads(1)
    start = 100 if args.bytecodes else 5  # --bytecodes: the window starts after the first progress-bar checks settled
    work = st.Workload("tiny", st.TINY.sizes, st.TINY.batch_size, start=start, steps=args.steps)
    data = st.make_data(work)
    runs = {
        "raw": lambda: st.raw_loop(work, data),
        "limit": lambda: st.raw_indexed_loop(work, data),
        "accelerator": lambda: st.accelerator_loop(work, data),
        "accumulate": lambda: st.accelerator_loop(work, data, accumulate=True),
        "trainer": lambda: st.trainer_fit(work, data, defaults=False),
        "trainer-defaults": lambda: st.trainer_fit(work, data, defaults=True),
    }
    runs[args.contender]()  # warm: first-use imports are not a per-step cost
    if args.bytecodes:
        return _count_bytecodes(st, runs[args.contender], work, args.top)
    profiler = cProfile.Profile()
    profiler.enable()
    runs[args.contender]()
    profiler.disable()
    stats = pstats.Stats(profiler)
    rows = sorted(stats.stats.items(), key=lambda item: -item[1][2])  # type: ignore[attr-defined]
    print(f"{'own µs/step':>11} {'cum µs/step':>11} {'calls/step':>10}  function")
    for (filename, line, name), (_, calls, own, cum, _) in rows[: args.top]:
        where = f"{Path(filename).name}:{line}({name})" if line else name
        print(f"{own / work.num_batches * 1e6:11.2f} {cum / work.num_batches * 1e6:11.2f} {calls / work.num_batches:10.2f}  {where}")
    total = sum(v[2] for v in stats.stats.values()) / work.num_batches * 1e6  # type: ignore[attr-defined]
    print(f"{total:11.2f} µs/step in all (profiled, so inflated), {sum(v[1] for v in stats.stats.values()) / work.num_batches:.0f} calls/step")  # type: ignore[attr-defined]
    return 0


def _count_bytecodes(st: Any, run: Any, work: Any, top: int) -> int:
    """Run `run` once, counting the bytecodes executed between the window's first and last forward call."""
    functions: collections.Counter[str] = collections.Counter()
    lines: collections.Counter[tuple[str, int]] = collections.Counter()

    def where(filename: str) -> str:
        path = Path(filename)
        return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else filename.split("site-packages/")[-1]

    def trace(frame: Any, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        if event == "opcode":
            name = where(frame.f_code.co_filename)
            functions[f"{name}:{frame.f_code.co_name}"] += 1
            if name.startswith(FRAMEWORK):
                lines[(name, frame.f_lineno or 0)] += 1
        return trace

    tick = st.StepClock.tick

    def counting_tick(clock: Any) -> None:
        tick(clock)
        if clock.calls == clock.start:  # the frames already running (the loops) are traced from here on, too
            frame = sys._getframe(1)
            while frame is not None:
                frame.f_trace, frame.f_trace_opcodes = trace, True
                frame = frame.f_back
            sys.settrace(trace)
        elif clock.calls == clock.stop:
            sys.settrace(None)

    st.StepClock.tick = counting_tick
    try:
        run()
    finally:
        st.StepClock.tick = tick
        sys.settrace(None)
    steps = work.steps
    ours = sum(n for name, n in functions.items() if name.startswith(FRAMEWORK))
    print(f"{sum(functions.values()) / steps:.0f} bytecodes per step, {ours / steps:.0f} of them in the framework's code")
    for name, n in functions.most_common(top):
        print(f"{n / steps:9.2f}  {name}")
    print("\nthe framework's lines (bytecodes per step):")
    for (name, line), n in sorted(lines.items()):
        if n / steps >= 0.5:
            print(f"{n / steps:9.2f}  {name}:{line}  {linecache.getline(str(REPO / name), line).strip()[:100]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
