"""The model and the two training setups the scale benchmarks compare (`benchmarks/memory.py`,
`benchmarks/compile_step.py`, `benchmarks/gpu_check.py`).

`TinyLM` is a small decoder-only transformer (token embedding, pre-norm blocks with causal attention and a GELU
MLP, a final norm and an untied head) whose layers all have torch's ``reset_parameters()``, so a copy built on the
meta device and materialized after sharding equals an eager build with the same seed. Two ways to train it with
FSDP2, activation checkpointing and regional compilation:

* `accelerator_setup`: ours. ``Accelerator(strategy=FSDPStrategy(wrap_classes=[Block],
  activation_checkpointing_policy={Block}), dynamo_plugin=TorchDynamoPlugin(backend, use_regional_compilation=True))``,
  the model built inside ``accelerator.init_module()`` (meta device), then ``prepare``: it shards, each process
  initializes its shards, and each block's forward is compiled (`strategies.compile.apply_compile`).
* `raw_setup`: torchtitan's recipe written by hand. The model built whole (seeded), each block's forward wrapped in
  ``torch.utils.checkpoint.checkpoint`` and then ``torch.compile``, ``fully_shard`` per block and on the root.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class LMConfig:
    """The model's shape, and the batch it trains on (per process)."""

    vocab: int = 256
    dim: int = 256
    layers: int = 4
    heads: int = 4
    seq: int = 64
    batch: int = 8

    @property
    def params(self) -> int:
        per_block = 12 * self.dim * self.dim + 13 * self.dim  # qkv, proj, up, down (+ biases), two LayerNorms
        return 2 * self.vocab * self.dim + self.layers * per_block + 2 * self.dim

    def describe(self) -> str:
        return (f"TinyLM vocab {self.vocab}, dim {self.dim}, {self.layers} blocks, {self.heads} heads ({self.params / 1e6:.1f} M params), "
                f"batch {self.batch} × {self.seq} tokens per process")


# step-time rows on 2 CPU processes: tens of ms per step with one thread each
SMALL = LMConfig(vocab=256, dim=128, layers=4, heads=4, seq=64, batch=4)
# memory rows: ~100 M parameters (400 MB of fp32 weights, 1.6 GB of weights + gradients + AdamW states)
MEMORY = LMConfig(vocab=256, dim=768, layers=14, heads=12, seq=128, batch=2)


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention and a 4× GELU MLP, each added to the residual."""

    def __init__(self, cfg: LMConfig) -> None:
        super().__init__()
        self.heads = cfg.heads
        self.norm1 = nn.LayerNorm(cfg.dim)
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim)
        self.proj = nn.Linear(cfg.dim, cfg.dim)
        self.norm2 = nn.LayerNorm(cfg.dim)
        self.up = nn.Linear(cfg.dim, 4 * cfg.dim)
        self.down = nn.Linear(4 * cfg.dim, cfg.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(attention)
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class TinyLM(nn.Module):
    def __init__(self, cfg: LMConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab, cfg.dim)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def make_batches(cfg: LMConfig, count: int, *, rank: int = 0, device: torch.device | str = "cpu") -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`count` (inputs, targets) pairs of random tokens for process `rank` (the same on every call)."""
    generator = torch.Generator().manual_seed(1234 + rank)
    out = []
    for _ in range(count):
        tokens = torch.randint(0, cfg.vocab, (cfg.batch, cfg.seq + 1), generator=generator)
        out.append((tokens[:, :-1].to(device), tokens[:, 1:].to(device)))
    return out


def seeded_model(cfg: LMConfig, seed: int = 0) -> TinyLM:
    """The reference: `TinyLM` built eagerly on the CPU after ``torch.manual_seed(seed)``."""
    torch.manual_seed(seed)
    return TinyLM(cfg)


def accelerator_setup(
    cfg: LMConfig, *, cpu: bool, ac: bool = True, compile_backend: str | None = "inductor", precision: str = "no", seed: int = 0,
    empty_init: bool = True, lr: float = 1e-3, mp_policy: Any = None,
) -> tuple[Any, nn.Module, torch.optim.Optimizer]:
    """Ours: ``(accelerator, model, optimizer)``, built empty, sharded, activation-checkpointed and compiled per block.

    `precision` is the Accelerator's ``mixed_precision``; `mp_policy` an explicit FSDP2 ``MixedPrecisionPolicy`` instead.
    """
    from strategies import FSDPStrategy
    from trainer import Accelerator, TorchDynamoPlugin

    strategy = FSDPStrategy(cpu=cpu, wrap_classes=[Block], activation_checkpointing_policy={Block} if ac else None, precision=precision,
                            mixed_precision_policy=mp_policy)
    dynamo = TorchDynamoPlugin(backend=compile_backend or "no", use_regional_compilation=True)
    accelerator = Accelerator(strategy=strategy, mixed_precision=None if precision == "no" else precision, dynamo_plugin=dynamo)
    torch.manual_seed(seed)
    with accelerator.init_module(empty_init=empty_init):
        model = TinyLM(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model, optimizer = accelerator.prepare(model, optimizer)  # shards, initializes the shards, then compiles each block
    return accelerator, model, optimizer


def raw_setup(
    cfg: LMConfig, mesh: Any, *, device: torch.device | str = "cpu", ac: bool = True, compile_backend: str | None = "inductor",
    mp_policy: Any = None, seed: int = 0, lr: float = 1e-3,
) -> tuple[nn.Module, torch.optim.Optimizer]:
    """torchtitan's order by hand: AC, then compile, per block; ``fully_shard`` per block and on the root; AdamW."""
    from torch.distributed.fsdp import fully_shard
    from torch.utils.checkpoint import checkpoint

    model = seeded_model(cfg, seed).to(device)
    kwargs: dict[str, Any] = {"mesh": mesh} if mp_policy is None else {"mesh": mesh, "mp_policy": mp_policy}
    for block in model.blocks:
        forward: Callable[..., torch.Tensor] = block.forward
        if ac:
            forward = _checkpointed(forward, checkpoint)
        if compile_backend is not None:
            forward = torch.compile(forward, backend=compile_backend)
        block.forward = forward  # type: ignore[method-assign]
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    return model, torch.optim.AdamW(model.parameters(), lr=lr)


def _checkpointed(forward: Callable[..., torch.Tensor], checkpoint: Callable[..., Any]) -> Callable[..., torch.Tensor]:
    def run(x: torch.Tensor) -> torch.Tensor:
        return checkpoint(forward, x, use_reentrant=False)

    return run


def compiled_blocks(model: nn.Module) -> int:
    """How many of `model`'s blocks have a forward compiled by `strategies.compile` (its marker on the function)."""
    return sum(bool(getattr(block.forward, "_trainwright_compiled", False)) for block in model.blocks)


def raw_step(model: nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    optimizer.zero_grad()
    loss = lm_loss(model(inputs), targets)
    loss.backward()
    optimizer.step()
    return loss.detach()


def accelerator_step(accelerator: Any, model: nn.Module, optimizer: torch.optim.Optimizer, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    optimizer.zero_grad()
    loss = lm_loss(model(inputs), targets)
    accelerator.backward(loss)
    optimizer.step()
    return loss.detach()


Step = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def warm_up(contenders: dict[str, Step], batches: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[dict[str, list[float]], dict[str, float]]:
    """Run each contender over `batches` (compilation happens here); returns its losses and the seconds it took."""
    losses: dict[str, list[float]] = {}
    seconds: dict[str, float] = {}
    for name, step in contenders.items():
        begin = time.perf_counter()
        losses[name] = [float(step(x, y)) for x, y in batches]
        seconds[name] = time.perf_counter() - begin
    return losses, seconds


def timed_rounds(
    contenders: dict[str, Step], batches: list[tuple[torch.Tensor, torch.Tensor]], rounds: int, sync: Callable[[], None],
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Seconds per step of each contender, one value per round: wall clock, and this process's CPU time.

    A round runs each contender over `batches`, the order rotating from round to round. `sync` waits for every process
    (and the device) before and after each contender's steps. The CPU time leaves out the time this process was not
    running (waiting for another process, or descheduled by other jobs on a busy machine).
    """
    names = list(contenders)
    wall: dict[str, list[float]] = {name: [] for name in names}
    cpu: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[: r % len(names)]:
            sync()
            begin, begin_cpu = time.perf_counter(), time.process_time()
            for x, y in batches:
                contenders[name](x, y)
            sync()
            cpu[name].append((time.process_time() - begin_cpu) / len(batches))
            wall[name].append((time.perf_counter() - begin) / len(batches))
    return wall, cpu


def local_checksum(model: nn.Module) -> torch.Tensor:
    """Per-tensor (sum, sum of squares, sum weighted by position) of this process's shards, float64, in a fixed order.

    All-reduced over the processes (SUM) it is the same for any sharding of the same weights, up to float64 rounding.
    """
    rows = []
    for _, tensor in sorted(model.state_dict().items()):
        local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
        flat = local.detach().reshape(-1).double().cpu()
        offset = _global_offset(tensor)
        weights = torch.arange(offset, offset + flat.numel(), dtype=torch.float64).mul_(1.0 / max(1, tensor.numel())).add_(1.0)
        rows.append(torch.stack([flat.sum(), flat.square().sum(), (flat * weights).sum()]))
    return torch.stack(rows)


def _global_offset(tensor: torch.Tensor) -> int:
    """Where this process's slice of a (dim-0 sharded) DTensor starts in the flattened full tensor; 0 for a plain one."""
    placements = getattr(tensor, "placements", None)
    if placements is None:
        return 0
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    _, offset = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh, placements)
    return offset[0] * math.prod(tensor.shape[1:]) if offset else 0
