"""``trainer estimate-memory MODEL ...``: the per-process peak memory of one training iteration, before launching.

    trainer estimate-memory ./llama-70b --strategy fsdp --num_processes 64 --precision bf16-mixed \\
        --activation_checkpointing --batch_size 1 --seq_len 4096 [--json]
    trainer estimate-memory mypkg.models:build_mlp --input_shape 64,512 --batch_size 32
    trainer estimate-memory ./llama-8b --num_processes 8 --batch_size 4 --seq_len 4096 --budget 80GiB

``--budget`` lists the configurations that fit (`trainer.planning.budget`); the global batch it keeps is
``--batch_size × --num_processes``. torch and the planner are imported only when the command runs.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

_STRATEGIES = ("single", "ddp", "fsdp", "deepspeed_stage_2", "deepspeed_stage_3")  # trainer.planning.layouts.STRATEGIES


def add_estimate_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "estimate-memory",
        help="estimate the per-process peak memory of one training iteration",
        description="Run one training iteration (forward, backward, optimizer step) of MODEL on fake tensors under "
        "PyTorch's memory trackers, prepared as the strategy prepares it, and print the per-process peak and its "
        "breakdown. Nothing is allocated.",
    )
    parser.add_argument("model", help="a directory holding a Hugging Face config.json, or 'package.module:factory'")
    parser.add_argument("--strategy", default="single", choices=_STRATEGIES)
    parser.add_argument("--num_processes", type=int, default=1, help="processes of the run (default 1)")
    parser.add_argument("--precision", default="32-true", choices=("32-true", "bf16-mixed", "bf16-true"))
    parser.add_argument(
        "--optimizer", default="adamw",
        help="the optimizer the run steps: a torch.optim short name with torch's defaults (adamw, adam, sgd = SGD without "
        "momentum, so no state; adagrad, rmsprop, ...; default adamw), or a class path (torch.optim.SGD, mypkg.optim:Lion)",
    )
    parser.add_argument(
        "--optimizer_kwargs", nargs="+", default=None, metavar="KEY=VALUE",
        help="keyword arguments for --optimizer, Python literals, e.g. --optimizer torch.optim.SGD --optimizer_kwargs "
        "momentum=0.9 nesterov=True",
    )
    parser.add_argument("--activation_checkpointing", action="store_true", help="recompute each repeated block in backward")
    parser.add_argument("--batch_size", type=int, default=1, help="samples per process (default 1)")
    shape = parser.add_mutually_exclusive_group(required=True)
    shape.add_argument("--seq_len", type=int, help="tokens per sample (a language model)")
    shape.add_argument("--input_shape", type=_shape, help="one sample's shape for other models, e.g. 64,512")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="where the run trains: the optimizer's batched (cuda) or per-tensor (cpu) implementation")
    parser.add_argument("--pp", type=int, default=1, help="pipeline stages, one per process: the estimate of each stage (default 1)")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel processes (not modelled yet: only 1)")
    parser.add_argument("--pipeline_schedule", default="1F1B", choices=("1F1B", "GPipe"), help="with --pp: the schedule (default 1F1B)")
    parser.add_argument("--microbatches", type=int, default=None, help="with --pp: microbatches per step (default: --pp)")
    parser.add_argument("--budget", help="list the configurations that fit this much memory per process, e.g. 80GiB")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    parser.set_defaults(func=run_estimate)


def _shape(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a shape; write comma-separated ints, e.g. 64,512") from None


def run_estimate(args: argparse.Namespace) -> int:
    try:
        return _run(args)
    except (TypeError, ImportError, NotImplementedError) as err:  # a factory returning no module, transformers missing, what is not modelled: one line
        raise ValueError(str(err)) from err


def _run(args: argparse.Namespace) -> int:
    from trainer.planning.memory import estimate_memory, read_size  # lazy: torch only when the command runs
    from trainer.planning.optimizers import parse_kwargs  # lazy: torch only when the command runs

    args.optimizer_kwargs = parse_kwargs(args.optimizer_kwargs or ())
    if args.budget is not None:
        if args.pp != 1 or args.tp != 1:
            raise ValueError(f"--budget searches data-parallel layouts only; drop --pp {args.pp} --tp {args.tp}, or estimate one layout without --budget")
        return _run_plan(args, read_size(args.budget))
    estimate = estimate_memory(
        args.model, strategy=args.strategy, num_processes=args.num_processes, precision=args.precision, optimizer=args.optimizer,
        optimizer_kwargs=args.optimizer_kwargs, activation_checkpointing=args.activation_checkpointing, batch_size=args.batch_size, seq_len=args.seq_len,
        input_shape=args.input_shape, device=args.device, pp=args.pp, tp=args.tp, pipeline_schedule=args.pipeline_schedule,
        microbatches=args.microbatches,
    )
    if args.json:
        print(json.dumps(estimate.to_dict()))
        return 0
    print(_table(estimate))
    return 0


def _table(estimate: Any) -> str:
    from trainer.planning.memory import format_bytes  # lazy: torch only when the command runs

    ac = "on" if estimate.activation_checkpointing else "off"
    title = (f"{estimate.num_parameters:,} parameters; {estimate.strategy} on {estimate.num_processes} process(es), "
             f"{estimate.precision}, {estimate.optimizer_name}, activation checkpointing {ac}, batch {estimate.batch_size} × "
             f"{'×'.join(map(str, estimate.shape))} per process")
    lines = [title, "", f"{'per process':<14}{'largest':>14}{'at the peak':>14}"]
    lines.extend(f"{name:<14}{format_bytes(getattr(estimate, name)):>14}{format_bytes(estimate.at_peak.get(name, 0)):>14}"
                 for name in ("parameters", "gradients", "optimizer", "activations", "temporaries"))
    lines.append(f"{'peak':<14}{format_bytes(estimate.peak):>14}   (in {estimate.peak_phase})")
    if estimate.pp > 1:
        title_pp = f"pipeline of {estimate.pp} stages: the stage with the largest peak above; each stage's peak:"
        lines.extend(["", title_pp, *(f"  stage {i}: {format_bytes(s.peak)} (in {s.peak_phase})" for i, s in enumerate(estimate.stages))])
    lines.append(f"weights only: {format_bytes(estimate.weights_only)} ({estimate.weights_only / max(estimate.peak, 1):.2f}× the peak)")
    return "\n".join(lines)


def _run_plan(args: argparse.Namespace, budget: int) -> int:
    from trainer.planning.budget import plan_memory  # lazy: torch only when the command runs
    from trainer.planning.memory import check_setup  # lazy: torch only when the command runs
    from trainer.planning.models import load_meta_model  # lazy: torch only when the command runs

    shape = (args.seq_len,) if args.seq_len is not None else args.input_shape
    setup = check_setup(strategy="ddp", num_processes=args.num_processes, precision=args.precision, optimizer=args.optimizer,
                        optimizer_kwargs=args.optimizer_kwargs, activation_checkpointing=False, batch_size=args.batch_size, device=args.device, shape=shape)
    plans = plan_memory(load_meta_model(args.model), budget=budget, max_processes=setup.num_processes,
                        global_batch_size=setup.batch_size * setup.num_processes, shape=shape, optimizer=setup.optimizer,
                        device=setup.device)
    if args.json:
        print(json.dumps({"budget": budget, "plans": [p.to_dict() for p in plans]}))
        return 0
    fitting = [p for p in plans if p.fits]
    print(f"{len(fitting)} of {len(plans)} configurations fit {args.budget} per process "
          f"(global batch {setup.batch_size * setup.num_processes}); cheapest in memory traffic first:")
    for plan in plans:
        print(("  " if plan.fits else "  ✗ ") + plan.describe())
    return 0 if fitting else 1
