"""Checkpoint files: written atomically, read without unpickling arbitrary objects.

Layout of a state directory written by `Accelerator.save_state`::

    model.safetensors / model_1.safetensors ...     unwrapped state_dict keys
    optimizer.bin / optimizer_1.bin ...             torch.save, loaded with weights_only=True
    scheduler.bin / scheduler_1.bin ...             torch.save, loaded with weights_only=True
    scaler.bin                                      fp16 loss scaler (when used)
    custom_checkpoint_0.bin ...                     objects given to register_for_checkpointing
    random_states_<rank>.safetensors                torch/cuda RNG tensors; python/numpy states in its metadata
    dataloaders.json, extra_state.json              JSON
    checkpoint.json                                 written last: marks the directory complete
"""

from __future__ import annotations

import json
import os
import pickle
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

COMPLETE_MARKER = "checkpoint.json"
FORMAT_VERSION = 1


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


def fsync_tree(path: Path) -> None:
    """Flush every file under `path` (and the directories) to disk."""
    for root, _, files in os.walk(path):
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                os.fsync(f.fileno())
        fsync_dir(Path(root))


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=1, sort_keys=True))


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


def dedupe_shared_tensors(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Clone tensors that share storage (tied weights) so safetensors can store every key."""
    seen: set[tuple[int, int, int]] = set()
    out = {}
    for key, tensor in state.items():
        tensor = tensor.detach()
        if tensor.device.type != "cpu":
            tensor = tensor.cpu()
        ident = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tensor.nelement())
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
    np_state = np.random.get_state()
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


# Atomic directories -------------------------------------------------------------------------------------


def staging_dir(final: Path) -> Path:
    """The temporary sibling a checkpoint is written into before the rename."""
    return final.parent / f".{final.name}.tmp"


def begin_atomic_dir(final: Path) -> Path:
    tmp = staging_dir(final)
    if tmp.exists():
        shutil.rmtree(tmp)  # left over by a crash mid-save
    tmp.mkdir(parents=True)
    return tmp


def commit_atomic_dir(tmp: Path, final: Path, manifest: dict[str, Any]) -> None:
    """Write the completion marker, flush everything, and rename `tmp` into place."""
    write_json(tmp / COMPLETE_MARKER, {"format_version": FORMAT_VERSION, **manifest})
    fsync_tree(tmp)
    move_into_place(tmp, final)


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


def is_complete(path: Path) -> bool:
    return (Path(path) / COMPLETE_MARKER).is_file()


def check_complete(path: Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"checkpoint directory {str(path)!r} does not exist; pass the directory save_state wrote")
    if not is_complete(path):
        raise CheckpointError(
            f"{str(path)!r} is not a complete checkpoint (no {COMPLETE_MARKER}); it was interrupted mid-save "
            "or is not a trainwright checkpoint. Load an earlier checkpoint instead"
        )
    manifest = read_json(path / COMPLETE_MARKER)
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{path / COMPLETE_MARKER} is not a JSON object; the checkpoint was tampered with")
    return manifest


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
        write_json(directory / f"{weights_name}.index.json", index)
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
    state = load_safetensors(weights, device=str(torch.device(device)))
    if load_full is None:
        module.load_state_dict(state, strict=strict)
    else:
        load_full(module, state, strict=strict)
