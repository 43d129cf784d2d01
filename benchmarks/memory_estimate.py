"""The memory estimate against the measured peak of one training iteration, over a grid of configurations.

    python -m benchmarks.memory_estimate [--quick] [--strategies deepspeed_stage_2,deepspeed_stage_3] [--markdown out.md]
    python -m benchmarks.memory_estimate --gpu      # on a CUDA machine: the estimate against torch.cuda.max_memory_allocated

Grid: a tiny ``transformers`` Llama (built locally from `LlamaConfig`: hidden 64, 2 layers, vocabulary 128; batch
8 × 128 tokens) and an MLP (4 blocks of 512 → 1024 → 512; batch 8 × 64 × 512) × single / DDP / FSDP2 (2 processes)
/ ZeRO-2 / ZeRO-3 × activation checkpointing off/on × 32-true / bf16-mixed / bf16-true × AdamW / SGD (torch's default: no momentum) / SGD with momentum 0.9.

*Predicted*: `trainer.utils.estimate_memory` (fake tensors, nothing allocated). *Measured*: one real iteration on the
CPU, set up by the real strategy, under PyTorch's trackers (`trainer.planning.measure.measure_iteration`: `MemTracker`,
and `FSDPMemTracker` for FSDP2, in a real 2-process gloo group; for DeepSpeed, `MemTracker` entered before the engine
is built), after one untracked iteration. *Weights only*: the whole model's weights in the parameter dtype, what
`accelerate estimate-memory` reports, as a fraction of the measured peak.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainer.planning.layouts import Setup
from trainer.planning.measure import measure_iteration
from trainer.planning.memory import estimate_setup
from trainer.planning.models import meta_copy

TOLERANCE = 0.10


class Block(nn.Module):
    def __init__(self, width: int = 512, hidden: int = 1024) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(width, hidden), nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(x)))


class MLP(nn.Module):
    """Four residual blocks of 512 → 1024 → 512 (input_shape (64, 512))."""

    def __init__(self, blocks: int = 4) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(blocks))
        self.head = nn.Linear(512, 512)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)  # type: ignore[no-any-return]


class StagedMLP(nn.Module):
    """64 → 256, four 256² layers, 256 → 64, split into pipeline stages: its forward skips what its stage does not hold."""

    def __init__(self) -> None:
        super().__init__()
        self.embed: nn.Module | None = nn.Linear(64, 256)
        self.layers = nn.ModuleList([nn.Linear(256, 256) for _ in range(4)])
        self.head: nn.Module | None = nn.Linear(256, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return self.head(x) if self.head is not None else x


def tiny_llama() -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=64, intermediate_size=172, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                         vocab_size=128, max_position_embeddings=256)
    return LlamaForCausalLM(config)


OPTIMIZERS: tuple[Any, ...] = ("adamw", "sgd", functools.partial(torch.optim.SGD, momentum=0.9))
MODELS: dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]] = {"llama": (tiny_llama, (128,)), "mlp": (MLP, (64, 512))}
STRATEGY_PROCESSES = {"single": 1, "ddp": 2, "fsdp": 2, "deepspeed_stage_2": 2, "deepspeed_stage_3": 2}


def grid(models: Iterable[str], *, quick: bool, batch_size: int = 8,
         strategies: Iterable[str] = tuple(STRATEGY_PROCESSES)) -> list[tuple[str, Setup]]:
    """(model name, setup) for every configuration of the grid (``quick``: AdamW only), of `strategies`."""
    optimizers = ("adamw",) if quick else OPTIMIZERS
    out = []
    for name, strategy, ac, precision, opt in itertools.product(
        models, strategies, (False, True), ("32-true", "bf16-mixed", "bf16-true"), optimizers
    ):
        if strategy.startswith("deepspeed") and precision == "bf16-true":
            continue  # refused: DeepSpeed keeps float32 master weights
        out.append((name, Setup(strategy=strategy, num_processes=STRATEGY_PROCESSES[strategy], precision=precision, optimizer=opt,
                                activation_checkpointing=ac, batch_size=batch_size, shape=MODELS[name][1], device="cpu")))
    return out


def measure_all(configs: list[tuple[str, Setup]]) -> list[dict[str, int]]:
    """Measure each configuration in this process (a process group already joined for ddp/fsdp); tallies as dicts.
    One torch thread while measuring: on a busy machine two threads wait on each other over these tiny models."""
    out, threads = [], torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for name, setup in configs:
            torch.manual_seed(0)
            tally = measure_iteration(MODELS[name][0](), setup)
            out.append({"peak": tally.peak, "parameters": tally.parameters, "optimizer": tally.optimizer})
    finally:
        torch.set_num_threads(threads)
    return out


def _row(name: str, setup: Setup, measured: dict[str, int] | None) -> dict[str, Any]:
    torch.manual_seed(0)
    estimate = estimate_setup(meta_copy(MODELS[name][0]()), setup)
    row: dict[str, Any] = {"model": name, "strategy": setup.strategy, "processes": setup.num_processes, "ac": setup.activation_checkpointing,
                           "precision": setup.precision, "optimizer": setup.optimizer.name, "predicted": estimate.peak,
                           "predicted_parameters": estimate.parameters, "predicted_optimizer": estimate.optimizer,
                           "weights_only": estimate.weights_only}
    if measured is not None:
        row.update(measured=measured["peak"], measured_parameters=measured["parameters"], measured_optimizer=measured["optimizer"],
                   error=estimate.peak / measured["peak"] - 1)
    return row


def _worker(rank: int, configs: list[tuple[str, Setup]], port: int, folder: str) -> None:
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "TRAINWRIGHT_PG_TIMEOUT": "120"})
    Path(folder, f"rank{rank}.json").write_text(json.dumps(measure_all(configs)))


def measure_two_processes(configs: list[tuple[str, Setup]]) -> list[dict[str, int]]:
    """`measure_all` on 2 spawned processes joined in one gloo group; process 0's measurements."""
    import tempfile

    import torch.multiprocessing as mp

    from benchmarks.ddp import _free_port

    with tempfile.TemporaryDirectory() as folder:
        mp.start_processes(_worker, args=(configs, _free_port(), folder), nprocs=2, start_method="spawn")
        return json.loads(Path(folder, "rank0.json").read_text())  # type: ignore[no-any-return]


def run(*, quick: bool, strategies: Iterable[str] = tuple(STRATEGY_PROCESSES)) -> list[dict[str, Any]]:
    configs = grid(MODELS, quick=quick, strategies=strategies)
    single = [i for i, (_, setup) in enumerate(configs) if setup.strategy == "single"]
    distributed = [i for i, (_, setup) in enumerate(configs) if i not in single]
    measured = dict(zip(distributed, measure_two_processes([configs[i] for i in distributed]), strict=True)) if distributed else {}
    measured.update(zip(single, measure_all([configs[i] for i in single]), strict=True))
    return [_row(name, setup, measured.get(i)) for i, (name, setup) in enumerate(configs)]


def gpu_llama() -> nn.Module:
    """A ~150 M-parameter Llama for the GPU rows (hidden 1024, 8 layers, vocabulary 32,000)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16, num_key_value_heads=16,
                         vocab_size=32000, max_position_embeddings=2048)
    return LlamaForCausalLM(config)


def run_gpu() -> list[dict[str, Any]]:
    """Single-GPU rows: the estimate (``device="cuda"``) against ``torch.cuda.max_memory_allocated`` of one iteration."""
    from trainer.planning.measure import measure_cuda_peak

    rows = []
    for precision, ac, opt in itertools.product(("32-true", "bf16-mixed", "bf16-true"), (False, True), OPTIMIZERS):
        setup = Setup(strategy="single", num_processes=1, precision=precision, optimizer=opt, activation_checkpointing=ac,
                      batch_size=4, shape=(1024,), device="cuda")
        torch.manual_seed(0)
        model = gpu_llama()
        estimate = estimate_setup(meta_copy(model), setup)
        measured = measure_cuda_peak(model, setup)
        del model
        torch.cuda.empty_cache()
        rows.append({"model": "llama-150m", "strategy": "single", "processes": 1, "ac": ac, "precision": precision, "optimizer": setup.optimizer.name,
                     "predicted": estimate.peak, "predicted_parameters": estimate.parameters,
                     "predicted_optimizer": estimate.optimizer, "weights_only": estimate.weights_only,
                     "measured": measured, "measured_parameters": estimate.parameters, "measured_optimizer": estimate.optimizer,
                     "error": estimate.peak / measured - 1})
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    mib = 2**20
    header = ("| model | strategy | AC | precision | optimizer | predicted peak | measured peak | error | params pred / meas (MiB) | "
              "optimizer pred / meas (MiB) | weights only |")
    lines = [header, "|---|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        meas = r.get("measured")
        measured = f"{meas / mib:.2f} MiB" if meas else "not measured"
        error = f"{100 * r['error']:+.1f}%" if meas else "—"
        params, optim = (f"{r[f'predicted_{k}'] / mib:.3f} / " + (f"{r[f'measured_{k}'] / mib:.3f}" if f"measured_{k}" in r else "—")
                         for k in ("parameters", "optimizer"))
        weights = f"{r['weights_only'] / meas:.2f}×" if meas else f"{r['weights_only'] / r['predicted']:.2f}× (of predicted)"
        lines.append(f"| {r['model']} | {r['strategy']} ×{r['processes']} | {'on' if r['ac'] else 'off'} | {r['precision']} | "
                     f"{r['optimizer']} | {r['predicted'] / mib:.2f} MiB | {measured} | {error} | {params} | {optim} | {weights} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="AdamW only")
    parser.add_argument("--strategies", default=",".join(STRATEGY_PROCESSES), help="comma-separated; default: all five")
    parser.add_argument("--gpu", action="store_true", help="the single-GPU rows (torch.cuda.max_memory_allocated) instead")
    parser.add_argument("--markdown", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.gpu and not torch.cuda.is_available():
        print("--gpu needs a CUDA device; none is available")
        return 2
    strategies = [name for name in args.strategies.split(",") if name]
    unknown = sorted(set(strategies) - set(STRATEGY_PROCESSES))
    if unknown:
        parser.error(f"--strategies {','.join(unknown)}: choose among {','.join(STRATEGY_PROCESSES)}")
    rows = run_gpu() if args.gpu else run(quick=args.quick, strategies=strategies)
    table = markdown(rows)
    print(table)
    if args.markdown:
        args.markdown.write_text(table + "\n")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    worst = max((abs(r["error"]) for r in rows if "error" in r), default=0.0)
    print(f"\nlargest error: {100 * worst:.2f}% (target ±{100 * TOLERANCE:.0f}%)")
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
