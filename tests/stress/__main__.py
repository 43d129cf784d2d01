"""Run the stress scenarios many times and report failures per 100 runs.

    python -m tests.stress --runs 50 --load 1            # every scenario 50 times, one busy loop beside
    python -m tests.stress --runs 20 --only validate-only,test-only --json out.json

Runs are sequential (two ranks fill two cores); ``--load N`` keeps N busy-loop processes running for the whole
batch, as a loaded machine would. The table is what ``docs/faults.md`` quotes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.stress.scenarios import SCENARIOS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.stress", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50, help="runs per scenario (default 50)")
    parser.add_argument("--load", type=int, default=0, help="busy-loop processes kept running beside (default 0)")
    parser.add_argument("--only", default="", help="comma-separated scenario names (default: all)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(SCENARIOS)
    unknown = sorted(set(names) - set(SCENARIOS))
    if unknown:
        parser.error(f"unknown scenario(s) {unknown}; known: {', '.join(SCENARIOS)}")
    if args.runs < 1:
        parser.error(f"--runs must be at least 1, got {args.runs}")

    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.load)]
    results = []
    try:
        for name in names:
            scenario = SCENARIOS[name]
            problems, seconds, loads = [], [], []
            with tempfile.TemporaryDirectory(prefix=f"stress-{name}-") as root:
                for attempt in range(args.runs):
                    problem, took = scenario.run(Path(root) / str(attempt))
                    seconds.append(took)
                    loads.append(os.getloadavg()[0])
                    if problem:
                        problems.append({"run": attempt, "problem": problem})
                        print(f"{name} run {attempt}: {problem}", file=sys.stderr, flush=True)
            results.append({"scenario": name, "outcome": scenario.outcome, "runs": args.runs, "failed": len(problems),
                            "per_100": round(100 * len(problems) / args.runs, 1),
                            "median_s": round(statistics.median(seconds), 1),
                            "load_average": [round(min(loads), 1), round(max(loads), 1)], "problems": problems})
            print(f"{name}: {len(problems)} of {args.runs} failed (median {statistics.median(seconds):.1f} s)", flush=True)
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()

    print(f"\n| scenario | a good run | runs | failed | per 100 | median s | load average |  ({args.load} busy loop(s) beside)")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        low, high = r["load_average"]
        print(f"| `{r['scenario']}` | {r['outcome']} | {r['runs']} | {r['failed']} | {r['per_100']} | {r['median_s']} | {low}–{high} |")
    if args.json:
        args.json.write_text(json.dumps({"load": args.load, "results": results}, indent=2))
    return 1 if any(r["failed"] for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
