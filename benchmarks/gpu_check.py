"""Check the large-model paths on CUDA with NCCL: meta init, bf16-true, FSDP2 mixed precision, activation checkpointing,
regional compile, tokens/s of our FSDP2 + AC + compile step against the raw torchtitan-style loop, and (on 4+ GPUs)
FSDP × tensor parallel on a 2-D mesh against raw ``parallelize_module`` + ``fully_shard``.

    torchrun --nproc_per_node 8 benchmarks/gpu_check.py     # N GPUs
    python benchmarks/gpu_check.py                          # 1 GPU, world size 1
    python benchmarks/gpu_check.py --smoke-on-cpu           # the script's own logic on CPU (gloo, tiny shapes, aot_eager)

Prints one table (on rank 0) and exits 0 when every check passes, 1 when one fails, 2 without CUDA. Not run by CI.
The model and both training setups are `benchmarks/scale_scripts/tiny_lm.py`'s, the same as the CPU step benchmark's.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import socket
import statistics
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != HERE]  # see benchmarks/run.py
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from benchmarks.scale_scripts.tiny_lm import (  # noqa: E402
    LMConfig,
    accelerator_setup,
    accelerator_step,
    compiled_blocks,
    make_batches,
    raw_setup,
    raw_step,
    seeded_model,
    timed_rounds,
    warm_up,
)

# correctness checks: small and fast; memory and throughput: large enough that activations and matmuls dominate
CHECK = LMConfig(vocab=1024, dim=256, layers=4, heads=4, seq=256, batch=4)
LARGE = LMConfig(vocab=32000, dim=1024, layers=8, heads=16, seq=1024, batch=8)
SMOKE = LMConfig(vocab=64, dim=32, layers=2, heads=2, seq=16, batch=2)


@dataclass
class Result:
    check: str
    value: str
    expected: str
    ok: bool | None  # None: not run here (said so in the table, never counted as passed)


@dataclass
class Setting:
    cpu: bool
    backend: str
    check: LMConfig
    large: LMConfig
    steps: int
    rounds: int

    @property
    def device(self) -> torch.device:
        return torch.device("cpu") if self.cpu else torch.device("cuda", torch.cuda.current_device())


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    dist.barrier()


def agree(ok: bool) -> bool:
    """True when `ok` holds on every process (a collective)."""
    flag = torch.tensor([0 if ok else 1], device="cuda" if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(flag)
    return int(flag.item()) == 0


def release(accelerator: object = None) -> None:
    """Drop what `accelerator` holds and collect (the prepared optimizer and the accelerator refer to each other)."""
    if accelerator is not None:
        accelerator.free_memory()  # type: ignore[attr-defined]
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def check_meta_init(s: Setting) -> list[Result]:
    """FSDP2 + init_module() (meta) + prepare: the gathered weights equal an eager CPU build with the same seed, bit for bit."""
    accelerator, model, _ = accelerator_setup(s.check, cpu=s.cpu, ac=False, compile_backend=None)
    full = accelerator.get_state_dict(model)  # full weights on process 0, {} elsewhere; a collective
    ok, checksum, reference = True, 0.0, 0.0
    if accelerator.is_main_process:
        expected = seeded_model(s.check).state_dict()
        ok = set(full) == set(expected) and all(torch.equal(full[k].cpu(), expected[k]) for k in expected)
        checksum = sum(float(t.double().sum()) for t in full.values())
        reference = sum(float(t.double().sum()) for t in expected.values())
    ok = agree(ok)
    release(accelerator)
    return [Result("meta init under FSDP2 == seeded single-process init", f"checksum {checksum:.6f} vs {reference:.6f}",
                   "every tensor equal", ok)]


def _losses(setup: Callable[[], tuple[object, torch.nn.Module, torch.optim.Optimizer]], cfg: LMConfig, s: Setting) -> list[float]:
    accelerator, model, optimizer = setup()
    batches = make_batches(cfg, s.steps, rank=dist.get_rank(), device=s.device)
    losses = [float(accelerator_step(accelerator, model, optimizer, x, y)) for x, y in batches]
    release(accelerator)
    return losses


def check_bf16_true(s: Setting) -> list[Result]:
    """``mixed_precision="bf16-true"`` under FSDP2: parameters, AdamW states and compute in bf16; losses near fp32's."""
    return _precision("bf16-true", torch.bfloat16, "bf16-true under FSDP2: shards, AdamW states, compute", s)


def check_bf16_mixed(s: Setting) -> list[Result]:
    """``mixed_precision="bf16"`` under FSDP2 (its MixedPrecisionPolicy): fp32 shards and states, bf16 compute."""
    return _precision("bf16", torch.float32, "FSDP2 bf16 mixed precision: shards, AdamW states, compute", s)


def _precision(precision: str, param_dtype: torch.dtype, name: str, s: Setting) -> list[Result]:
    reference = _losses(lambda: accelerator_setup(s.check, cpu=s.cpu, ac=False, compile_backend=None), s.check, s)
    accelerator, model, optimizer = accelerator_setup(s.check, cpu=s.cpu, ac=False, compile_backend=None, precision=precision)
    batches = make_batches(s.check, s.steps, rank=dist.get_rank(), device=s.device)
    seen: list[torch.dtype] = []
    hook = model.head.register_forward_hook(lambda module, inputs, output: seen.append(output.dtype))
    losses = [float(accelerator_step(accelerator, model, optimizer, x, y)) for x, y in batches]
    hook.remove()
    shards = {p.to_local().dtype for p in model.parameters()}
    states = {v.dtype for state in optimizer.state.values() for k, v in state.items() if k != "step" and torch.is_tensor(v)}
    first = abs(losses[0] - reference[0])
    finite = all(math.isfinite(v) for v in losses)
    ok = agree(shards == {param_dtype} and states == {param_dtype} and seen[0] == torch.bfloat16 and finite and first <= 5e-2)
    release(accelerator)
    return [Result(name, f"shards {_names(shards)}, AdamW states {_names(states)}, head computes in {_name(seen[0])}; "
                   f"|loss - fp32 loss| at step 1 {first:.1e}; {s.steps} steps finite: {finite}",
                   f"shards and states {_name(param_dtype)}, compute bfloat16; ≤ 5e-2", ok)]


def check_activation_checkpointing(s: Setting) -> list[Result]:
    """Peak device memory of one training step with AC lower than without; the losses are the same."""
    peaks, losses = {}, {}
    for ac in (False, True):
        peaks[ac], losses[ac] = _peak_of_step(s, ac)
        release()  # the first model is gone before the second is built
    diff = max(abs(a - b) for a, b in zip(losses[True], losses[False]))
    lower = s.cpu or peaks[True] < peaks[False]  # no device memory to read on the CPU smoke run
    ok = agree(lower and diff <= 1e-4)
    value = "n/a on CPU" if s.cpu else f"{peaks[True]:.0f} MiB with AC vs {peaks[False]:.0f} MiB without ({peaks[True] / peaks[False]:.2f}×)"
    return [Result("activation checkpointing: peak memory of a step (max_memory_allocated)", f"{value}; |Δ loss| {diff:.1e}",
                   "lower with AC; |Δ loss| ≤ 1e-4", ok)]


def _peak_of_step(s: Setting, ac: bool) -> tuple[float, tuple[float, float]]:
    """Peak device memory (MiB) of the second step (the first creates the AdamW states), and both losses."""
    accelerator, model, optimizer = accelerator_setup(s.large, cpu=s.cpu, ac=ac, compile_backend=None)
    batches = make_batches(s.large, 2, rank=dist.get_rank(), device=s.device)
    first = float(accelerator_step(accelerator, model, optimizer, *batches[0]))
    if not s.cpu:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    second = float(accelerator_step(accelerator, model, optimizer, *batches[1]))
    peak = torch.cuda.max_memory_allocated() / 2**20 if not s.cpu else float("nan")
    release(accelerator)
    return peak, (first, second)


def check_compile(s: Setting) -> list[Result]:
    """Regional compile (each block's forward) gives eager's losses within 1e-3."""
    torch._dynamo.reset()
    eager = _losses(lambda: accelerator_setup(s.check, cpu=s.cpu, ac=True, compile_backend=None), s.check, s)
    blocks: list[int] = []

    def setup() -> tuple[object, torch.nn.Module, torch.optim.Optimizer]:
        accelerator, model, optimizer = accelerator_setup(s.check, cpu=s.cpu, ac=True, compile_backend=s.backend)
        blocks.append(compiled_blocks(model))
        return accelerator, model, optimizer

    compiled = _losses(setup, s.check, s)
    diff = max(abs(a - b) for a, b in zip(eager, compiled))
    return [Result(f"regional compile ({s.backend}) vs eager, FSDP2 + AC, {s.steps} steps",
                   f"max |Δ loss| {diff:.1e}; {blocks[0]}/{s.check.layers} blocks compiled", "≤ 1e-3; every block compiled",
                   agree(diff <= 1e-3 and blocks[0] == s.check.layers))]


def check_throughput(s: Setting) -> list[Result]:
    """Tokens/s of ours (FSDP2 + AC + regional compile) against the raw loop with the same three features.

    Both run torchtitan's policy (bf16 parameters in compute, fp32 gradient reduction), passed to ours as
    ``FSDPStrategy(mixed_precision_policy=...)``, so the comparison does not depend on the precision mode's own policy
    (`check_precision` checks that one).
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy

    torch._dynamo.reset()  # graphs compiled for the other checks' shapes would make this one's dynamic-shaped
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    accelerator, model, optimizer = accelerator_setup(s.large, cpu=s.cpu, compile_backend=s.backend, mp_policy=policy)
    raw_model, raw_optimizer = raw_setup(s.large, accelerator.strategy.mesh, device=s.device, compile_backend=s.backend, mp_policy=policy)
    batches = make_batches(s.large, s.steps, rank=dist.get_rank(), device=s.device)
    contenders = {
        "ours": lambda x, y: accelerator_step(accelerator, model, optimizer, x, y),
        "raw": lambda x, y: raw_step(raw_model, raw_optimizer, x, y),
    }
    losses, _ = warm_up(contenders, batches[:3])
    times, _ = timed_rounds(contenders, batches, s.rounds, sync=sync)
    release(accelerator)
    tokens = s.large.batch * s.large.seq * dist.get_world_size()
    ours, raw = statistics.median(times["ours"]), statistics.median(times["raw"])
    ratio = statistics.median(a / b for a, b in zip(times["ours"], times["raw"]))
    same_start = abs(losses["ours"][0] - losses["raw"][0]) <= 1e-3
    return [Result("tokens/s: ours FSDP2+AC+compile vs raw fully_shard+checkpoint+compile (bf16 compute, fp32 reduce)",
                   f"{tokens / ours:,.0f} vs {tokens / raw:,.0f} tokens/s; step time {ratio:.3f}× raw "
                   f"({ours * 1e3:.1f} vs {raw * 1e3:.1f} ms, median of {s.rounds} rounds × {s.steps} steps)",
                   "≤ 1.05× raw; same first loss", agree(same_start and (s.cpu or ratio <= 1.05)))]  # CPU smoke: no verdict on time


def check_2d_mesh(s: Setting) -> list[Result]:
    """FSDP × tensor parallel on a (N/2 × 2) mesh: ours (`ParallelismConfig`) against raw ``parallelize_module`` +
    ``fully_shard`` with the same plan and batches (`benchmarks/nd_scripts/tp_rounds.py`'s model): the same losses, and
    the step time."""
    world = dist.get_world_size()
    name = "FSDP × TP on a 2-D mesh: ours vs raw parallelize_module + fully_shard"
    if world < 4 or world % 2:
        return [Result(name, f"not run: needs an even number ≥ 4 of processes (this run has {world})", "—", None)]
    from torch.distributed.device_mesh import init_device_mesh

    from benchmarks.nd_scripts.tp_rounds import BATCH, PLAN, WIDTH, make_model, raw_setup
    from trainer import Accelerator, ParallelismConfig

    accelerator = Accelerator(cpu=s.cpu, parallelism_config=ParallelismConfig(dp_shard_size=world // 2, tp_size=2, tp_plan=PLAN))
    plain = make_model()
    model, optimizer = accelerator.prepare(plain, torch.optim.AdamW(plain.parameters(), lr=1e-3))
    raw_model, raw_optimizer = raw_setup(init_device_mesh(s.device.type, (world // 2, 2), mesh_dim_names=("dp_shard", "tp")))
    g = torch.Generator().manual_seed(accelerator.strategy.data_parallel_rank)
    batches = [torch.randn(BATCH, WIDTH, generator=g).to(s.device) for _ in range(s.steps)]

    def ours(x: torch.Tensor) -> float:
        loss = model(x).square().mean()
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        return loss.item()

    def raw(x: torch.Tensor) -> float:
        loss = raw_model(x).square().mean()
        loss.backward()
        raw_optimizer.step()
        raw_optimizer.zero_grad()
        return loss.item()

    contenders = {"ours": lambda x, y: ours(x), "raw": lambda x, y: raw(x)}
    pairs = [(x, x) for x in batches]
    losses, _ = warm_up(contenders, pairs[:3])
    times, _ = timed_rounds(contenders, pairs, s.rounds, sync=sync)
    release(accelerator)
    ratio = statistics.median(a / b for a, b in zip(times["ours"], times["raw"]))
    diff = max(abs(a - b) for a, b in zip(losses["ours"], losses["raw"]))
    return [Result(name, f"max |Δ loss| {diff:.1e} over 3 steps; step time {ratio:.3f}× raw", "≤ 1e-4; ≤ 1.05× raw",
                   agree(diff <= 1e-4 and (s.cpu or ratio <= 1.05)))]


CHECKS = (check_meta_init, check_bf16_true, check_bf16_mixed, check_activation_checkpointing, check_compile, check_throughput,
          check_2d_mesh)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _names(dtypes: set[torch.dtype]) -> str:
    return "/".join(sorted(_name(d) for d in dtypes)) or "none"


def _single_process_env() -> None:
    """Started without torchrun: a process group of one."""
    if "WORLD_SIZE" in os.environ:
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="steps per correctness check and per timed round (default 10)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating timed rounds of the throughput check (default 5)")
    parser.add_argument("--backend", default="inductor", help="torch.compile backend (default inductor)")
    parser.add_argument("--smoke-on-cpu", action="store_true",
                        help="run the checks on CPU with gloo and tiny shapes (aot_eager): tests this script, not the GPU paths")
    args = parser.parse_args(argv)
    if not args.smoke_on_cpu and not torch.cuda.is_available():
        print("gpu_check.py needs CUDA (and NCCL for several GPUs): torch.cuda.is_available() is False on this machine. "
              "Run it on a GPU machine: `torchrun --nproc_per_node N benchmarks/gpu_check.py`, or `python benchmarks/gpu_check.py` "
              "for one GPU. (`--smoke-on-cpu` runs the script's logic on CPU with tiny shapes.)", file=sys.stderr)
        return 2
    _single_process_env()
    if args.smoke_on_cpu:
        setting = Setting(cpu=True, backend="aot_eager", check=SMOKE, large=SMOKE, steps=3, rounds=2)
    else:
        setting = Setting(cpu=False, backend=args.backend, check=CHECK, large=LARGE, steps=args.steps, rounds=args.rounds)
    results: list[Result] = []
    for check in CHECKS:
        try:
            results += check(setting)
        except Exception as err:  # a broken path is a failed check; the others still run
            results.append(Result(check.__name__, f"{type(err).__name__}: {err}".splitlines()[0][:200], "no error", False))
            print(traceback.format_exc(), file=sys.stderr)
        release()
    if dist.get_rank() == 0:
        device = "CPU (smoke run)" if setting.cpu else f"{torch.cuda.get_device_name()} × {dist.get_world_size()}"
        print(f"\nlarge-model GPU check — {device}, torch {torch.__version__}, world size {dist.get_world_size()}\n")
        print("| check | result | expected | ok |\n|---|---|---|---|")
        for r in results:
            print(f"| {r.check} | {r.value} | {r.expected} | {'not run' if r.ok is None else 'yes' if r.ok else '**FAILED**'} |")
    failed = [r.check for r in results if r.ok is False]
    if dist.is_initialized():
        dist.destroy_process_group()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
