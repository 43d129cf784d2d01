"""`CombinedLoader`: several iterables (loaders) as one, in Lightning's four modes (its
``lightning.pytorch.utilities.combined_loader.CombinedLoader``, same behaviour).

    CombinedLoader({"a": loader_a, "b": loader_b}, mode)    # any nesting of dicts, lists and tuples

    mode              each item                                         ends
    min_size          {"a": batch_a, "b": batch_b}                      with the shortest
    max_size_cycle    the same; shorter ones start over                 with the longest
    max_size          the same; an exhausted one gives None             with the longest
    sequential        one loader's batch, then the next loader's        after the last

Iterating yields ``(batch, batch_idx, dataloader_idx)``; `dataloader_idx` is 0 except in ``sequential``, where
`batch_idx` restarts at 0 with each loader. ``len()`` works before ``iter()`` too (Lightning's raises there).

As the training loaders of `Trainer.fit` (``train_dataloader()`` returning a list or dict of loaders is a
``CombinedLoader`` in ``max_size_cycle`` mode, Lightning's default) ``training_step`` gets the combined batch, each
loader is sharded as a single one would be, and ``sequential`` is refused, as in Lightning. As evaluation loaders only
``sequential`` is accepted (a dict of loaders is one in that mode): the loaders run one after another with
``dataloader_idx``.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Literal

from torch.utils import _pytree
from torch.utils.data import DataLoader

Mode = Literal["min_size", "max_size_cycle", "max_size", "sequential"]
MODES: tuple[str, ...] = ("min_size", "max_size_cycle", "max_size", "sequential")
_LENGTH: dict[str, Callable[[list[float]], float]] = {"min_size": min, "max_size_cycle": max, "max_size": max, "sequential": sum}


def _length(iterable: Any) -> float:
    try:
        return len(iterable)
    except (TypeError, NotImplementedError):
        return math.inf


class CombinedLoader(Iterable[tuple[Any, int, int]]):
    """Combine `iterables` (one, or a nesting of dicts, lists and tuples of them) in `mode`; see the module docstring.

    Raises:
        ValueError: an unknown `mode`.
    """

    def __init__(self, iterables: Any, mode: Mode = "min_size") -> None:
        if mode not in MODES:
            raise ValueError(f"Unsupported mode {mode!r}, please select one of: {list(MODES)}.")
        self._iterables = iterables
        self._flattened, self._spec = _pytree.tree_flatten(iterables)
        self._mode = mode
        self._limits: list[int | float] | None = None
        self._iterators: list[Iterator[Any]] | None = None
        self._exhausted: list[bool] = []
        self._batch_idx = 0
        self._loader_idx = 0

    @property
    def mode(self) -> str:
        return self._mode

    @property
    def iterables(self) -> Any:
        """The iterables as given."""
        return self._iterables

    @property
    def flattened(self) -> list[Any]:
        """The iterables as a flat list."""
        return self._flattened

    @flattened.setter
    def flattened(self, flattened: list[Any]) -> None:
        if len(flattened) != len(self._flattened):
            raise ValueError(f"Mismatch in flattened length ({len(flattened)}) and existing length ({len(self._flattened)})")
        self._iterables = _pytree.tree_unflatten(flattened, self._spec)
        self._flattened = list(flattened)

    @property
    def sampler(self) -> Any:
        return _pytree.tree_unflatten([getattr(x, "sampler", None) for x in self._flattened], self._spec)

    @property
    def batch_sampler(self) -> Any:
        return _pytree.tree_unflatten([getattr(x, "batch_sampler", None) for x in self._flattened], self._spec)

    @property
    def limits(self) -> list[int | float] | None:
        """At most this many batches of each iterable (None: all)."""
        return self._limits

    @limits.setter
    def limits(self, limits: int | float | list[int | float] | None) -> None:
        if isinstance(limits, (int, float)):
            limits = [limits] * len(self._flattened)
        elif isinstance(limits, list) and len(limits) != len(self._flattened):
            raise ValueError(f"Mismatch in number of limits ({len(limits)}) and number of iterables ({len(self._flattened)})")
        self._limits = limits

    def __iter__(self) -> CombinedLoader:
        self._batch_idx, self._loader_idx = 0, 0
        if self._mode == "sequential":
            self._iterators = [iter(self._flattened[0])] if self._flattened else []
        else:
            self._iterators = [iter(iterable) for iterable in self._flattened]
        self._exhausted = [False] * len(self._flattened)
        return self

    def __next__(self) -> tuple[Any, int, int]:
        if self._iterators is None:
            raise RuntimeError("call iter(combined_loader) first")
        if self._mode == "sequential":
            return self._next_sequential()
        if not self._iterators:
            raise StopIteration
        out = [self._next_of(i) for i in range(len(self._iterators))]
        if self._mode == "max_size" and all(self._exhausted):
            raise StopIteration
        index = self._batch_idx
        self._batch_idx += 1
        return _pytree.tree_unflatten(out, self._spec), index, 0

    def _next_of(self, i: int) -> Any:
        iterators = self._iterators
        assert iterators is not None
        if self._mode == "min_size":
            return next(iterators[i])
        try:
            return next(iterators[i])
        except StopIteration:
            self._exhausted[i] = True
            if self._mode == "max_size":
                return None
            if all(self._exhausted):  # max_size_cycle: the longest is done
                raise
            iterators[i] = iter(self._flattened[i])
            return next(iterators[i])

    def _next_sequential(self) -> tuple[Any, int, int]:
        iterators, n = self._iterators, len(self._flattened)
        assert iterators is not None
        while self._loader_idx < n:
            limit = self._limits[self._loader_idx] if self._limits is not None else math.inf
            if self._batch_idx < limit:
                with contextlib.suppress(StopIteration):
                    batch = next(iterators[0])
                    index = self._batch_idx
                    self._batch_idx += 1
                    return batch, index, self._loader_idx
            self._loader_idx += 1
            self._batch_idx = 0
            iterators[:] = [iter(self._flattened[self._loader_idx])] if self._loader_idx < n else []
        raise StopIteration

    def __len__(self) -> int:
        """The number of items, by the mode."""
        lengths = [_length(iterable) for iterable in self._flattened]
        if self._limits is not None:
            lengths = [min(length, limit) for length, limit in zip(lengths, self._limits)]
        if self._mode == "min_size" and self._limits is not None:
            lengths = lengths + list(self._limits)
        return int(_LENGTH[self._mode](lengths))

    def set_epoch(self, epoch: int) -> None:
        """Pass the epoch on to the loaders that take it (the Trainer's prepared loaders reshuffle by it)."""
        for iterable in self._flattened:
            if hasattr(iterable, "set_epoch"):
                iterable.set_epoch(epoch)

    def reset(self) -> None:
        """Forget the running iteration."""
        self._iterators = None
        self._exhausted = []


Loaders = DataLoader | CombinedLoader | list[DataLoader] | tuple[DataLoader, ...] | Mapping[str, DataLoader]
"""What the Trainer's entry points take as loaders and a ``*_dataloader()`` method returns (Lightning's
``TRAIN_DATALOADERS``/``EVAL_DATALOADERS``): one loader, a `CombinedLoader`, or a list, tuple or dict of loaders."""
