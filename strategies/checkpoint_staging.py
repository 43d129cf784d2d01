"""Staging: the copy of a training state that an asynchronous save writes from.

An asynchronous save must not write from the training tensors (the next step changes them while the write is
running), so the step copies them once into staging buffers and the background writer writes the copy: a
consistent snapshot. The buffers are kept from one save to the next (allocating and first touching hundreds of
megabytes costs about three times the copy itself), pinned when an accelerator is present so a device-to-host copy
is a DMA, and reused as long as a tensor keeps its shape and dtype.

With ``shared=True`` the buffers live in shared memory that the checkpoint writer process maps too
(`strategies.checkpoint_process`), so the write reads the snapshot where the step left it, without a second copy.
The memory is anonymous (``memfd_create``): it has no name under ``/dev/shm``, and the kernel frees it when the last
process holding it ends, however it ends (``kill -9`` included); nothing can be left behind.

A sharded tensor (`DTensor`) is staged as its local shard, wrapped again with the same mesh and placements, so
`torch.distributed.checkpoint` writes it as it would the original.
"""

from __future__ import annotations

import copy
import itertools
import mmap
import os
from typing import Any

import torch

_SEGMENT = 64 << 20  # shared memory comes in segments of at least this size (reserved, not touched, until used)
_ALIGN = 64
_IDENTS = itertools.count()  # segments are numbered across the stagings of a process (the writer maps them by number)


def shared_memory_available() -> bool:
    """Whether this platform has anonymous shared memory that can be handed to another process (Linux's memfd)."""
    return hasattr(os, "memfd_create")


class Segment:
    """One block of anonymous shared memory: its descriptor (sent to the writer process once) and this process's
    mapping of it, as a uint8 tensor that the staging buffers are views of."""

    def __init__(self, ident: int, nbytes: int, pin: bool) -> None:
        self.ident, self.nbytes = ident, nbytes
        self.fd = os.memfd_create(f"trainwright-staging-{ident}", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, nbytes)
        self.map = mmap.mmap(self.fd, nbytes)
        self.tensor = torch.frombuffer(self.map, dtype=torch.uint8)
        self.base = self.tensor.data_ptr()
        self.used = 0  # bytes handed out (bump allocation)
        self.live = 0  # buffers in use
        self.pinned = pin and _pin(self.base, nbytes)

    def take(self, nbytes: int) -> int | None:
        """The offset of `nbytes` bytes handed out here, or None when they do not fit."""
        begin = -(-self.used // _ALIGN) * _ALIGN
        if begin + nbytes > self.nbytes:
            return None
        self.used, self.live = begin + nbytes, self.live + 1
        return begin

    def buffer(self, offset: int, nbytes: int) -> torch.Tensor:
        """`nbytes` bytes at `offset`, as a uint8 tensor with a storage of its own (``torch.save`` writes a tensor's
        whole storage, and refuses two dtypes on one)."""
        return torch.frombuffer(self.map, dtype=torch.uint8, count=nbytes, offset=offset)

    def close(self) -> None:
        if self.pinned:
            torch.cuda.cudart().cudaHostUnregister(self.base)
        del self.tensor
        try:
            self.map.close()
        except BufferError:  # a tensor still views it: the mapping goes with the last one
            pass
        os.close(self.fd)


def _pin(address: int, nbytes: int) -> bool:
    """Page-lock shared host memory for DMA from the device (best effort: unpinned copies are correct, only slower)."""
    try:
        return int(torch.cuda.cudart().cudaHostRegister(address, nbytes, 0)) == 0
    except (RuntimeError, AttributeError):
        return False


class Staging:
    """Reusable host buffers for the tensors of checkpointed states, keyed by where a tensor sits in its state.

    Args:
        shared: allocate the buffers in shared memory (`Segment`s) that a writer process can map.
    """

    def __init__(self, *, shared: bool = False) -> None:
        if shared and not shared_memory_available():
            raise RuntimeError("Staging(shared=True) needs os.memfd_create (Linux); stage in private memory (shared=False)")
        self.shared = shared
        self._host_buffers: dict[tuple[Any, ...], torch.Tensor] = {}
        self._owner: dict[tuple[Any, ...], Segment] = {}  # (shared) the segment of each buffer
        self._used: set[tuple[Any, ...]] = set()
        self._pin = torch.cuda.is_available()
        self.segments: dict[int, Segment] = {}
        self.released: list[int] = []  # segments freed since the writer last heard (it unmaps them)
        self._compact = False

    def copy(self, name: str, state: Any) -> Any:
        """A copy of `state` (nested dicts, lists, tuples; tensors and plain values) whose tensors live in this
        staging's buffers. Tensors are copied without a host sync per tensor; `finish` waits for the copies."""
        return self._copy(state, (name,))

    def finish(self) -> None:
        """Wait for the device-to-host copies and release buffers no staged state used this time."""
        if self._pin and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        for key in set(self._host_buffers) - self._used:
            self._drop(key)
        self._used.clear()
        if self.shared:
            live = self.nbytes()
            wasted = sum(s.nbytes for s in self.segments.values()) - live  # (dropped buffers' bytes, unused room)
            if wasted > max(live, _SEGMENT):  # a layout that keeps changing: start over at the next save
                self._compact = True

    def begin(self) -> None:
        """Called before a save copies anything (its predecessor's write is over): where the buffers' layout left too
        much shared memory unused, every buffer is dropped and allocated afresh by this save."""
        if self._compact:
            for key in list(self._host_buffers):
                self._drop(key)
            self._compact = False

    def locate_bytes(self, address: int, nbytes: int) -> tuple[int, int] | None:
        """(segment, offset) of the `nbytes` bytes at `address` when they lie in this staging's shared memory, else None."""
        for segment in self.segments.values():
            if segment.base <= address and address + nbytes <= segment.base + segment.nbytes:
                return segment.ident, address - segment.base
        return None

    def close(self) -> None:
        """Release every buffer and shared segment (`released` then names the segments)."""
        for key in list(self._host_buffers):
            self._drop(key)

    def _drop(self, key: tuple[Any, ...]) -> None:
        del self._host_buffers[key]
        segment = self._owner.pop(key, None)
        if segment is not None:
            segment.live -= 1
            if segment.live == 0:
                del self.segments[segment.ident]
                self.released.append(segment.ident)
                segment.close()

    def _copy(self, value: Any, key: tuple[Any, ...]) -> Any:
        if isinstance(value, torch.Tensor):
            return self._tensor(value, key)
        if isinstance(value, dict):
            return {k: self._copy(v, (*key, k)) for k, v in value.items()}
        if type(value) in (list, tuple):
            return type(value)(self._copy(v, (*key, i)) for i, v in enumerate(value))
        if value is None or isinstance(value, (bool, int, float, str, bytes)):
            return value
        return copy.deepcopy(value)

    def _tensor(self, tensor: torch.Tensor, key: tuple[Any, ...]) -> torch.Tensor:
        if type(tensor).__name__ == "DTensor":  # (no import of torch.distributed.tensor for plain states)
            from torch.distributed.tensor import DTensor

            sharded: Any = tensor
            local = self._tensor(sharded.to_local(), key)
            return DTensor.from_local(local, sharded.device_mesh, sharded.placements, run_check=False,
                                      shape=sharded.shape, stride=sharded.stride())
        tensor = tensor.detach()
        buffer = self._host_buffers.get(key)
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype or not buffer.is_contiguous():
            if buffer is not None:
                self._drop(key)
            buffer = self._allocate(key, tensor)
        self._used.add(key)
        buffer.copy_(tensor, non_blocking=buffer.is_pinned() or (key in self._owner and self._owner[key].pinned))
        return buffer

    def _allocate(self, key: tuple[Any, ...], tensor: torch.Tensor) -> torch.Tensor:
        if not self.shared:
            buffer = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=self._pin and tensor.device.type == "cuda")
        else:
            nbytes = tensor.numel() * tensor.element_size()
            if nbytes == 0:
                buffer = torch.empty(tensor.shape, dtype=tensor.dtype)
                self._host_buffers[key] = buffer
                return buffer
            found = next(((s, offset) for s in self.segments.values() if (offset := s.take(nbytes)) is not None), None)
            if found is None:
                segment = Segment(next(_IDENTS), max(_SEGMENT, -(-nbytes // _ALIGN) * _ALIGN), self._pin)
                self.segments[segment.ident] = segment
                found = segment, segment.take(nbytes) or 0
            segment, offset = found
            buffer = segment.buffer(offset, nbytes).view(tensor.dtype).view(tensor.shape)
            self._owner[key] = segment
        self._host_buffers[key] = buffer
        return buffer

    def nbytes(self) -> int:
        return sum(buffer.numel() * buffer.element_size() for buffer in self._host_buffers.values())
