"""Checkpoint files: one directory per checkpoint, written atomically, read without unpickling arbitrary objects.

Layout of a checkpoint directory (`Accelerator.save_state`; `Trainer.save_checkpoint` adds ``hparams.json``
and its loop state in ``extra_state.json``)::

    model.safetensors / model_1.safetensors ...     full state dicts, unwrapped keys (single, DDP)
    optimizer.bin / optimizer_1.bin ...             torch.save, loaded with weights_only=True (single, DDP)
    sharded/                                        FSDP: model and optimizer shards, torch.distributed.checkpoint
    scheduler.bin / scheduler_1.bin ...             torch.save, loaded with weights_only=True
    scaler.bin                                      fp16 loss scaler (when used)
    custom_checkpoint_0.bin ...                     objects given to register_for_checkpointing
    random_states_<rank>.safetensors                torch/cuda RNG tensors; python/numpy states in its metadata
    dataloaders.json, extra_state.json              JSON
    manifest.json                                   written last: size and SHA-256 of every file, metadata

`CheckpointWriter` stages it in ``.<name>.partial`` and hashes each file while writing it; `verify_checkpoint`
checks every file against the manifest before anything is loaded.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import pickle
import random
import shutil
import struct
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from strategies.materialize import is_sharded_module, load_safetensors_slices


class CheckpointError(ValueError):
    """A checkpoint is incomplete, tampered with, or not a trainwright checkpoint."""


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"cannot read {path}: {err}; the checkpoint is damaged or was tampered with") from err


def torch_save(obj: Any, path: Path) -> None:
    torch.save(obj, path)


def torch_load(path: Path, map_location: Any = "cpu") -> Any:
    """`torch.load` that refuses anything but tensors and plain containers."""
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
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


# RNG states -----------------------------------------------------------------------------------------------


def capture_rng_state() -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Every RNG of this process: python, numpy, torch, cuda. Tensors + JSON metadata, no pickle."""
    tensors = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"cuda_{i}"] = state
    py_version, py_state, py_gauss = random.getstate()
    np_state: Any = np.random.get_state()
    meta = {
        "python": json.dumps([py_version, list(py_state), py_gauss]),
        "numpy": json.dumps([np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])]),
    }
    return tensors, meta


def save_rng_state(path: Path) -> None:
    tensors, meta = capture_rng_state()
    save_safetensors(tensors, path, metadata=meta)


def load_rng_state(path: Path) -> None:
    from safetensors import safe_open

    tensors = load_safetensors(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        py_version, py_state, py_gauss = json.loads(meta["python"])
        np_state = json.loads(meta["numpy"])
    except (KeyError, ValueError, TypeError) as err:
        raise CheckpointError(f"{path} lacks valid python/numpy RNG states ({err})") from err
    random.setstate((py_version, tuple(py_state), py_gauss))
    np.random.set_state((np_state[0], np.array(np_state[1], dtype=np.uint32), np_state[2], np_state[3], np_state[4]))
    torch.set_rng_state(tensors["torch"])
    cuda = [tensors[k] for k in sorted(k for k in tensors if k.startswith("cuda_"))]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda[: torch.cuda.device_count()])



# One checkpoint directory: staged, hashed while written, one manifest written last -------------------------

MANIFEST_NAME = "manifest.json"
FORMAT_NAME = "trainwright-checkpoint"
FORMAT_VERSION = 2
LEGACY_MARKER = "checkpoint.json"  # format 1: an Accelerator directory marked complete by this file, without hashes
_HASH_CHUNK = 1 << 22


class _HashingFile:
    """A binary file that hashes (SHA-256) and counts what is written through it."""

    def __init__(self, fh: Any) -> None:
        self.fh, self.digest, self.size = fh, hashlib.sha256(), 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.digest.update(view)
        self.size += len(view)
        written: int = self.fh.write(view)
        return written

    def flush(self) -> None:
        self.fh.flush()


class CheckpointWriter:
    """Writes one checkpoint directory: every file goes into the hidden ``.<name>.partial`` sibling, hashed as
    it is written (no file is read back), and `commit` writes ``manifest.json`` (sizes, SHA-256s, metadata)
    last, flushes, and renames the directory into place. A crash at any point leaves ``<name>`` as it was.

    Every process makes its own writer for the same directory; rank 0 `commit`s with the others' entries.
    """

    def __init__(self, final: str | os.PathLike[str]) -> None:
        self.final = Path(final).absolute()
        self.staging = self.final.parent / f".{self.final.name}.partial"
        self.files: dict[str, dict[str, Any]] = {}

    def clear_staging(self) -> None:
        """Remove what crashed saves left next to the target (rank 0, before the others write), then make the staging directory."""
        if self.final.exists() and not self.final.is_dir():
            raise FileExistsError(f"cannot save a checkpoint to {str(self.final)!r}: it is a file; pass a directory path")
        if self.final.parent.is_dir():
            for stale in self.final.parent.iterdir():
                if stale.name.startswith(".") and stale.name.endswith((".partial", ".partial.tmp")) and stale.is_dir():
                    shutil.rmtree(stale, ignore_errors=True)
        self.staging.mkdir(parents=True)

    def _write(self, name: str, produce: Any, nbytes: int = 0) -> None:
        path = self.staging / name
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "wb") as fh:
                out = _HashingFile(fh)
                produce(out)
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as err:
            if err.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            free = shutil.disk_usage(self.staging.parent).free
            shutil.rmtree(self.staging, ignore_errors=True)
            raise OSError(
                err.errno,
                f"no space left to save checkpoint {str(self.final)!r}: writing {name} (about {nbytes / 1e6:.1f} MB) failed with "
                f"{free / 1e6:.1f} MB free on that device. The partial checkpoint was removed and earlier checkpoints are "
                "untouched; free space, lower ModelCheckpoint(save_top_k=...), or save to another directory",
            ) from err
        self.files[name] = {"size": out.size, "sha256": out.digest.hexdigest()}

    def save_safetensors(self, name: str, state: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
        self._write(name, lambda out: write_safetensors(out, state, metadata), _tensor_bytes(state))

    def save_torch(self, name: str, obj: Any) -> None:
        self._write(name, lambda out: torch.save(obj, out), _tensor_bytes(obj))

    def save_json(self, name: str, data: Any) -> None:
        self._write(name, lambda out: out.write(json.dumps(data, indent=1, sort_keys=True).encode()))

    def save_rng_state(self, name: str) -> None:
        tensors, meta = capture_rng_state()
        self.save_safetensors(name, tensors, metadata=meta)

    def hash_written(self, names: list[str]) -> None:
        """Record files another library wrote into the staging directory (DCP shards): these are read back once."""
        for name in names:
            path = self.staging / name
            self.files[name] = {"size": path.stat().st_size, "sha256": sha256_of(path)}

    def commit(self, meta: dict[str, Any], others: Sequence[dict[str, dict[str, Any]]] = ()) -> Path:
        """Write the manifest (this rank's files plus `others`), flush, and move the directory into place."""
        files = dict(self.files)
        for entries in others:
            files.update(entries)
        manifest = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, **meta, "files": dict(sorted(files.items()))}
        write_json_durably(self.staging / MANIFEST_NAME, manifest)
        fsync_dir(self.staging)
        move_into_place(self.staging, self.final)
        return self.final


def _tensor_bytes(obj: Any) -> int:
    """Bytes of the tensors in a nested structure (what a file holding it needs, roughly)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v) for v in obj)
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


def write_json_durably(path: Path, data: Any) -> None:
    """Write JSON to `path` through a temporary file, flushed and fsynced, then renamed over `path`."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def move_into_place(partial: Path, target: Path) -> None:
    """Rename the finished `partial` directory to `target`; an older `target` is removed only once the new one is in place."""
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


# Reading: the manifest first, every file checked against it before any is loaded ---------------------------


def read_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate the manifest of a checkpoint directory (no file contents are checked).

    Format-1 Accelerator directories (``checkpoint.json``, no hashes) are read too, as a manifest without
    ``files``.

    Raises:
        FileNotFoundError: `directory` does not exist.
        CheckpointError (a ValueError): it is not a complete checkpoint.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"checkpoint {str(directory)!r} does not exist; pass a checkpoint directory (or 'last'/'best')")
    path = directory / MANIFEST_NAME
    if not path.is_file():
        if (directory / LEGACY_MARKER).is_file():
            legacy = read_json(directory / LEGACY_MARKER)
            if isinstance(legacy, dict):
                return legacy
        raise CheckpointError(
            f"{str(directory)!r} is not a complete checkpoint: it has no {MANIFEST_NAME} (the file written last, so the "
            "save was interrupted or this is not a checkpoint directory); pass a directory written by "
            "Trainer.save_checkpoint, ModelCheckpoint or Accelerator.save_state, or ckpt_path='last'"
        )
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"checkpoint {str(directory)!r} has an unreadable {MANIFEST_NAME}: {err}") from err
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME or not isinstance(manifest.get("files"), dict):
        raise CheckpointError(f"{str(path)!r} is not a {FORMAT_NAME} manifest; the checkpoint is damaged or was not written by Trainwright")
    version = manifest.get("format_version", 0)
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {str(directory)!r} has format version {version!r}, newer than this Trainwright reads "
            f"({FORMAT_VERSION}); upgrade Trainwright to load it"
        )
    return manifest


def verify_checkpoint(
    directory: str | os.PathLike[str], *, share: tuple[int, int, Any] | None = None, hashes: bool = True
) -> dict[str, Any]:
    """Check that every file of the checkpoint matches its manifest; return the manifest.

    Args:
        directory: the checkpoint directory.
        hashes: compare SHA-256s (reads every file once); False compares only names and sizes.
        share: ``(rank, world_size, all_gather_object)`` to split the hashing across the processes (each
            hashes every ``world_size``-th file) and agree on the result; every process must then call it.

    Raises:
        CheckpointError (a ValueError): a file was changed, added or removed since the checkpoint was written
            (on every process, when shared).
    """
    directory = Path(directory)
    manifest = read_manifest(directory)
    expected = manifest.get("files")
    if expected is None:  # format 1 Accelerator directory: complete, but without hashes to check
        return manifest
    rank, world, gather = share if share is not None and share[1] > 1 else (0, 1, None)
    present = {p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file()} - {MANIFEST_NAME}
    problems = [f"{name} is missing" for name in sorted(set(expected) - present)]
    problems += [f"{name} was added" for name in sorted(present - set(expected))]
    for name in sorted(present & set(expected))[rank::world]:
        entry, path = expected[name], directory / name
        if not isinstance(entry, dict) or path.stat().st_size != entry.get("size") or (hashes and sha256_of(path) != entry.get("sha256")):
            problems.append(f"{name} was modified")
    if gather is not None:
        problems = sorted({problem for found in gather(problems) for problem in found})
    if problems:
        raise CheckpointError(
            f"refusing to load checkpoint {str(directory)!r}: its files do not match its manifest ({'; '.join(problems)}). "
            "It was damaged or tampered with after saving; load an intact checkpoint"
        )
    return manifest


def is_complete(directory: str | os.PathLike[str]) -> bool:
    """True when `directory` holds a finished checkpoint (its manifest exists and lists files that exist)."""
    try:
        manifest = read_manifest(directory)
    except (OSError, ValueError):
        return False
    return all((Path(directory) / name).is_file() for name in manifest.get("files") or {})


# --------------------------------------------------------------------------------------------- a run's checkpoints
LAST_POINTER_NAME = "last.json"


def default_checkpoint_dir(project_dir: str | os.PathLike[str]) -> Path:
    """``<project_dir>/checkpoints``, absolute: where a `Trainer` run's checkpoints go unless told otherwise."""
    return Path(project_dir).absolute() / "checkpoints"


def write_last_pointer(dirpath: Path, checkpoint: Path) -> None:
    """Make ``<dirpath>/last.json`` name `checkpoint` (a directory inside `dirpath`), atomically."""
    write_json_durably(dirpath / LAST_POINTER_NAME, {"format": FORMAT_NAME, "last": checkpoint.name})


def read_last_pointer(dirpath: str | os.PathLike[str]) -> Path | None:
    """The checkpoint that ``<dirpath>/last.json`` names, if it is a complete checkpoint inside `dirpath`."""
    dirpath = Path(dirpath)
    try:
        data = json.loads((dirpath / LAST_POINTER_NAME).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    name = data.get("last") if isinstance(data, dict) else None
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name or name.startswith("."):
        return None
    candidate = dirpath / name
    return candidate if is_complete(candidate) else None


def save_model_weights(
    state: dict[str, torch.Tensor], directory: Path, *, max_shard_size: int | str = "10GB", safe_serialization: bool = True,
    weights_name: str = "model.safetensors",
) -> list[str]:
    """Save a state dict, sharded by `max_shard_size` with a ``*.index.json`` when it does not fit one file."""
    limit = parse_size(max_shard_size)
    directory.mkdir(parents=True, exist_ok=True)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for key, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > limit:
            shards.append({})
            size = 0
        shards[-1][key] = tensor
        size += nbytes
    if not safe_serialization:
        weights_name = weights_name.replace(".safetensors", ".bin")
    stem, ext = weights_name.rsplit(".", 1)
    names = [weights_name] if len(shards) == 1 else [f"{stem}-{i + 1:05d}-of-{len(shards):05d}.{ext}" for i in range(len(shards))]
    for name, shard in zip(names, shards):
        if safe_serialization:
            save_safetensors(shard, directory / name)
        else:
            torch_save(shard, directory / name)
    if len(shards) > 1:
        index = {
            "metadata": {"total_size": sum(t.numel() * t.element_size() for t in state.values())},
            "weight_map": {key: name for name, shard in zip(names, shards) for key in shard},
        }
        write_json_durably(directory / f"{weights_name}.index.json", index)
    return names


def parse_size(size: int | str) -> int:
    """``"5GB"`` → bytes (also KB/MB/GB/TB, KiB/MiB/GiB); ints pass through."""
    if isinstance(size, int):
        if size <= 0:
            raise ValueError(f"max_shard_size={size} must be positive")
        return size
    text = str(size).strip().upper()
    units = {"TIB": 2**40, "GIB": 2**30, "MIB": 2**20, "KIB": 2**10, "TB": 10**12, "GB": 10**9, "MB": 10**6, "KB": 10**3, "B": 1}
    for unit, factor in units.items():
        if text.endswith(unit):
            try:
                return int(float(text[: -len(unit)]) * factor)
            except ValueError:
                break
    raise ValueError(f"max_shard_size={size!r} is not a size; write it like '5GB', '500MB' or an int number of bytes")


# Sharded states (torch.distributed.checkpoint) ------------------------------------------------------------

SHARDED_DIR = "sharded"
DEEPSPEED_DIR = "deepspeed"  # the DeepSpeed engine's own checkpoint (strategies.deepspeed), next to model.safetensors


def is_sharded(directory: Path) -> bool:
    """True when `directory` holds its model and optimizer states as a DCP checkpoint (one file per process)."""
    return (Path(directory) / SHARDED_DIR / ".metadata").is_file()


def _distributed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def _owner(models: list[Any], optimizer: torch.optim.Optimizer) -> Any:
    """The model whose parameters `optimizer` steps."""
    params = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for model in models:
        if any(id(p) in params for p in model.parameters()):
            return model
    raise ValueError("an optimizer steps parameters of none of the prepared models; prepare the model it optimizes")


def _dcp_state(models: list[Any], optimizers: list[torch.optim.Optimizer]) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    state: dict[str, Any] = {f"model_{i}": get_model_state_dict(m) for i, m in enumerate(models)}
    for i, opt in enumerate(optimizers):
        state[f"optimizer_{i}"] = get_optimizer_state_dict(_owner(models, opt), opt)
    return state


def save_sharded(directory: Path, models: list[Any], optimizers: list[torch.optim.Optimizer]) -> None:
    """Every process writes its shards of the models and optimizers into `directory` (collective)."""
    import torch.distributed.checkpoint as dcp

    dcp.save(_dcp_state(models, optimizers), checkpoint_id=str(directory))


def load_sharded(directory: Path, models: list[Any], optimizers: list[torch.optim.Optimizer], *, strict: bool = True) -> None:
    """Load a `save_sharded` checkpoint into these models and optimizers, resharding to this run's processes.

    Works for any number of processes, also a plain single process without a process group.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    state = _dcp_state(models, optimizers)
    try:
        dcp.load(state, checkpoint_id=str(directory), no_dist=not _distributed())
    except Exception as err:  # DCP raises its own CheckpointException for missing keys or damaged files
        raise CheckpointError(f"cannot load the sharded states in {directory}: {err}") from err
    for i, model in enumerate(models):
        set_model_state_dict(model, state[f"model_{i}"], options=StateDictOptions(strict=strict))
    for i, opt in enumerate(optimizers):
        set_optimizer_state_dict(_owner(models, opt), opt, state[f"optimizer_{i}"])


def safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """The tensor shapes a safetensors file holds, read from its header (no tensor is loaded)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}  # noqa: SIM118  (safe_open is no dict)
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"cannot read {path} as safetensors: {err}; the file is damaged or was tampered with") from err


def check_state_fits(shapes: Mapping[str, Sequence[int]], module: Any, source: Path, *, strict: bool = True) -> None:
    """Raise `CheckpointError` before anything is loaded when the tensors of `source` (name -> shape) do not fit `module`.

    Torch's own error comes after the matching tensors were already copied in; this check keeps the model as it
    was and says which checkpoint and which model disagree.
    """
    own = module.state_dict(keep_vars=True)
    # ds_shape: the full shape of a DeepSpeed ZeRO-3 partitioned parameter (its own shape is empty)
    own_shapes = {key: tuple(getattr(value, "ds_shape", value.shape)) for key, value in own.items() if hasattr(value, "shape")}
    saved = {key: tuple(shape) for key, shape in shapes.items()}
    differ = [f"{key}: {saved[key]} in the checkpoint, {own_shapes[key]} in the model"
              for key in sorted(saved) if key in own_shapes and saved[key] != own_shapes[key]]
    problems = differ[:5]
    if strict and set(own) - set(saved):
        problems.append(f"missing in the checkpoint: {_listed(set(own) - set(saved))}")
    if strict and set(saved) - set(own):
        problems.append(f"not in the model: {_listed(set(saved) - set(own))}")
    if problems:
        fix = "" if differ else ", or pass strict=False to load only the keys both have"
        raise CheckpointError(
            f"{str(source)!r} holds the weights of another model than this {type(module).__name__}: " + "; ".join(problems)
            + f". Nothing was loaded. Build the model the checkpoint was saved from{fix}"
        )


def _listed(keys: set[str]) -> str:
    names = sorted(keys)
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def load_weights(
    directory: Path, module: Any, *, device: Any = "cpu", strict: bool = True, index: int = 0, load_full: Any = None
) -> None:
    """Load the weights of model `index` of a checkpoint directory into `module` (full or sharded format).

    `load_full(module, state, strict)` loads a full state dict (default: ``module.load_state_dict``; a sharding
    strategy passes its `load_module_state_dict`).

    The one weights loader of both faces: evaluation from a checkpoint, ``TrainModule.load_from_checkpoint``
    and resuming all read weights through it.
    """
    directory = Path(directory)
    if is_sharded(directory):
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

        state = {f"model_{index}": get_model_state_dict(module)}
        try:
            dcp.load(state, checkpoint_id=str(directory / SHARDED_DIR), no_dist=not _distributed())
        except Exception as err:
            raise CheckpointError(f"cannot load the sharded weights in {directory}: {err}") from err
        set_model_state_dict(module, state[f"model_{index}"], options=StateDictOptions(strict=strict))
        return
    name = "model.safetensors" if index == 0 else f"model_{index}.safetensors"
    weights = directory / name
    if not weights.is_file():
        raise FileNotFoundError(
            f"checkpoint {str(directory)!r} has no {name} and no sharded states; pass a directory written by "
            "Trainer.save_checkpoint or Accelerator.save_state"
        )
    if is_sharded_module(module):  # each process reads only its slices of the file
        check_state_fits(safetensors_shapes(weights), module, weights, strict=strict)
        load_safetensors_slices(weights, module)
        return
    full = load_safetensors(weights, device=str(torch.device(device)))
    if load_full is None:
        check_state_fits({k: v.shape for k, v in full.items()}, module, weights, strict=strict)  # `load_full` sees through wrappers
        module.load_state_dict(full, strict=strict)
    else:
        load_full(module, full, strict=strict)
