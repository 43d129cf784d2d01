"""A sharded (FSDP) checkpoint of 2 processes: each process hashes the shard file it writes, and rank 0's manifest
lists both with the digests of the bytes on disk; a damaged file that only one process reads (its shard, its RNG
states) is refused on both processes, naming it, instead of one failing while the other waits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import xxhash
from torch import nn

from tests.helpers.multiprocess import run_distributed

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]


def _prepared() -> tuple[object, nn.Module, torch.optim.Optimizer]:
    from trainer import Accelerator

    acc = Accelerator(cpu=True, strategy="fsdp")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    model, opt = acc.prepare(model, torch.optim.AdamW(model.parameters(), lr=0.01))
    return acc, model, opt


def _save(root: str) -> None:
    acc, model, opt = _prepared()
    model(torch.randn(4, 8)).sum().backward()  # type: ignore[operator]
    opt.step()
    acc.save_state(f"{root}/state")  # type: ignore[attr-defined]
    acc.end_training()  # type: ignore[attr-defined]


def _load(root: str) -> str:
    from strategies.checkpoint_io import CheckpointError

    acc, _model, _opt = _prepared()
    try:
        acc.load_state(f"{root}/state")  # type: ignore[attr-defined]
        found = "loaded"
    except CheckpointError as err:
        found = str(err)
    acc.end_training()  # type: ignore[attr-defined]
    return found


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_each_process_hashes_its_shard_and_a_damaged_one_is_refused_on_both(tmp_path: Path) -> None:
    run_distributed(_save, str(tmp_path))
    state = tmp_path / "state"
    manifest = json.loads((state / "manifest.json").read_text())
    assert manifest["hash"] == "xxh3_128"
    for name in ("sharded/__0_0.distcp", "sharded/__1_0.distcp", "sharded/.metadata", "random_states_1.safetensors"):
        assert manifest["files"][name]["digest"] == xxhash.xxh3_128((state / name).read_bytes()).hexdigest(), name
    assert run_distributed(_load, str(tmp_path)) == ["loaded", "loaded"]
    for name in ("sharded/__1_0.distcp", "random_states_1.safetensors"):  # read by process 1 only
        original = (state / name).read_bytes()
        _flip(state / name)
        found = run_distributed(_load, str(tmp_path))
        assert all(f"{name} was modified" in message for message in found), found
        (state / name).write_bytes(original)
