"""Collectives over nested structures (tensors in tuples, lists, dicts, dataclasses, namedtuples).

Every function works in a single process too (it then returns its input, shaped as a gather would).
Gathering tensors whose shapes differ across ranks pads to the largest size along dim 0, gathers and
trims; shapes that differ in any other dimension, or dtypes or device types that differ, raise a
`ValueError` on every rank (no hang).
"""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.distributed as dist


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def apply_to_tensors(fn: Callable[[torch.Tensor], Any], data: Any) -> Any:
    """Apply `fn` to every tensor in a nested structure, rebuilding the same container types."""
    if isinstance(data, torch.Tensor):
        return fn(data)
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # namedtuple
        return type(data)(*(apply_to_tensors(fn, x) for x in data))
    if isinstance(data, (list, tuple)):
        return type(data)(apply_to_tensors(fn, x) for x in data)
    if isinstance(data, Mapping):  # dicts, and mappings such as transformers' BatchEncoding
        return type(data)({k: apply_to_tensors(fn, v) for k, v in data.items()})  # type: ignore[call-arg]
    if dataclasses.is_dataclass(data) and not isinstance(data, type):
        return dataclasses.replace(data, **{f.name: apply_to_tensors(fn, getattr(data, f.name)) for f in dataclasses.fields(data) if f.init})
    return data


_DTYPES: list[torch.dtype] = [
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
    torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128,
]


def _dtype_code(dtype: torch.dtype) -> int:
    return _DTYPES.index(dtype) if dtype in _DTYPES else len(_DTYPES)


def _gather_shapes(tensor: torch.Tensor, group: Any = None) -> list[list[int]]:
    """All-gather every rank's shape; raise `ValueError` on every rank when dtypes or device types differ."""
    world = dist.get_world_size(group)
    if tensor.ndim > 8:
        raise ValueError(f"cannot gather a tensor with {tensor.ndim} dimensions; at most 8 are supported")
    # Dtype and device type travel with the shape so that every rank sees a mismatch and raises, instead of
    # gloo mixing element sizes (garbage on one rank, SIGABRT on another).
    device_code = 0 if tensor.device.type == "cpu" else 1
    meta = torch.tensor(
        [tensor.ndim, _dtype_code(tensor.dtype), device_code] + list(tensor.shape) + [0] * (8 - tensor.ndim),
        device=tensor.device, dtype=torch.long,
    )
    metas = [torch.empty_like(meta) for _ in range(world)]
    dist.all_gather(metas, meta, group=group)
    dtypes = [int(m[1]) for m in metas]
    devices = [int(m[2]) for m in metas]
    if len(set(dtypes)) > 1 or len(set(devices)) > 1:
        names = [str(_DTYPES[d]) if d < len(_DTYPES) else "other" for d in dtypes]
        kinds = ["cpu" if d == 0 else "accelerator" for d in devices]
        per_rank = ", ".join(f"rank {r}: {n} on {k}" for r, (n, k) in enumerate(zip(names, kinds)))
        raise ValueError(
            f"cannot gather tensors whose dtypes or devices differ across processes ({per_rank}); "
            f"this rank has {tensor.dtype} on {tensor.device}. Cast every rank to the same dtype and device first, "
            "e.g. tensor.to(torch.float32), or use gather_object()"
        )
    return [m[3 : 3 + int(m[0])].tolist() for m in metas]


def gather_tensor(tensor: torch.Tensor, group: Any = None) -> torch.Tensor:
    """All-gather one tensor (over `group`, default all processes) and concatenate along dim 0 (0-dim tensors become
    a 1-D tensor of the group's size)."""
    if not is_distributed():
        return tensor.unsqueeze(0) if tensor.ndim == 0 else tensor
    if tensor.ndim == 0:
        tensor = tensor.unsqueeze(0)
    tensor = tensor.contiguous()
    shapes = _gather_shapes(tensor, group)
    if any(len(s) != tensor.ndim or s[1:] != list(tensor.shape[1:]) for s in shapes):
        raise ValueError(
            f"cannot gather tensors whose shapes differ beyond dim 0 across processes: {shapes}; "
            "pad them first with pad_across_processes(tensor, dim=...) or gather_object()"
        )
    max_len = max(s[0] for s in shapes)
    if tensor.shape[0] != max_len:
        pad = tensor.new_zeros((max_len - tensor.shape[0], *tensor.shape[1:]))
        padded = torch.cat([tensor, pad], dim=0)
    else:
        padded = tensor
    out = [torch.empty_like(padded) for _ in shapes]
    dist.all_gather(out, padded, group=group)
    return torch.cat([o[: s[0]] for o, s in zip(out, shapes)], dim=0)


def gather(data: Any, group: Any = None) -> Any:
    """All-gather every tensor of a nested structure (concatenated along dim 0), over `group` (default: all processes)."""
    return apply_to_tensors(lambda t: gather_tensor(t, group), data)


def gather_object(obj: Any) -> list[Any]:
    """Gather picklable objects; lists are concatenated, anything else becomes one entry per rank."""
    if not is_distributed():
        return list(obj) if isinstance(obj, list) else [obj]
    out = all_gather_object(obj)
    if all(isinstance(o, list) for o in out):
        return [x for o in out for x in o]
    return out


_ONE_ROUND = 4096  # bytes: a pickled object up to this size is gathered in one collective


def all_gather_object(obj: Any) -> list[Any]:
    """Every process's `obj`, one entry per rank (`dist.all_gather_object`), in one collective when every pickled
    object fits `_ONE_ROUND` bytes (flags, paths, file lists): each process sends a fixed-size buffer that carries
    its object's length, so no round of sizes goes first. A larger object takes a second round. Other backends than
    gloo use `dist.all_gather_object` as it is."""
    if dist.get_backend() != "gloo":
        out: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(out, obj)
        return out
    data = pickle.dumps(obj)
    buffer = torch.zeros(8 + _ONE_ROUND, dtype=torch.uint8)
    buffer[:8] = torch.tensor([len(data)], dtype=torch.int64).view(torch.uint8)
    if len(data) <= _ONE_ROUND:
        buffer[8 : 8 + len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    buffers = [torch.empty_like(buffer) for _ in range(dist.get_world_size())]
    dist.all_gather(buffers, buffer)
    sizes = [int(b[:8].view(torch.int64)) for b in buffers]
    if max(sizes) <= _ONE_ROUND:
        return [pickle.loads(b[8 : 8 + n].numpy().tobytes()) for b, n in zip(buffers, sizes)]
    whole = torch.zeros(max(sizes), dtype=torch.uint8)
    whole[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    buffers = [torch.empty_like(whole) for _ in sizes]
    dist.all_gather(buffers, whole)
    return [pickle.loads(b[:n].numpy().tobytes()) for b, n in zip(buffers, sizes)]


def pad_tensor_across_processes(
    tensor: torch.Tensor, dim: int = 0, pad_index: int = 0, pad_first: bool = False, group: Any = None
) -> torch.Tensor:
    if not is_distributed() or tensor.ndim == 0:
        return tensor
    if dim >= tensor.ndim or dim < -tensor.ndim:
        raise ValueError(f"dim={dim} is out of range for a tensor with {tensor.ndim} dimensions")
    dim = dim % tensor.ndim
    size = torch.tensor([tensor.shape[dim]], device=tensor.device, dtype=torch.long)
    sizes = [torch.empty_like(size) for _ in range(dist.get_world_size(group))]
    dist.all_gather(sizes, size, group=group)
    max_size = max(int(s.item()) for s in sizes)
    if max_size == tensor.shape[dim]:
        return tensor
    new_shape = list(tensor.shape)
    new_shape[dim] = max_size
    out = tensor.new_full(new_shape, pad_index)
    start = max_size - tensor.shape[dim] if pad_first else 0
    index = [slice(None)] * tensor.ndim
    index[dim] = slice(start, start + tensor.shape[dim])
    out[tuple(index)] = tensor
    return out


def pad_across_processes(data: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False, group: Any = None) -> Any:
    """Pad every tensor along `dim` to the largest size over the processes of `group` (default: all)."""
    return apply_to_tensors(lambda t: pad_tensor_across_processes(t, dim, pad_index, pad_first, group), data)


_REDUCTIONS = ("sum", "mean", "max", "min")


def reduce(data: Any, reduction: str = "sum", scale: float = 1.0, group: Any = None) -> Any:
    """All-reduce every tensor (``"sum"``, ``"mean"``, ``"max"``, ``"min"``) over `group` (default: all processes);
    returns new tensors."""
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction={reduction!r} is not supported; choose one of {', '.join(map(repr, _REDUCTIONS))}")

    def _reduce(t: torch.Tensor) -> torch.Tensor:
        out = t.clone()
        if is_distributed():
            op = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}[reduction]
            dist.all_reduce(out, op=op, group=group)
            if reduction == "mean":
                out = out / dist.get_world_size(group)
        return out * scale if scale != 1.0 else out

    return apply_to_tensors(_reduce, data)


def broadcast(data: Any, from_process: int = 0) -> Any:
    """Broadcast every tensor from `from_process` (shapes must agree across ranks)."""
    def _bcast(t: torch.Tensor) -> torch.Tensor:
        if not is_distributed():
            return t
        out = t.clone().contiguous()
        dist.broadcast(out, src=from_process)
        return out

    return apply_to_tensors(_bcast, data)


def broadcast_object(obj: Any, from_process: int = 0) -> Any:
    """Broadcast a picklable object from `from_process`; every rank returns it."""
    if not is_distributed():
        return obj
    holder = [obj]
    dist.broadcast_object_list(holder, src=from_process)
    return holder[0]


def barrier() -> None:
    if is_distributed():
        dist.barrier()
