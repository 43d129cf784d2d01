"""Run the Trainwright benchmarks and print one table per measurement.

    python benchmarks/run.py            # everything (about 11 minutes on 2 cores)
    python benchmarks/run.py --quick    # fewer rounds and steps (~2-3 minutes): for development
    python benchmarks/run.py --only step,import --markdown results.md

Every number is a median over interleaved rounds; ratios are to the raw PyTorch equivalent measured in the
same round (min / median / max over the rounds). Nothing here asserts on time: the benchmark checks only
correctness (identical weights, identical batches, no optional import) and reports the rest.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from types import SimpleNamespace

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
# `python benchmarks/run.py` puts this folder first on sys.path, where a section module named like a library would
# shadow that library for every package importing it (Accelerate imports deepspeed); the sections are imported
# through the benchmarks package instead.
sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != HERE]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

SECTIONS = ("step", "import", "data", "checkpoint", "async_checkpoint", "ddp", "nd", "pipeline", "fsdp", "deepspeed", "deepspeed_checkpoint", "resume",
            "elastic", "memory", "compile")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds and steps (noisier; for development)")
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections among {', '.join(SECTIONS)}")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch intra-op threads in this process (default 1: on a busy machine, threads waiting for "
                             "each other dominate small steps; 0 keeps torch's default)")
    parser.add_argument("--markdown", type=Path, default=None, help="also write the tables to this markdown file")
    args = parser.parse_args(argv)
    args.only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(args.only) - set(SECTIONS))
    if unknown:
        parser.error(f"--only names unknown section(s) {unknown}; choose among {', '.join(SECTIONS)}")
    if args.threads < 0:
        parser.error(f"--threads={args.threads} must be >= 1, or 0 for torch's default")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    import torch

    from benchmarks import (
        checkpoint,
        checkpoint_async,
        common,
        compile_step,
        data_loading,
        ddp,
        elastic_resume,
        fsdp,
        import_time,
        memory,
        nd_parallel,
        pipeline,
        resume,
        step_time,
        zero,
    )

    if args.threads:
        torch.set_num_threads(args.threads)
    modules = {"step": step_time, "import": import_time, "data": data_loading, "checkpoint": checkpoint, "async_checkpoint": checkpoint_async, "nd": nd_parallel, "pipeline": pipeline, "ddp": ddp, "fsdp": fsdp, "deepspeed": zero, "resume": resume,
               "deepspeed_checkpoint": SimpleNamespace(run=zero.run_checkpoints), "elastic": elastic_resume,
               "memory": memory, "compile": compile_step}
    header = f"Machine: {common.machine_description()}\nMode: {'--quick' if args.quick else 'full'}; started {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.\n"
    print(header, flush=True)
    texts = [header]
    sections = []
    begin = time.perf_counter()
    for name in args.only:
        started = time.perf_counter()
        for section in modules[name].run(quick=args.quick):
            text = common.format_section(section)
            print(text, flush=True)
            texts.append(text)
            sections.append(section)
        print(f"({name}: {time.perf_counter() - started:.0f} s)\n", flush=True)
    summary = common.format_summary(sections)
    print(summary, flush=True)
    texts.insert(1, summary)
    print(f"Total: {time.perf_counter() - begin:.0f} s", flush=True)
    if args.markdown is not None:
        args.markdown.write_text("\n".join(texts))
    failed = [line for text in texts for line in text.splitlines() if "CHECK FAILED" in line]
    if failed:
        print("\n".join(["Correctness checks failed:", *failed]), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
