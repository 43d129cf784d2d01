"""Checkpoint hashes: xxh3-128 by default, SHA-256 on request, the old SHA-256 manifests still load; every file is
hashed in the pass that writes it (DCP's shards too) and checked in the pass that reads it (nothing is read twice)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import torch
import xxhash

from strategies import checkpoint_hash, checkpoint_io
from strategies.checkpoint_io import CheckpointError, CheckpointReader, CheckpointWriter
from trainer import Accelerator


def _prepared(seed: int = 0) -> tuple[Accelerator, torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 3))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    acc = Accelerator(cpu=True)
    model, opt = acc.prepare(model, opt)
    model(torch.randn(2, 6)).sum().backward()
    opt.step()
    return acc, model, opt


def _flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {key: value.clone() for key, value in model.state_dict().items()}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_sha256_on_request_and_a_wrong_name_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    acc, model, _ = _prepared()
    monkeypatch.setenv("TRAINWRIGHT_CHECKPOINT_HASH", "sha256")
    path = Path(acc.save_state(tmp_path / "ckpt"))
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["hash"] == "sha256"
    for name, entry in manifest["files"].items():
        assert entry["digest"] == hashlib.sha256((path / name).read_bytes()).hexdigest()
    want = _state(model)
    monkeypatch.delenv("TRAINWRIGHT_CHECKPOINT_HASH")  # a checkpoint is read with the hash its manifest names
    acc.load_state(path)
    assert _same(want, model.state_dict())
    monkeypatch.setenv("TRAINWRIGHT_CHECKPOINT_HASH", "md5")
    with pytest.raises(ValueError, match=r"TRAINWRIGHT_CHECKPOINT_HASH='md5' is not a checkpoint hash; choose one of 'xxh3_128', 'sha256'"):
        acc.save_state(tmp_path / "other")
    assert CheckpointWriter(tmp_path / "x", algorithm="sha256").algorithm == "sha256"


def _as_format_2(path: Path) -> None:
    """Rewrite a manifest as the previous release wrote it: format 2, a "sha256" per file, no "hash"."""
    manifest = json.loads((path / "manifest.json").read_text())
    del manifest["hash"]
    manifest["format_version"] = 2
    manifest["files"] = {name: {"size": entry["size"], "sha256": hashlib.sha256((path / name).read_bytes()).hexdigest()}
                         for name, entry in manifest["files"].items()}
    (path / "manifest.json").write_text(json.dumps(manifest))


def test_a_format_2_checkpoint_with_sha256_per_file_still_verifies_and_loads(tmp_path: Path) -> None:
    acc, model, _ = _prepared()
    path = Path(acc.save_state(tmp_path / "ckpt"))
    _as_format_2(path)
    want = _state(model)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(1.0)
    checkpoint_io.verify_checkpoint(path)
    acc.load_state(path)
    assert _same(want, model.state_dict())
    _flip_last_byte(path / "optimizer.bin")
    with pytest.raises(CheckpointError, match=r"optimizer\.bin was modified"):
        acc.load_state(path)
    with pytest.raises(CheckpointError, match=r"optimizer\.bin was modified"):
        checkpoint_io.verify_checkpoint(path)


def test_an_unknown_hash_in_a_manifest_names_it(tmp_path: Path) -> None:
    acc, _, _ = _prepared()
    path = Path(acc.save_state(tmp_path / "ckpt"))
    manifest = json.loads((path / "manifest.json").read_text())
    (path / "manifest.json").write_text(json.dumps({**manifest, "hash": "blake9"}))
    with pytest.raises(CheckpointError, match=r"hashed with 'blake9', which this Trainwright does not know"):
        acc.load_state(path)


def test_save_and_load_read_no_file_twice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No file is read back after it was written, and a verified load reads each file once (no separate pre-read)."""

    def no_second_read(path: Path, algorithm: str) -> str:
        raise AssertionError(f"{path} was read only to hash it")

    monkeypatch.setattr(checkpoint_io, "hash_file", no_second_read)
    acc, model, _ = _prepared()
    path = Path(acc.save_state(tmp_path / "ckpt"))
    want = _state(model)
    with torch.no_grad():
        for param in model.parameters():
            param.mul_(0.0)
    acc.load_state(path)
    assert _same(want, model.state_dict())


@pytest.mark.parametrize("name", ["model.safetensors", "optimizer.bin", "random_states_0.safetensors", "dataloaders.json"])
def test_a_flipped_byte_is_refused_in_the_read_that_loads_the_file(tmp_path: Path, name: str) -> None:
    acc, model, _ = _prepared()
    path = Path(acc.save_state(tmp_path / "ckpt"))
    _flip_last_byte(path / name)
    before = _state(model)
    with pytest.raises(CheckpointError, match=rf"refusing to load checkpoint .*{name.replace('.', '[.]')} was modified"):
        acc.load_state(path)
    if name in ("model.safetensors", "optimizer.bin"):  # checked before any model or optimizer is changed
        assert _same(before, model.state_dict())


def test_an_optimizer_file_damaged_where_it_cannot_be_parsed_is_refused_as_damaged(tmp_path: Path) -> None:
    """The optimizer file is parsed while it is hashed: a parse that fails on the damage reports the damage (not a
    parse error), and neither the model nor the optimizer was changed."""
    acc, model, opt = _prepared()
    path = Path(acc.save_state(tmp_path / "ckpt"))
    data = bytearray((path / "optimizer.bin").read_bytes())
    start = data.index(b"data.pkl") + len(b"data.pkl")  # (the pickle follows its name in the zip)
    data[start : start + 40] = bytes(b ^ 0x5A for b in data[start : start + 40])
    (path / "optimizer.bin").write_bytes(bytes(data))
    before, before_opt = _state(model), repr(opt.state_dict())
    with pytest.raises(CheckpointError, match=r"optimizer[.]bin was modified"):
        acc.load_state(path)
    assert _same(before, model.state_dict()) and repr(opt.state_dict()) == before_opt


@pytest.mark.parametrize("ahead", [False, True])  # hashed in the pass that reads it, or on the helper meanwhile
def test_a_torch_file_is_returned_only_once_checked_on_either_read_path(tmp_path: Path, ahead: bool) -> None:
    state = {"a": torch.arange(300_000, dtype=torch.float32), "b": [torch.ones(3), 7]}
    writer = CheckpointWriter(tmp_path / "ckpt")
    writer.clear_staging()
    writer.save_torch("state.bin", state)
    path = writer.commit({})
    reader = checkpoint_io.open_checkpoint(path)
    if ahead:
        reader.prefetch(["state.bin"])
    loaded = reader.torch_load("state.bin")
    assert torch.equal(loaded["a"], state["a"]) and torch.equal(loaded["b"][0], state["b"][0]) and loaded["b"][1] == 7
    assert "state.bin" in reader.checked
    data = bytearray((path / "state.bin").read_bytes())
    data[len(data) // 2] ^= 0xFF  # (inside the tensor's bytes: the parse succeeds, the digest differs)
    (path / "state.bin").write_bytes(bytes(data))
    reader = checkpoint_io.open_checkpoint(path)
    if ahead:
        reader.prefetch(["state.bin"])
    with pytest.raises(CheckpointError, match=r"state\.bin was modified"):
        reader.torch_load("state.bin")


@pytest.mark.parametrize(("runnable", "load", "spare"), [
    (1, 7.0, True),  # a core idle now, whatever ran in the last minute (the job's own setup)
    (2, 0.4, False),  # both busy now
    (5, 0.4, False),
    (None, 0.4, True), (None, 1.0, True), (None, 1.6, False), (None, 7.0, False),  # no instant count: the minute's average
])
def test_the_optimizer_file_is_hashed_beside_its_parse_only_where_a_core_is_idle(
    runnable: int | None, load: float, spare: bool, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(checkpoint_io.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(checkpoint_io.os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(checkpoint_io, "runnable_now", lambda: runnable)
    assert checkpoint_io.core_to_spare() is spare


def test_the_runnable_count_is_read_from_the_system() -> None:
    runnable = checkpoint_io.runnable_now()
    if os.path.exists("/proc/loadavg"):
        assert runnable is not None and runnable >= 1  # (this thread is running)
    else:
        assert runnable is None


def test_a_file_nobody_loads_is_still_checked(tmp_path: Path) -> None:
    writer = CheckpointWriter(tmp_path / "ckpt")
    writer.clear_staging()
    writer.save_json("notes.json", {"a": 1})
    writer.save_json("other.json", {"b": 2})
    path = writer.commit({})
    reader = checkpoint_io.open_checkpoint(path)
    with reader.agreed():
        assert reader.read_json("notes.json") == {"a": 1}
    _flip_last_byte(path / "other.json")
    reader = checkpoint_io.open_checkpoint(path)
    with pytest.raises(CheckpointError, match=r"other\.json was modified"), reader.agreed():
        reader.read_json("notes.json")


def test_safetensors_read_from_one_buffer_match_the_library(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    state = {"f32": torch.randn(3, 4), "bf16": torch.randn(5).to(torch.bfloat16), "i64": torch.arange(3), "b": torch.tensor([True]),
             "odd": torch.arange(3, dtype=torch.uint8), "after_odd": torch.randn(2), "empty": torch.zeros(0, 2), "scalar": torch.tensor(2.5)}
    writer = CheckpointWriter(tmp_path / "ckpt")
    writer.clear_staging()
    writer.save_safetensors("w.safetensors", state, metadata={"note": "x"})
    path = writer.commit({})
    tensors, meta = CheckpointReader(path, checkpoint_io.read_manifest(path)).safetensors("w.safetensors")
    theirs = load_file(str(path / "w.safetensors"))
    assert meta == {"note": "x"} and _same(tensors, theirs) and all(tensors[k].dtype == theirs[k].dtype for k in theirs)
    (path / "w.safetensors").write_bytes((path / "w.safetensors").read_bytes()[:40])
    with pytest.raises(CheckpointError, match=r"cannot read .*w\.safetensors as safetensors"):
        CheckpointReader(path).safetensors("w.safetensors")  # unchecked: the parser itself refuses a truncated file


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # DCP in one process, as meant
def test_dcp_shards_are_hashed_as_written_and_checked_as_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """DCP in one process (no process group): the shard and .metadata digests come from the write itself, a plain
    dcp.load reads the files, and a damaged shard is refused, naming it, before any of it reaches the model."""
    import torch.distributed.checkpoint as dcp

    monkeypatch.setattr(checkpoint_io, "hash_file", lambda *a: pytest.fail("a DCP file was read back to hash it"))
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 4)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
    writer = CheckpointWriter(tmp_path / "ckpt")
    writer.clear_staging()
    writer.save_dcp("sharded", checkpoint_io.sharded_state([model], [opt]))
    path = writer.commit({})
    manifest = json.loads((path / "manifest.json").read_text())
    shards = {name for name in manifest["files"] if name.startswith("sharded/")}
    assert shards == {"sharded/.metadata", "sharded/__0_0.distcp"}
    for name in shards:
        assert manifest["files"][name]["digest"] == xxhash.xxh3_128((path / name).read_bytes()).hexdigest()
    plain = {"model_0": torch.nn.Linear(8, 4).state_dict()}
    dcp.load(plain, checkpoint_id=str(path / "sharded"), no_dist=True)  # DCP's own format
    assert _same(plain["model_0"], model.state_dict())

    fresh = torch.nn.Linear(8, 4)
    fresh_opt = torch.optim.AdamW(fresh.parameters())
    reader = checkpoint_io.open_checkpoint(path)
    with reader.agreed():
        checkpoint_io.load_sharded(reader, [fresh], [fresh_opt])
    assert _same(fresh.state_dict(), model.state_dict()) and reader.checked >= shards

    _flip_last_byte(path / "sharded/__0_0.distcp")
    other = torch.nn.Linear(8, 4)
    before = _state(other)
    reader = checkpoint_io.open_checkpoint(path)
    with pytest.raises(CheckpointError, match=r"sharded/__0_0\.distcp was modified"), reader.agreed():
        checkpoint_io.load_sharded(reader, [other], [torch.optim.AdamW(other.parameters())])
    assert _same(before, other.state_dict())  # refused before any of it was used
    _flip_last_byte(path / "sharded/__0_0.distcp")
    _flip_last_byte(path / "sharded/.metadata")
    with pytest.raises(CheckpointError, match=r"sharded/\.metadata was modified"):
        checkpoint_io.load_sharded(checkpoint_io.open_checkpoint(path), [other], [])


def test_the_default_hash_and_the_choice() -> None:
    assert checkpoint_hash.DEFAULT_HASH == "xxh3_128" and checkpoint_hash.HASHES == ("xxh3_128", "sha256")
    assert checkpoint_hash.choose_hash() == "xxh3_128" and checkpoint_hash.choose_hash("sha256") == "sha256"
    with pytest.raises(ValueError, match=r"hash='crc32' is not a checkpoint hash"):
        checkpoint_hash.choose_hash("crc32")


@pytest.mark.parametrize("reads", [
    [(0, 10_000)],  # front to back in one read
    [(0, 30), (64, 5000), (5100, 4900)],  # a parser that skips names and padding (a zip)
    [(9000, 1000), (0, 4), (0, 30), (5000, 3000)],  # the end first, then rereads, a gap too large to fill on the way
    [(3000, 10), (100, 50)],  # most bytes never read
])
@pytest.mark.parametrize("slice_size", [1 << 20, 64])  # (64: reads span many slices; large skips are left to the end)
def test_a_hashing_read_file_gives_the_whole_file_s_size_and_digest_for_any_reads(
    reads: list[tuple[int, int]], slice_size: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(checkpoint_hash, "_SLICE", slice_size)
    data = bytes(range(256)) * 40  # 10,240 bytes
    (tmp_path / "f").write_bytes(data)
    algorithm = "xxh3_128"
    with open(tmp_path / "f", "rb", buffering=0) as fh:
        stream = checkpoint_hash.HashingReadFile(fh, algorithm)
        for offset, size in reads:
            stream.seek(offset)
            out = bytearray(size)
            n = stream.readinto(out)
            assert bytes(out[:n]) == data[offset : offset + n]
        assert stream.finish() == (len(data), checkpoint_hash.digest_of(data, algorithm))
    assert checkpoint_hash.digest_of(data, algorithm) == xxhash.xxh3_128(data).hexdigest()
