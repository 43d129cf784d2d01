"""``trainer test``: a distributed self-check run under the configured launch.

``trainer test`` launches this module (``python -m trainer.cli.selftest``) with the same settings
``trainer launch`` would use. Each worker builds an ``Accelerator`` and checks, across all processes:
the process layout, collectives (gather, reduce, broadcast, objects, unequal shapes), data sharding
(every sample seen exactly once through ``gather_for_metrics``) and a few training steps (loss goes down,
parameters stay identical on every rank). Any failed check raises, so the job exits non-zero.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

from trainer.cli.config import add_setting_arguments, resolve_settings
from trainer.cli.launch import launch_settings


class SelfTestFailure(RuntimeError):
    """A self-test check found a wrong value."""


def _expect(ok: bool, what: str) -> None:
    if not ok:
        raise SelfTestFailure(what)


def check_layout(acc: Any) -> None:
    """The Accelerator sees the processes torchrun started."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    _expect(acc.num_processes == world, f"num_processes={acc.num_processes}, but WORLD_SIZE={world}")
    _expect(acc.process_index == rank, f"process_index={acc.process_index}, but RANK={rank}")
    _expect(acc.is_main_process == (rank == 0), f"is_main_process={acc.is_main_process} on rank {rank}")


def check_collectives(acc: Any) -> None:
    """gather, reduce, broadcast, object collectives and gathering unequal shapes."""
    import torch

    n, rank = acc.num_processes, acc.process_index
    gathered = acc.gather(torch.tensor([rank], device=acc.device)).cpu()
    _expect(gathered.tolist() == list(range(n)), f"gather gave {gathered.tolist()}, expected {list(range(n))}")
    total = acc.reduce(torch.ones(3, device=acc.device), reduction="sum").cpu()
    _expect(total.tolist() == [float(n)] * 3, f"reduce(sum) gave {total.tolist()}, expected {[float(n)] * 3}")
    value = acc.broadcast(torch.full((2,), float(rank), device=acc.device), from_process=0).cpu()
    _expect(value.tolist() == [0.0, 0.0], f"broadcast from 0 gave {value.tolist()} on rank {rank}")
    obj = acc.broadcast_object({"from": rank} if rank == 0 else None, from_process=0)
    _expect(obj == {"from": 0}, f"broadcast_object gave {obj!r} on rank {rank}")
    objects = acc.gather_object([f"rank{rank}"])
    _expect(list(objects) == [f"rank{r}" for r in range(n)], f"gather_object gave {objects!r}")
    ragged = torch.arange(rank + 1, device=acc.device)
    padded = acc.pad_across_processes(ragged, dim=0, pad_index=-1)
    _expect(padded.shape[0] == n, f"pad_across_processes gave length {padded.shape[0]}, expected {n}")
    _expect(acc.gather(padded).shape[0] == n * n, "gather of padded tensors has the wrong length")


def check_sharding(acc: Any, length: int = 11, batch_size: int = 2) -> None:
    """Each rank gets its own share; gather_for_metrics sees every sample exactly once."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    loader = acc.prepare(DataLoader(TensorDataset(torch.arange(length)), batch_size=batch_size))
    seen: list[int] = []
    local: list[int] = []
    for (batch,) in loader:
        local.extend(batch.cpu().tolist())
        seen.extend(acc.gather_for_metrics(batch).cpu().tolist())
    _expect(sorted(seen) == list(range(length)), f"gather_for_metrics saw {sorted(seen)}, expected 0..{length - 1}")
    shares = acc.gather_object([local])
    if acc.num_processes > 1:
        _expect(shares[0] != shares[1], f"ranks 0 and 1 got the same batches {shares[0]}")


def check_training(acc: Any, steps: int = 8) -> None:
    """A few optimizer steps: the loss goes down and parameters stay in sync across ranks."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from trainer.utils import set_seed  # lazy: the CLI imports no torch (these checks run in the launched workers)

    set_seed(0)
    x = torch.randn(64, 4)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]) + 0.1
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer, loader = acc.prepare(model, optimizer, DataLoader(TensorDataset(x, y), batch_size=8))
    losses = []
    for step, (xb, yb) in enumerate(loader):
        if step == steps:
            break
        optimizer.zero_grad()
        with acc.autocast():
            loss = torch.nn.functional.mse_loss(model(xb).float(), yb)
        acc.backward(loss)
        optimizer.step()
        losses.append(acc.reduce(loss.detach(), reduction="mean").item())
    _expect(losses[-1] < losses[0], f"loss did not go down over {len(losses)} steps: {losses}")
    flat = torch.cat([p.detach().reshape(-1) for p in acc.unwrap_model(model).parameters()]).float()
    everyone = acc.gather(flat.unsqueeze(0)).cpu()
    spread = (everyone - everyone[0]).abs().max().item()
    _expect(spread == 0.0, f"parameters differ across ranks after training (max difference {spread})")


CHECKS: list[tuple[str, Callable[[Any], None]]] = [
    ("process layout", check_layout),
    ("collectives", check_collectives),
    ("data sharding", check_sharding),
    ("training steps", check_training),
]


def run_checks() -> int:
    """Run every check in this worker; return 0 when all pass."""
    from trainer import Accelerator  # lazy: the CLI imports no torch (these checks run in the launched workers)

    acc = Accelerator()
    acc.print(f"Trainwright self-test: {acc.num_processes} process(es), device {acc.device}, "
              f"strategy {type(acc.strategy).__name__}, mixed_precision {acc.mixed_precision}")  # fmt: skip
    for name, check in CHECKS:
        try:
            check(acc)
        except Exception as err:
            print(f"  [FAILED] {name} on rank {acc.process_index}: {type(err).__name__}: {err}", file=sys.stderr, flush=True)
            raise
        acc.wait_for_everyone()
        acc.print(f"  [ok] {name}")
    acc.print(f"Trainwright self-test passed on {acc.num_processes} process(es).")
    acc.end_training()
    return 0


def add_test_parser(subparsers: Any) -> None:
    """Register ``trainer test``."""
    parser = subparsers.add_parser(
        "test", help="run a distributed self-check under the configured launch settings"
    )
    parser.add_argument("--config_file", help="config file to read the launch settings from")
    add_setting_arguments(parser)
    parser.set_defaults(func=test_command)


def test_command(args: argparse.Namespace) -> int:
    """Run ``trainer test``: launch this module's checks and report success or failure."""
    settings, path = resolve_settings(args)
    print(f"trainer test: settings from {path or 'built-in defaults'}", flush=True)
    code = launch_settings(settings, "trainer.cli.selftest", [], module=True)
    if code == 0:
        print("trainer test: success - the distributed setup works.", flush=True)
    else:
        print(f"trainer test: FAILED (exit code {code}); see the errors above", file=sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(run_checks())
