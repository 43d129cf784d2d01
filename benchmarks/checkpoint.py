"""Checkpoint save and load: `Accelerator.save_state`/`load_state` against raw safetensors + torch.save (one
process), and against raw ``dcp.save``/``dcp.load`` of FSDP2 shards (2 processes, the same job)."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from benchmarks.common import Row, Section, interleaved, repo_env


def _model(width: int, layers: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = nn.Sequential(*(nn.Linear(width, width) for _ in range(layers)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model(torch.randn(2, width)).sum().backward()
    optimizer.step()  # creates the momentum buffers: the optimizer state is as large as the weights
    return model, optimizer


def _fsync_files(folder: Path) -> None:
    for path in folder.iterdir():
        with open(path, "rb") as handle:
            os.fsync(handle.fileno())
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def raw_save(model: nn.Module, optimizer: torch.optim.Optimizer, folder: Path, *, fsync: bool) -> float:
    from safetensors.torch import save_file

    begin = time.perf_counter()
    folder.mkdir()
    save_file(model.state_dict(), str(folder / "model.safetensors"))
    torch.save(optimizer.state_dict(), folder / "optimizer.bin")
    if fsync:
        _fsync_files(folder)
    return time.perf_counter() - begin


def torch_save_all(model: nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> float:
    begin = time.perf_counter()
    folder.mkdir()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, folder / "checkpoint.pt")
    return time.perf_counter() - begin


def raw_load(model: nn.Module, optimizer: torch.optim.Optimizer, folder: Path) -> float:
    from safetensors.torch import load_file

    begin = time.perf_counter()
    model.load_state_dict(load_file(str(folder / "model.safetensors")))
    optimizer.load_state_dict(torch.load(folder / "optimizer.bin", weights_only=True))
    return time.perf_counter() - begin


def run(*, quick: bool) -> list[Section]:
    from trainer import Accelerator

    rounds = 4 if quick else 8  # a multiple of the contender count: every position equally
    load_rounds = 3 if quick else 24  # (a load takes ~50 ms: more rounds cost little and steady the median)
    width, layers = 2500, 4  # 4 × 2500² fp32 weights ≈ 100 MB, plus 100 MB of momentum buffers
    model, optimizer = _model(width, layers)
    megabytes = sum(p.numel() * p.element_size() for p in model.parameters()) / 1e6
    accelerator = Accelerator(cpu=True)
    accelerator.prepare(model, optimizer)  # in one process the same objects, now registered for save_state
    root = Path(tempfile.mkdtemp(prefix="bench-ckpt-"))
    counter = itertools.count()

    def fresh() -> Path:
        return root / f"c{next(counter)}"

    def save_state() -> float:
        folder = fresh()
        begin = time.perf_counter()
        accelerator.save_state(folder)
        return time.perf_counter() - begin

    def load_state() -> float:
        begin = time.perf_counter()
        accelerator.load_state(saved_state)
        return time.perf_counter() - begin

    def load_state_unverified() -> float:
        begin = time.perf_counter()
        accelerator.load_state(saved_state, verify=False)
        return time.perf_counter() - begin

    try:
        saves = interleaved({
            "raw safetensors + torch.save, fsynced": lambda: raw_save(model, optimizer, fresh(), fsync=True),
            "raw safetensors + torch.save, no fsync": lambda: raw_save(model, optimizer, fresh(), fsync=False),
            "torch.save of one dict, no fsync": lambda: torch_save_all(model, optimizer, fresh()),
            "Accelerator.save_state (atomic, fsynced, hashed)": save_state,
        }, "raw safetensors + torch.save, fsynced", rounds, unit="s")
        saves["Accelerator.save_state (atomic, fsynced, hashed)"].target = "≤ 1.15"
        saved_raw = fresh()
        raw_save(model, optimizer, saved_raw, fsync=True)
        saved_state = Path(accelerator.save_state(fresh()))
        loads = interleaved({
            "raw safetensors + torch.load": lambda: raw_load(model, optimizer, saved_raw),
            "Accelerator.load_state (every file's hash checked)": load_state,
            "Accelerator.load_state(verify=False) (names and sizes checked)": load_state_unverified,
        }, "raw safetensors + torch.load", load_rounds, unit="s")  # 3 contenders: each in every position
        loads["Accelerator.load_state (every file's hash checked)"].target = "≤ 1.20"
        loads["Accelerator.load_state(verify=False) (names and sizes checked)"].target = "≤ 1.30"
    finally:
        shutil.rmtree(root, ignore_errors=True)
    what = f"{megabytes:.0f} MB of fp32 weights + {megabytes:.0f} MB of SGD momentum"
    notes_save = [what + f"; {rounds} interleaved rounds; every save goes to a new directory.",
                  ("save_state also writes RNG states and data positions, hashes every file in the pass that writes it "
                   "(xxh3-128, into manifest.json), fsyncs (the files together, in the background, while the next is "
                   "written), then renames the directory into place; Trainer.save_checkpoint is the same path.")]
    notes_load = [what + f"; {load_rounds} interleaved rounds; files are in the page cache (as right after a save). "
                  "load_state checks each file's xxh3-128 against the manifest (raw loading checks nothing): a helper "
                  "thread hashes the optimizer file, then the weights, while the optimizer file is parsed into new "
                  "memory, and nothing is applied before its file's digest matched. From the page cache, hashing 200 MB "
                  "(~7 ms per 100 MB, mapped) is a large part of a load that takes 40-60 ms (hidden only where a core "
                  "is free), from disk a small one."]
    return [
        Section("Checkpoint save", "raw, fsynced", list(saves.values()), notes_save),
        Section("Checkpoint load", "raw", list(loads.values()), notes_load),
        *sharded(rounds=4 if quick else 16),
    ]


def sharded(*, rounds: int) -> list[Section]:
    """FSDP2 on 2 processes: `save_state`/`load_state` against raw `dcp.save`/`dcp.load`, in the same job."""
    from benchmarks.ddp import _trainer_command

    folder = Path(tempfile.mkdtemp(prefix="bench-ckpt-sharded-"))
    result = folder / "result.json"
    command = [*_trainer_command(), "launch", "--num_processes", "2", "--cpu", "-m", "benchmarks.fsdp_scripts.checkpoint_rounds",
               str(result), str(rounds), str(folder)]
    try:
        done = subprocess.run(command, env=repo_env(OMP_NUM_THREADS="1"), cwd="/", capture_output=True, text=True, timeout=600)
        if done.returncode != 0 or not result.exists():
            raise RuntimeError(f"{' '.join(command)} failed with exit code {done.returncode}:\n{done.stderr[-3000:]}")
        times = json.loads(result.read_text())
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    sections = []
    for kind, raw_name, ours_name in (("save", "raw dcp.save", "Accelerator.save_state (hashed while written)"),
                                      ("load", "raw dcp.load", "Accelerator.load_state (hashes checked while read)")):
        raw, ours = times[f"raw_{kind}"], times[f"ours_{kind}"]
        target = "≤ 1.10" if kind == "save" else "≤ 1.20"
        rows = [Row(raw_name, "s", raw, [1.0] * len(raw)), Row(ours_name, "s", ours, [o / r for o, r in zip(ours, raw)], target=target)]
        note = (f"2 processes (gloo), the FSDP benchmark's model (4 residual MLP blocks of width 256, ~2.1 M params) and AdamW "
                f"state (~25 MB); {rounds} rounds in one job, raw and ours alternating first, each timed between barriers. "
                "Ours also writes RNG states, data positions and manifest.json, and agrees across the processes.")
        sections.append(Section(f"FSDP2, 2 processes — sharded checkpoint {kind}, same job", raw_name, rows, [note]))
    return sections
