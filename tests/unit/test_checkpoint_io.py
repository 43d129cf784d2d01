"""The streamed safetensors writer and the staged, hashed checkpoint writer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import xxhash
from safetensors.torch import load_file, save_file

from strategies.checkpoint_io import CheckpointWriter, verify_checkpoint


def _tensors() -> dict[str, torch.Tensor]:
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    return {
        "f32": base,
        "bf16": base.to(torch.bfloat16),
        "f16": base.to(torch.float16),
        "i64": torch.arange(5),
        "bool": torch.tensor([True, False, True]),
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
        "transposed": base.t(),  # not contiguous
        "tied": base,  # shares storage with f32
        "u8": torch.arange(7, dtype=torch.uint8),
    }


def test_streamed_safetensors_loads_with_the_safetensors_library(tmp_path: Path) -> None:
    writer = CheckpointWriter(tmp_path / "ckpt")
    writer.clear_staging()
    writer.save_safetensors("weights.safetensors", _tensors(), metadata={"note": "x"})
    writer.commit({})
    loaded = load_file(str(tmp_path / "ckpt" / "weights.safetensors"))
    for key, want in _tensors().items():
        assert loaded[key].dtype == want.dtype and torch.equal(loaded[key], want), key


def test_reads_back_like_a_file_the_library_wrote(tmp_path: Path) -> None:
    state = {"a": torch.randn(4, 3), "b": torch.arange(6)}
    save_file(state, str(tmp_path / "lib.safetensors"))
    writer = CheckpointWriter(tmp_path / "ckpt")
    writer.clear_staging()
    writer.save_safetensors("ours.safetensors", state)
    writer.commit({})
    ours, theirs = load_file(str(tmp_path / "ckpt" / "ours.safetensors")), load_file(str(tmp_path / "lib.safetensors"))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_manifest_hashes_are_those_of_the_bytes_on_disk(tmp_path: Path) -> None:
    writer = CheckpointWriter(tmp_path / "ckpt")
    writer.clear_staging()
    writer.save_torch("obj.bin", {"step": torch.tensor(3), "lr": 0.1})
    writer.save_json("data.json", {"k": [1, 2]})
    writer.save_rng_state("rng.safetensors")
    final = writer.commit({"global_step": 3})
    manifest = json.loads((final / "manifest.json").read_text())
    assert manifest["global_step"] == 3 and set(manifest["files"]) == {"obj.bin", "data.json", "rng.safetensors"}
    assert manifest["hash"] == "xxh3_128"
    for name, entry in manifest["files"].items():
        data = (final / name).read_bytes()
        assert entry == {"size": len(data), "digest": xxhash.xxh3_128(data).hexdigest()}
    verify_checkpoint(final)
    (final / "data.json").write_text('{"k": [1, 3]}')
    with pytest.raises(ValueError, match=r"data.json was modified"):
        verify_checkpoint(final)


def test_unsupported_dtype_is_a_clear_error(tmp_path: Path) -> None:
    writer = CheckpointWriter(tmp_path / "ckpt")
    writer.clear_staging()
    with pytest.raises(TypeError, match=r"cannot store 'c' of dtype torch.complex64 in safetensors"):
        writer.save_safetensors("w.safetensors", {"c": torch.zeros(2, dtype=torch.complex64)})


@pytest.fixture
def small_disk(tmp_path: Path):
    """A real 2 MB filesystem (tmpfs), so a save runs out of space for real."""
    import subprocess

    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {done.stderr.strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=False)


@pytest.mark.faults
def test_disk_full_is_an_oserror_naming_the_checkpoint_and_loses_nothing(small_disk: Path) -> None:
    import errno

    from trainer import Accelerator

    acc = Accelerator(cpu=True)
    model = acc.prepare(torch.nn.Linear(4, 4))
    acc.save_state(small_disk / "small")
    with torch.no_grad():
        model.weight = torch.nn.Parameter(torch.zeros(1024, 1024))  # 4 MB: more than the disk holds
    with pytest.raises(OSError, match=r"no space left to save checkpoint .*big.*model.safetensors \(about 4.2 MB\)") as info:
        acc.save_state(small_disk / "big")
    assert info.value.errno == errno.ENOSPC
    assert sorted(p.name for p in small_disk.iterdir()) == ["small"]  # no staging directory left behind
    verify_checkpoint(small_disk / "small")  # the earlier checkpoint is intact
    from strategies.checkpoint_store import CheckpointSaveError

    pending = acc.save_state(small_disk / "big", async_save=True)  # the same, written by the checkpoint writer process
    with pytest.raises(CheckpointSaveError, match=r"not committed.*no space left to save checkpoint .*big.*model.safetensors"):
        pending.result()
    assert sorted(p.name for p in small_disk.iterdir()) == ["small"]
    verify_checkpoint(small_disk / "small")


@pytest.mark.faults
def test_a_save_removes_staging_directories_crashed_saves_left(tmp_path: Path) -> None:
    (tmp_path / ".epoch=0-step=3.partial").mkdir()
    (tmp_path / ".epoch=0-step=3.partial" / "model.safetensors").write_bytes(b"half")
    (tmp_path / ".old-release.partial.tmp").mkdir()
    writer = CheckpointWriter(tmp_path / "epoch=0-step=6")
    writer.clear_staging()
    writer.save_json("a.json", {})
    writer.commit({})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["epoch=0-step=6"]
