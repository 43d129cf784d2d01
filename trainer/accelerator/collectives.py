"""The Accelerator's collectives (Accelerate's ``gather``, ``reduce``, ``gather_for_metrics``, ...): checks of what
they are given, then the strategy's collective."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from strategies.collectives import apply_to_tensors
from trainer.accelerator.layout import ProcessLayout, debug_mode
from trainer.accelerator.registry import Prepared


class Collectives(ProcessLayout):
    """The collectives part of the `Accelerator`."""

    __slots__ = ()
    prepared: Prepared

    def gather(self, tensor: Any) -> Any:
        """Gather tensors (nested structures too) from every process, concatenated along dim 0."""
        _check_tensors(tensor, "gather", "gather_object")
        if debug_mode():
            _verify("Accelerator.gather", tensor)
        return self.strategy.all_gather(tensor)

    def gather_object(self, obj: Any) -> list[Any]:
        return self.strategy.all_gather_object(obj)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """Gather, then drop the wrap-around duplicates of the last batch so each sample counts once."""
        all_tensors = _only_tensors(input_data)
        data = self.gather(input_data) if all_tensors and not use_gather_object else self.gather_object(input_data)
        loader = self._active_dataloader()
        remainder = getattr(loader, "remainder", -1) if loader is not None else -1
        if remainder is None or remainder < 0:
            return data
        if all_tensors and not use_gather_object:
            return apply_to_tensors(lambda t: t[:remainder], data)
        return data[:remainder]

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        _check_tensors(tensor, "reduce", "gather_object")
        if debug_mode():
            _verify("Accelerator.reduce", tensor)
        return self.strategy.all_reduce(tensor, reduction, scale)

    def pad_across_processes(self, tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False) -> Any:
        _check_tensors(tensor, "pad_across_processes", "gather_object")
        if debug_mode():  # only the number of dimensions must agree
            _verify("Accelerator.pad_across_processes", tensor, ndim_only=True)
        return self.strategy.pad_across_processes(tensor, dim, pad_index, pad_first)

    def broadcast(self, tensor: Any, from_process: int = 0) -> Any:
        _check_tensors(tensor, "broadcast", "broadcast_object")
        if debug_mode():
            _verify("Accelerator.broadcast", tensor)
        return self.strategy.broadcast(tensor, from_process)

    def broadcast_object(self, obj: Any, from_process: int = 0) -> Any:
        return self.strategy.broadcast_object(obj, from_process)

    def _active_dataloader(self) -> Any:
        for loader in reversed(self.prepared.dataloaders):
            if getattr(loader, "end_of_dataloader", False):
                return loader
        return None


def _check_tensors(data: Any, name: str, instead: str) -> None:
    """Accelerate's collectives take tensors only (nested in lists, tuples, dicts); anything else is a `TypeError`."""
    if isinstance(data, torch.Tensor):
        return
    if isinstance(data, (list, tuple)):
        items: Any = enumerate(data)
    elif isinstance(data, Mapping):  # dicts, and mappings such as transformers' BatchEncoding
        items = data.items()
    elif dataclasses.is_dataclass(data) and not isinstance(data, type):
        items = ((f.name, getattr(data, f.name)) for f in dataclasses.fields(data) if f.init)
    else:
        raise TypeError(f"{name}() takes tensors (or lists, tuples and dicts of them), got {type(data).__name__} {data!r:.60}; "
                        f"use {instead}() for other objects")
    for _, value in items:
        _check_tensors(value, name, instead)


def _verify(operation: str, data: Any, ndim_only: bool = False) -> None:
    """Debug mode's check that every process passes the same shapes (`trainer.accelerator.operations.verify_operation`)."""
    from trainer.accelerator.operations import recursively_apply, verify_operation  # lazy: it loads strategies.data

    verify_operation(operation, data, recursively_apply(lambda t: [t.ndim], data) if ndim_only else None)


def _only_tensors(data: Any) -> bool:
    if isinstance(data, torch.Tensor):
        return True
    if isinstance(data, (list, tuple)):
        return len(data) > 0 and all(_only_tensors(x) for x in data)
    if isinstance(data, Mapping):
        return len(data) > 0 and all(_only_tensors(v) for v in data.values())
    return False
