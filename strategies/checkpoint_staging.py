"""Staging: the copy of a training state that an asynchronous save writes from.

An asynchronous save must not write from the training tensors (the next step changes them while the write is
running), so the step copies them once into staging buffers and the background thread writes the copy: a
consistent snapshot. The buffers are kept from one save to the next (allocating and first touching hundreds of
megabytes costs about three times the copy itself), pinned when an accelerator is present so a device-to-host copy
is a DMA, and reused as long as a tensor keeps its shape and dtype.

A sharded tensor (`DTensor`) is staged as its local shard, wrapped again with the same mesh and placements, so
`torch.distributed.checkpoint` writes it as it would the original.
"""

from __future__ import annotations

import copy
from typing import Any

import torch


class Staging:
    """Reusable host buffers for the tensors of checkpointed states, keyed by where a tensor sits in its state."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[Any, ...], torch.Tensor] = {}
        self._used: set[tuple[Any, ...]] = set()
        self._pin = torch.cuda.is_available()

    def copy(self, name: str, state: Any) -> Any:
        """A copy of `state` (nested dicts, lists, tuples; tensors and plain values) whose tensors live in this
        staging's buffers. Tensors are copied without a host sync per tensor; `finish` waits for the copies."""
        return self._copy(state, (name,))

    def finish(self) -> None:
        """Wait for the device-to-host copies and release buffers no staged state used this time."""
        if self._pin and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        for key in set(self._buffers) - self._used:
            del self._buffers[key]
        self._used.clear()

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
        buffer = self._buffers.get(key)
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype or not buffer.is_contiguous():
            buffer = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=self._pin and tensor.device.type == "cuda")
            self._buffers[key] = buffer
        self._used.add(key)
        buffer.copy_(tensor, non_blocking=buffer.is_pinned())
        return buffer

    def nbytes(self) -> int:
        return sum(buffer.numel() * buffer.element_size() for buffer in self._buffers.values())
