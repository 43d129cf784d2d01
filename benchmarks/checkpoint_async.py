"""Asynchronous saves (one process, a model of ≥ 200 MB): how long the step waits, and how the steps taken while the
checkpoint is written compare with those under a raw ``dcp.async_save`` of the same state, in the same rounds.

* stall: ``save_state(async_save=True)`` until it returns, against copying the same model and optimizer state into
  preallocated host buffers (the least an asynchronous save must do before training may change the tensors);
* steps while writing: K training steps right after the save returned, against the same K steps with nothing being
  written, and against K steps right after a raw ``dcp.async_save`` of the same state returned (each then waits for
  its write before the next round). The three orders rotate from round to round.

On this machine the background write competes with training for the same two cores; on a GPU host the steps run on
the device and the write on the host.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from benchmarks.common import Row, Section

WRITER_ENV = "TRAINWRIGHT_CHECKPOINT_WRITER"

WIDTH, LAYERS, STEPS_WHILE_WRITING = 3200, 5, 3  # 5 × 3200² fp32 weights ≈ 205 MB, plus as much SGD momentum


def _setup() -> tuple[nn.Module, torch.optim.Optimizer, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
    batch = torch.randn(64, WIDTH)
    return model, optimizer, batch


def _steps(model: nn.Module, optimizer: torch.optim.Optimizer, batch: torch.Tensor, n: int) -> float:
    begin = time.perf_counter()
    for _ in range(n):
        model(batch).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - begin


def run(*, quick: bool) -> list[Section]:
    import torch.distributed.checkpoint as dcp

    from trainer import Accelerator

    rounds = 4 if quick else 8  # a multiple of the 4 sides: each goes first equally often
    model, optimizer, batch = _setup()
    accelerator = Accelerator(cpu=True)
    accelerator.prepare(model, optimizer)
    before = dict(os.environ)
    os.environ[WRITER_ENV] = "thread"  # the same save, written by a thread of this process (as before issue 46)
    try:
        threaded = Accelerator(cpu=True)
    finally:
        os.environ.clear()
        os.environ.update(before)
    threaded.prepare(model, optimizer)
    _steps(model, optimizer, batch, 1)  # the momentum buffers exist: the optimizer state is as large as the weights
    megabytes = sum(p.numel() * p.element_size() for p in model.parameters()) / 1e6
    buffers: dict[str, Any] = {}

    def copy_out() -> float:
        begin = time.perf_counter()
        for prefix, state in (("m", model.state_dict()), ("o", optimizer.state_dict()["state"])):
            flat = state.items() if prefix == "m" else ((f"{i}.{k}", v) for i, s in state.items() for k, v in s.items())
            for key, tensor in flat:
                if isinstance(tensor, torch.Tensor):
                    out = buffers.get(prefix + key)
                    if out is None:
                        out = buffers[prefix + key] = torch.empty_like(tensor, device="cpu")
                    out.copy_(tensor)
        return time.perf_counter() - begin

    root = Path(tempfile.mkdtemp(prefix="bench-async-"))
    copy_times, ours_stall, raw_stall, ours_steps, raw_steps, idle_steps, thread_steps = [], [], [], [], [], [], []
    try:
        copy_out()  # the buffers exist (as ours do after the first save)
        accelerator.save_state(root / "warm", async_save=True).result()
        threaded.save_state(root / "warm_thread", async_save=True).result()
        warm: Any = dcp.async_save({"model": model.state_dict(), "optim": optimizer.state_dict()}, checkpoint_id=str(root / "warm_raw"),
                                   no_dist=True)  # (a Future here: no async_stager given)
        warm.result()
        for r in range(rounds):
            copy_times.append(copy_out())
            order = ("ours", "raw", "idle", "thread")
            for side in order[r % 4 :] + order[: r % 4]:
                begin = time.perf_counter()
                if side == "idle":
                    idle_steps.append(_steps(model, optimizer, batch, STEPS_WHILE_WRITING))
                elif side == "thread":
                    pending = threaded.save_state(root / f"thread{r}", async_save=True)
                    thread_steps.append(_steps(model, optimizer, batch, STEPS_WHILE_WRITING))
                    pending.result()
                elif side == "ours":
                    pending = accelerator.save_state(root / f"ours{r}", async_save=True)
                    ours_stall.append(time.perf_counter() - begin)
                    ours_steps.append(_steps(model, optimizer, batch, STEPS_WHILE_WRITING))
                    pending.result()
                else:
                    future: Any = dcp.async_save({"model": model.state_dict(), "optim": optimizer.state_dict()},
                                            checkpoint_id=str(root / f"raw{r}"), no_dist=True)
                    raw_stall.append(time.perf_counter() - begin)
                    raw_steps.append(_steps(model, optimizer, batch, STEPS_WHILE_WRITING))
                    future.result()
    finally:
        accelerator.end_training()
        threaded.end_training()
        shutil.rmtree(root, ignore_errors=True)
    stall_rows = [
        Row("copy of the same state into preallocated host buffers", "s", copy_times, [1.0] * rounds),
        Row("save_state(async_save=True) until it returns", "s", ours_stall, [o / c for o, c in zip(ours_stall, copy_times)], target="≤ 1.30"),
        Row("raw dcp.async_save until it returns (for reference)", "s", raw_stall, [o / c for o, c in zip(raw_stall, copy_times)]),
    ]
    step_rows = [
        Row(f"{STEPS_WHILE_WRITING} steps with nothing being written", "s", idle_steps, [1.0] * rounds),
        Row(f"{STEPS_WHILE_WRITING} steps while a raw dcp.async_save writes", "s", raw_steps, [w / i for w, i in zip(raw_steps, idle_steps)]),
        Row(f"{STEPS_WHILE_WRITING} steps while save_state(async_save=True) writes from a thread (TRAINWRIGHT_CHECKPOINT_WRITER=thread)",
            "s", thread_steps, [t / i for t, i in zip(thread_steps, idle_steps)]),
        Row(f"{STEPS_WHILE_WRITING} steps while save_state(async_save=True) writes", "s", ours_steps,
            [o / i for o, i in zip(ours_steps, idle_steps)], target="≤ 1.10"),
        Row("the same, ÷ the steps while the raw dcp.async_save writes", "s", ours_steps,
            [o / w for o, w in zip(ours_steps, raw_steps)], target="≤ 1.00"),
    ]
    what = (f"{megabytes:.0f} MB of fp32 weights + {megabytes:.0f} MB of SGD momentum, one process; {rounds} rounds, ours, raw "
            "no save, and ours written from a thread taking turns first. Ours writes in its writer process "
            "(strategies/checkpoint_process.py); the thread row is the same save written by a thread of the training process. Ours also writes RNG states and data positions, hashes every file while writing it, fsyncs, "
            "writes the manifest and renames the directory into place.")
    return [
        Section("Asynchronous save — how long the step waits", "copy into preallocated buffers", stall_rows, [what]),
        Section("Asynchronous save — steps taken while it writes", "the same steps with nothing being written", step_rows, [what]),
    ]
