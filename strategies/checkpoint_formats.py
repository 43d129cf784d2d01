"""The file formats of a checkpoint, as plain functions (`strategies.checkpoint_io` puts them together into checked,
atomic checkpoint directories): JSON, ``torch.save`` files (loaded ``weights_only``), safetensors (written tensor by
tensor, parsed from bytes already checked), the processes' RNG states, and the durable writes (fsync, then rename).
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import random
import shutil
import struct
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from strategies.checkpoint_files import fsync_dir
from strategies.environment import running_xla


class CheckpointError(ValueError):
    """A checkpoint is incomplete, tampered with, or not a trainwright checkpoint."""


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"cannot read {path}: {err}; the checkpoint is damaged or was tampered with") from err


def torch_save(obj: Any, path: Path) -> None:
    torch.save(obj, path)


def torch_load(path: Path, map_location: Any = "cpu", data: Any = None, allowed: Sequence[type] = ()) -> Any:
    """`torch.load` that refuses anything but tensors, plain containers and the `allowed` classes (which torch's
    weights-only unpickler builds from their saved attributes, an enum from its value): of the file `path`, or of
    `data`, its contents as a binary file."""
    try:
        with torch.serialization.safe_globals(list(allowed)) if allowed else contextlib.nullcontext():
            return torch.load(path if data is None else data, map_location=map_location, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, AttributeError, TypeError, ValueError) as err:
        raise CheckpointError(
            f"refusing to load {path}: it holds objects other than tensors and plain containers ({err}). "
            "The checkpoint is damaged or was tampered with; nothing in it was executed"
        ) from err


def indexed(name: str, i: int, ext: str) -> str:
    """``model.safetensors``, ``model_1.safetensors``, ...: the file of the `i`-th object of a kind."""
    return f"{name}.{ext}" if i == 0 else f"{name}_{i}.{ext}"


def dedupe_shared_tensors(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Clone tensors that share storage (tied weights) so safetensors can store every key."""
    seen: set[tuple[int, int, int]] = set()
    out = {}
    for key, tensor in state.items():
        tensor = tensor.detach()
        if tensor.device.type != "cpu":
            tensor = tensor.cpu()
        ident = (tensor.untyped_storage().data_ptr(), int(tensor.storage_offset()), int(tensor.nelement()))
        if ident in seen or not tensor.is_contiguous():
            tensor = tensor.contiguous().clone()
        seen.add(ident)
        out[key] = tensor
    return out


def save_safetensors(state: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None) -> None:
    from safetensors.torch import save_file

    save_file(dedupe_shared_tensors(state), str(path), metadata=metadata or {"format": "pt"})


def load_safetensors(path: Path, device: str = "cpu") -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device=device)
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"cannot read {path} as safetensors: {err}; the file is damaged or was tampered with") from err


def parse_safetensors(data: torch.Tensor, source: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """The tensors and metadata of a safetensors file whose bytes are the uint8 tensor `data` (read once, maybe checked).

    Each tensor is a view of `data` (no copy) where its offset allows one, else a copy.
    """

    def damaged(why: str) -> CheckpointError:
        return CheckpointError(f"cannot read {source} as safetensors: {why}; the file is damaged or was tampered with")

    raw = data.numpy().data.cast("B")
    if len(raw) < 8 or len(raw) < 8 + (length := struct.unpack("<Q", raw[:8])[0]):
        raise damaged("it is shorter than its header says")
    try:
        header = json.loads(bytes(raw[8 : 8 + length]))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise damaged(f"its header is no JSON ({err})") from err
    if not isinstance(header, dict):
        raise damaged("its header is no JSON object")
    dtypes = {name: dtype for dtype, name in _ST_DTYPES.items()}
    body, meta, tensors = data[8 + length :], header.pop("__metadata__", None) or {}, {}
    for key, info in header.items():
        try:
            dtype, shape, (begin, end) = dtypes[info["dtype"]], [int(n) for n in info["shape"]], info["data_offsets"]
        except (KeyError, TypeError, ValueError) as err:
            raise damaged(f"tensor {key!r} has an unreadable entry {info!r}") from err
        size = dtype.itemsize * int(np.prod(shape, dtype=np.int64))
        if not (isinstance(begin, int) and isinstance(end, int) and begin >= 0 and end == begin + size <= len(body)):
            raise damaged(f"tensor {key!r} of shape {shape} lies at bytes {begin}..{end} of {len(body)}")
        chunk = body[begin:end]
        if chunk.storage_offset() % dtype.itemsize:  # a view needs an aligned offset
            chunk = chunk.clone()
        tensors[key] = chunk.view(dtype).reshape(shape)
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise damaged("its metadata is not a map of strings")
    return tensors, meta


def capture_rng_state() -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Every RNG of this process: python, numpy, torch, cuda. Tensors + JSON metadata, no pickle."""
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"cuda_{i}"] = state
    if (xm := running_xla()) is not None:  # the XLA device's generator: an unsigned 64-bit seed, kept as int64 bits
        seed = xm.get_rng_state()
        tensors["xla"] = torch.tensor([seed - 2**64 if seed >= 2**63 else seed], dtype=torch.int64)
    py_version, py_state, py_gauss = random.getstate()
    np_state: Any = np.random.get_state()
    meta = {
        "python": json.dumps([py_version, list(py_state), py_gauss]),
        "numpy": json.dumps([np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])]),
    }
    return tensors, meta


@contextlib.contextmanager
def rng_kept() -> Iterator[None]:
    """Leave every RNG of this process (python, numpy, torch, cuda) as it was before the block."""
    py_state, np_state = random.getstate(), np.random.get_state()
    cuda = list(range(torch.cuda.device_count())) if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=cuda):
        try:
            yield
        finally:
            random.setstate(py_state)
            np.random.set_state(np_state)


def save_rng_state(path: Path) -> None:
    tensors, meta = capture_rng_state()
    save_safetensors(tensors, path, metadata=meta)


def load_rng_state(path: Path) -> None:
    with open(path, "rb") as fh:
        data = torch.frombuffer(bytearray(fh.read()), dtype=torch.uint8)
    restore_rng_state(*parse_safetensors(data, path), path)


def restore_rng_state(tensors: dict[str, torch.Tensor], meta: dict[str, str], source: Path) -> None:
    """Set every RNG of this process from what `save_rng_state` wrote to `source` (its tensors and metadata)."""
    try:
        py_version, py_state, py_gauss = json.loads(meta["python"])
        np_state = json.loads(meta["numpy"])
    except (KeyError, ValueError, TypeError) as err:
        raise CheckpointError(f"{source} lacks valid python/numpy RNG states ({err})") from err
    random.setstate((py_version, tuple(py_state), py_gauss))
    np.random.set_state((np_state[0], np.array(np_state[1], dtype=np.uint32), np_state[2], np_state[3], np_state[4]))
    torch.set_rng_state(tensors["torch"].clone())  # (a view of a file's buffer would crash it: its own storage)
    cuda = [tensors[k].clone() for k in sorted(k for k in tensors if k.startswith("cuda_"))]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda[: torch.cuda.device_count()])
    if "xla" in tensors and (xm := running_xla()) is not None:
        xm.set_rng_state(int(tensors["xla"][0]) % 2**64)


_CRC_LOCK = threading.Lock()


@contextlib.contextmanager
def without_zip_crc() -> Iterator[None]:
    """``torch.save`` inside the block skips the CRC-32 of every record of its zip file: a second checksum pass over
    every byte, which ``torch.load`` never checks (torch builds its zip reader without those checks) and which the
    manifest's digest of the whole file supersedes. The files are torch's usual format otherwise. (The setting is
    torch's, process-wide: a ``torch.save`` in another thread meanwhile skips it too; its file loads the same.)"""
    get, put = getattr(torch.serialization, "get_crc32_options", None), getattr(torch.serialization, "set_crc32_options", None)
    if get is None or put is None:  # (torch < 2.5 always computes it)
        yield
        return
    with _CRC_LOCK:
        before = get()
        put(False)
        try:
            yield
        finally:
            put(before)


def tensor_bytes(obj: Any) -> int:
    """Bytes of the tensors in a nested structure (what a file holding it needs, roughly)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


_ST_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.int64: "I64",
    torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
}


def write_safetensors(out: Any, state: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    """Stream `state` to the binary file `out` in the safetensors format, one tensor at a time (no full copy).

    Tied tensors are written once per key, as `dedupe_shared_tensors` gives them to ``safetensors``.
    """
    header: dict[str, Any] = {"__metadata__": metadata or {"format": "pt"}}
    tensors, offset = [], 0
    for key, tensor in state.items():
        tensor = tensor.detach()
        if tensor.dtype not in _ST_DTYPES:
            raise TypeError(f"cannot store {key!r} of dtype {tensor.dtype} in safetensors; convert it to a supported dtype")
        tensor = tensor.to("cpu").contiguous()
        nbytes = tensor.numel() * tensor.element_size()
        header[key] = {"dtype": _ST_DTYPES[tensor.dtype], "shape": list(tensor.shape), "data_offsets": [offset, offset + nbytes]}
        tensors.append(tensor)
        offset += nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    out.write(struct.pack("<Q", len(encoded)) + encoded)
    for tensor in tensors:
        if tensor.numel():
            out.write(tensor.reshape(-1).view(torch.uint8).numpy())


def write_json_durably(path: Path, data: Any, *, folder: Path | None = None) -> None:
    """Write JSON to `path` through a temporary file, flushed and fsynced, then renamed over `path`.

    With `folder`, that directory is flushed too, after the rename and together with the file (two waits on the disk
    at once, which a journaling file system serves with one commit)."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.flush()
        if folder is None:
            os.fsync(fh.fileno())
        else:
            os.replace(tmp, path)
            with ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-fsync") as pool:
                entries = pool.submit(fsync_dir, folder)
                os.fsync(fh.fileno())
                entries.result()
    if folder is None:
        os.replace(tmp, path)


def move_into_place(partial: Path, target: Path, *, flushed: bool = False) -> None:
    """Rename the finished `partial` directory to `target` (its entries flushed first, unless `flushed` says they
    are); an older `target` is removed only once the new one is in place."""
    if not flushed:
        fsync_dir(partial)
    old = None
    if target.exists():
        old = target.parent / f".{target.name}.old"
        if old.exists():
            shutil.rmtree(old)
        os.replace(target, old)
    os.replace(partial, target)
    fsync_dir(target.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
