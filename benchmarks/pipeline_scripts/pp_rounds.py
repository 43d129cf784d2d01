"""A pipeline step on 2 processes: the Accelerator (``ParallelismConfig(pp_size=2, pp_handler=PipelineConfig(schedule))``,
``accelerator.pipeline_step``) against a raw `torch.distributed.pipelining` loop (its own `PipelineStage` of the same
layers, the same schedule with ``scale_grads=False``), in the same job (``trainer launch --num_processes 2 --cpu``).

Usage: pp_rounds.py RESULT.json SCHEDULE ROUNDS STEPS. Both build the same blocks from the same seed and train on the
same batches (4 microbatches); rounds alternate which goes first, each timed between barriers. Rank 0 writes both
sides' seconds per step and their first losses (ours: the batch's loss on every process; raw: the last stage's, summed
over the processes once, outside the timed steps).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from benchmarks.rounds import WIDTH, Block, alternating_rounds

BLOCKS, BATCH, MICROBATCHES = 8, 32, 4


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList([Block() for _ in range(BLOCKS)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(output, target)


def raw_setup(schedule_name: str, device: torch.device) -> tuple[Any, torch.optim.Optimizer, bool, bool]:
    """The loop a torch user writes: this process's stages of the same blocks, the schedule, an optimizer."""
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class

    rank, world = dist.get_rank(), dist.get_world_size()
    cls = get_schedule_class(schedule_name)
    single = issubclass(cls, PipelineScheduleSingle)
    per_rank = 1 if single else 2
    stages_total = world * per_rank
    v_style = schedule_name in ("ZBVZeroBubble", "DualPipeV")
    indices = [rank] if single else ([rank, stages_total - 1 - rank] if v_style else [rank + s * world for s in range(per_rank)])
    blocks = list(Net().layers)
    per_stage = BLOCKS // stages_total
    parts = [nn.Sequential(*blocks[i * per_stage:(i + 1) * per_stage]).to(device) for i in indices]
    stages = [PipelineStage(part, i, stages_total, device) for part, i in zip(parts, indices)]

    def scaled(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return loss_fn(output, target) / MICROBATCHES

    schedule = cls(stages[0] if single else stages, n_microbatches=MICROBATCHES, loss_fn=scaled, scale_grads=False)
    params = [p for part in parts for p in part.parameters()]
    return schedule, torch.optim.AdamW(params, lr=1e-3), 0 in indices, stages_total - 1 in indices


def main() -> None:
    from strategies import PipelineConfig
    from trainer import Accelerator, ParallelismConfig

    result, schedule_name, rounds, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    accelerator = Accelerator(parallelism_config=ParallelismConfig(
        pp_size=2, pp_handler=PipelineConfig(schedule=schedule_name, microbatches=MICROBATCHES)))
    plain = Net()
    model, optimizer = accelerator.prepare(plain, torch.optim.AdamW(plain.parameters(), lr=1e-3))
    device = accelerator.device
    schedule, raw_optimizer, first_stage, last_stage = raw_setup(schedule_name, device)
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(BATCH, WIDTH, generator=g).to(device), torch.randn(BATCH, WIDTH, generator=g).to(device)) for _ in range(8)]

    def ours(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = accelerator.pipeline_step(model, x, target=y, loss_fn=loss_fn)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        return loss

    def raw(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        losses: list[torch.Tensor] = []
        schedule.step(*((x,) if first_stage else ()), target=y if last_stage else None, losses=losses, return_outputs=False)
        raw_optimizer.step()
        raw_optimizer.zero_grad()
        return torch.stack(losses).sum().detach() if losses else torch.zeros(())

    raw_first = raw(*batches[0])
    dist.all_reduce(raw_first)  # (the last stage's loss: the others hold zero; outside the timed steps)
    first = {"ours": ours(*batches[0]).item(), "raw": raw_first.item()}
    for _ in range(3):
        ours(*batches[1]), raw(*batches[1])
    times = alternating_rounds(lambda b: ours(*b), lambda b: raw(*b), batches, rounds, steps, device)
    if accelerator.is_main_process:
        with open(result, "w") as handle:
            json.dump({"times": times, "first_loss": first}, handle)
    accelerator.end_training()


if __name__ == "__main__":
    main()
