"""Profile one contender of the step benchmark with cProfile: where do the microseconds per step go?

    python benchmarks/profile_step.py trainer-defaults        # or: raw, accelerator, accumulate, trainer
    python benchmarks/profile_step.py accelerator --steps 2000 --top 30

Prints the functions sorted by their own time, with calls per step, so a per-step cost shows up as
"1 call/step" or more and a one-off cost as a fraction.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("contender", choices=["raw", "limit", "accelerator", "accumulate", "trainer", "trainer-defaults"])
    parser.add_argument("--steps", type=int, default=1000, help="steps in the profiled run")
    parser.add_argument("--top", type=int, default=25, help="functions to show")
    args = parser.parse_args(argv)
    import torch

    from benchmarks import step_time as st

    torch.set_num_threads(1)
    work = st.Workload("tiny", st.TINY.sizes, st.TINY.batch_size, start=5, steps=args.steps)
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


if __name__ == "__main__":
    sys.exit(main())
