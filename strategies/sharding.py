"""How a data set is dealt to processes: pure functions, and the two samplers built on them.

Every function here is a function of ``(length or batches, batch_size, num_processes, process_index, flags)``
and touches no process group, so the whole policy is unit-testable in one process.

A *step* is one global batch: ``total_batch_size`` samples, of which each process holds its slice of
``per_process`` samples (``per_process = batch_size`` and ``total = batch_size * num_processes`` normally;
``per_process = batch_size // num_processes`` and ``total = batch_size`` with ``split_batches``). Process
``r`` takes positions ``[k * total + r * per_process, k * total + (r + 1) * per_process)`` of step ``k``,
which is the same as dealing whole batches round-robin.

The tail policy, shown on two processes with ``range(22)`` and ``batch_size=3``::

    even_batches=True  (default)   rank 0: [0,1,2] [6,7,8]  [12,13,14] [18,19,20]
                                   rank 1: [3,4,5] [9,10,11] [15,16,17] [21,0,1]    <- wraps to the start
    even_batches=False             rank 0: [0,1,2] [6,7,8]  [12,13,14] [18,19,20]
                                   rank 1: [3,4,5] [9,10,11] [15,16,17] [21]
    drop_last=True                 rank 0: [0,1,2] [6,7,8]  [12,13,14]
                                   rank 1: [3,4,5] [9,10,11] [15,16,17]
    split_batches=True, bs=4       rank 0: [0,1] [4,5] ... [20,21]
                                   rank 1: [2,3] [6,7] ... [18,19] [0,1]

With one process nothing is padded (``even_batches`` has nothing to even out). With wrap-around, the real
samples of the last step always come first when the step is read in rank order, so
``last_batch_real_count`` (4 above: 18, 19, 20, 21) is all a gather needs to drop the duplicates: with 7
samples, ``batch_size=2``, rank 0 gets ``[0,1] [4,5]``, rank 1 ``[2,3] [6,0]``; the gathers are ``[0,1,2,3]``
then ``[4,5,6,0]`` trimmed to its first 3, ``[4,5,6]``.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar, cast

import torch
from torch.utils.data import BatchSampler, IterableDataset, Sampler, SequentialSampler

T = TypeVar("T")

__all__ = [
    "BatchSamplerShard",
    "IterableDatasetShard",
    "batch_sizes",
    "check_processes",
    "flat_indices",
    "last_batch_real_count",
    "num_steps",
    "shard_batches",
    "shard_indices",
    "shard_num_batches",
    "shard_spans",
    "shard_stream",
    "split_for_process",
    "take_span",
]


def check_processes(num_processes: int, process_index: int) -> None:
    """Raise `ValueError` unless ``num_processes >= 1`` and ``0 <= process_index < num_processes``."""
    if isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1:
        raise ValueError(f"num_processes={num_processes!r} must be an int >= 1")
    if isinstance(process_index, bool) or not isinstance(process_index, int) or not 0 <= process_index < num_processes:
        raise ValueError(f"process_index={process_index!r} must be an int in [0, num_processes={num_processes})")


def batch_sizes(batch_size: int, num_processes: int, split_batches: bool) -> tuple[int, int]:
    """Return ``(per_process, total)``: the samples one process holds per step, and the step's size.

    Raises:
        ValueError: if ``batch_size`` is not a positive int, or ``split_batches`` is set and ``batch_size``
            is not a multiple of ``num_processes``.
    """
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} must be an int >= 1")
    if not split_batches:
        return batch_size, batch_size * num_processes
    if batch_size % num_processes:
        raise ValueError(
            f"split_batches=True splits each batch of batch_size={batch_size} across num_processes={num_processes}, "
            f"so batch_size must be a multiple of {num_processes}; use batch_size="
            f"{(batch_size // num_processes + 1) * num_processes} or split_batches=False"
        )
    return batch_size // num_processes, batch_size


def num_steps(length: int, total_batch_size: int, drop_last: bool) -> int:
    """Global steps in one pass over ``length`` samples (the incomplete last step counts unless dropped)."""
    return length // total_batch_size if drop_last else -(-length // total_batch_size)


def shard_num_batches(
    length: int,
    batch_size: int,
    num_processes: int,
    process_index: int,
    *,
    split_batches: bool = False,
    even_batches: bool = True,
    drop_last: bool = False,
) -> int:
    """Batches process ``process_index`` gets in one pass.

    Example: ``shard_num_batches(22, 3, 2, 1)`` is 4; with ``drop_last=True`` it is 3.
    """
    check_processes(num_processes, process_index)
    per, total = batch_sizes(batch_size, num_processes, split_batches)
    steps = num_steps(length, total, drop_last)
    if drop_last or (even_batches and num_processes > 1) or steps == 0:
        return steps
    return steps - 1 + int((steps - 1) * total + process_index * per < length)


def shard_spans(
    length: int,
    batch_size: int,
    num_processes: int,
    process_index: int,
    *,
    split_batches: bool = False,
    even_batches: bool = True,
    drop_last: bool = False,
    start: int = 0,
) -> Iterator[tuple[int, int]]:
    """An iterator over the ``(begin, end)`` positions of each batch of one process, from its batch number
    ``start`` on.

    Positions at or past ``length`` wrap to the start of the pass (see `take_span`). Seeking to ``start``
    costs nothing, whatever ``start`` is.

    Example (two processes, ``length=22``, ``batch_size=3``): process 1 gets ``(3, 6), (9, 12), (15, 18), (21, 24)``.

    The positions are arithmetic progressions, so the iterator is built of ``range`` and ``zip``: drawing a span
    runs no Python code (it is drawn once per batch by the prepared loader).
    """
    n_batches = shard_num_batches(
        length, batch_size, num_processes, process_index,
        split_batches=split_batches, even_batches=even_batches, drop_last=drop_last,
    )
    per, total = batch_sizes(batch_size, num_processes, split_batches)
    offset = process_index * per
    begins = range(max(start, 0) * total + offset, n_batches * total + offset, total)
    if not begins:
        return iter(())
    last = begins[-1]
    clip = not ((even_batches and num_processes > 1) or drop_last)
    last_end = length if clip and last + per > length else last + per  # only the last batch can be short
    return itertools.chain(zip(begins[:-1], range(begins[0] + per, last + per, total)), ((last, last_end),))


def take_span(indices: Sequence[T], begin: int, end: int, total_batch_size: int) -> list[T]:
    """The items at positions ``[begin, end)`` of ``indices``; positions past the end wrap to the start.

    The wrap-around reads the first ``min(len(indices), total_batch_size)`` items cyclically, which is what
    completes the last step with samples from the first one.
    """
    length = len(indices)
    if end <= length:
        return list(indices[begin:end])
    head = list(indices[begin:length]) if begin < length else []
    base = min(length, total_batch_size)
    return head + [indices[q % base] for q in range(max(begin, length) - length, end - length)]


def shard_indices(
    indices: int | Sequence[int],
    batch_size: int,
    num_processes: int,
    process_index: int,
    *,
    split_batches: bool = False,
    even_batches: bool = True,
    drop_last: bool = False,
    start: int = 0,
) -> list[list[int]]:
    """The batches of one process over ``indices`` (or ``range(indices)`` when an int).

    Example (two processes, ``range(7)``, ``batch_size=2``): process 0 gets ``[[0, 1], [4, 5]]`` and process 1
    gets ``[[2, 3], [6, 0]]``; ``last_batch_real_count(7, 2, 2)`` is 3, so a gather of the last step
    ``[4, 5, 6, 0]`` keeps ``[4, 5, 6]``.
    """
    seq = range(indices) if isinstance(indices, int) else indices
    _, total = batch_sizes(batch_size, num_processes, split_batches)
    spans = shard_spans(
        len(seq), batch_size, num_processes, process_index,
        split_batches=split_batches, even_batches=even_batches, drop_last=drop_last, start=start,
    )
    return [take_span(seq, begin, end, total) for begin, end in spans]


def last_batch_real_count(
    length: int, batch_size: int, num_processes: int, *, split_batches: bool = False, drop_last: bool = False
) -> int:
    """Real (not wrapped-around) samples in the last step of a pass, read in rank order.

    A gather of the last step keeps its first this-many samples. Example: 22 samples, ``batch_size=3``, two
    processes: the last step is ``[18, 19, 20] + [21, 0, 1]`` and the count is 4. It is the full step
    (``total_batch_size``) when nothing wraps, and 0 for an empty pass.
    """
    _, total = batch_sizes(batch_size, num_processes, split_batches)
    if drop_last or length % total == 0:
        return total if length >= total else 0
    return length % total


def shard_batches(
    batches: Iterable[Sequence[int]],
    *,
    num_processes: int,
    process_index: int,
    batch_size: int | None = None,
    split_batches: bool = False,
    even_batches: bool = True,
    drop_last: bool = False,
    on_end: Callable[[int], None] | None = None,
) -> Iterator[list[int]]:
    """Shard any stream of batches (custom or variable-size batch samplers) for one process.

    Whole batches are dealt round-robin. With ``even_batches`` the last incomplete round is completed:
    sample by sample from the first round when ``batch_size`` is known (same result as `shard_indices`),
    with whole batches from the start of the pass when it is not (variable-size batches). ``drop_last``
    drops an incomplete last round. ``split_batches`` slices every batch (needs ``batch_size``).
    ``on_end`` receives the real sample count of the last step once the stream is exhausted.
    """
    check_processes(num_processes, process_index)
    even_batches = even_batches and num_processes > 1
    if split_batches:
        if batch_size is None:
            raise ValueError(
                "split_batches=True needs a batch sampler with a fixed `batch_size` attribute; this one has none. "
                "Use split_batches=False for variable-size batch samplers"
            )
        return _split_stream(batches, batch_size, num_processes, process_index, even_batches, drop_last, on_end)
    return _round_robin(batches, batch_size, num_processes, process_index, even_batches, drop_last, on_end)


def _split_stream(
    batches: Iterable[Sequence[int]], batch_size: int, num_processes: int, rank: int,
    even: bool, drop_last: bool, on_end: Callable[[int], None] | None,
) -> Iterator[list[int]]:
    per, _ = batch_sizes(batch_size, num_processes, True)
    first: list[int] = []
    real = 0
    for batch in batches:
        batch = list(batch)
        first = first or batch
        if len(batch) < batch_size and drop_last:
            continue
        real = len(batch)
        if len(batch) < batch_size and even:
            batch = _complete(batch, first, 0, batch_size)
        mine = batch[rank * per:(rank + 1) * per]
        if mine:
            yield mine
    if on_end is not None:
        on_end(real)


def _round_robin(
    batches: Iterable[Sequence[int]], batch_size: int | None, num_processes: int, rank: int,
    even: bool, drop_last: bool, on_end: Callable[[int], None] | None,
) -> Iterator[list[int]]:
    first_round: list[list[int]] = []
    current: list[list[int]] = []
    real = 0
    for batch in batches:
        batch = list(batch)
        if len(first_round) < num_processes:
            first_round.append(batch)
        if len(current) == num_processes:  # a round held back by its short last batch, yet more batches follow
            real = sum(map(len, current))
            yield current[rank]
            current = []
        current.append(batch)
        if len(current) == num_processes and (batch_size is None or len(batch) == batch_size):
            real = sum(map(len, current))
            yield current[rank]
            current = []
    if current and not drop_last:
        real = sum(map(len, current))
        if not even:
            if rank < len(current):
                yield current[rank]
        elif batch_size is None:  # variable-size batches: lend whole batches from the start of the pass
            yield current[rank] if rank < len(current) else first_round[(rank - len(current)) % len(first_round)]
        else:
            flat = [i for b in current for i in b]
            base = [i for b in first_round for i in b]
            yield _complete(flat, base, rank * batch_size, (rank + 1) * batch_size)
    if on_end is not None:
        on_end(real)


def _complete(flat: list[T], base: list[T], begin: int, end: int) -> list[T]:
    """Positions ``[begin, end)`` of ``flat`` followed by ``base`` repeated."""
    return [flat[p] if p < len(flat) else base[(p - len(flat)) % len(base)] for p in range(begin, end)]


def shard_stream(
    items: Iterable[T],
    batch_size: int,
    num_processes: int,
    process_index: int,
    *,
    split_batches: bool = False,
    even_batches: bool = True,
    drop_last: bool = False,
    start_step: int = 0,
    dispatch: bool = False,
) -> Iterator[T]:
    """The items of an iterable data set that one process keeps: its slice of every step.

    Example (two processes, items ``0..7``, ``batch_size=2``): process 0 keeps ``0, 1, 4, 5`` and process 1 keeps
    ``2, 3, 6, 7``; with ``split_batches=True`` and ``batch_size=4`` the same. An incomplete last step is
    completed from the first items (``even_batches``), left short (``even_batches=False``) or dropped
    (``drop_last``). Steps before ``start_step`` are read but nothing of them is kept.

    ``dispatch`` completes an incomplete last step the way Accelerate's ``DataLoaderDispatcher`` does (its
    default for iterable data sets): the step's ``t`` items, followed by the first ``num_processes`` items of
    the first step when ``t`` does not divide, are split into equal parts, one per process. Two processes,
    items ``0..6``, ``batch_size=3``: process 0 keeps ``0, 1, 2, 6`` and process 1 keeps ``3, 4, 5, 0``
    (last batches of one item each, where the default completion gives ``[6, 0, 1]`` and ``[2, 3, 4]``).
    """
    check_processes(num_processes, process_index)
    per, total = batch_sizes(batch_size, num_processes, split_batches)
    lo, hi = process_index * per, (process_index + 1) * per
    first: list[T] = []
    step: list[T] = []
    k = 0
    for item in items:
        step.append(item)
        if len(step) == total:
            if k >= start_step:
                yield from step[lo:hi]
            first = first or step
            step = []
            k += 1
    if step and not drop_last and k >= start_step:
        if even_batches and num_processes > 1 and dispatch:
            share = -(-len(step) // num_processes)
            if len(step) % num_processes:
                step = step + (first or step)[:num_processes]
            lo, hi = process_index * share, (process_index + 1) * share
        elif even_batches and num_processes > 1:
            step = _complete(step, first or step, 0, total)
        yield from step[lo:hi]


def flat_indices(sampler: Any) -> Sequence[int]:
    """One pass of a sized sampler as a sequence: a `range` for a `SequentialSampler`, else a list."""
    if type(sampler) is SequentialSampler:
        return range(len(sampler))
    if hasattr(sampler, "indices_tensor"):
        indices: list[int] = sampler.indices_tensor().tolist()
        return indices
    return list(sampler)


def split_for_process(inputs: Any, num_processes: int, process_index: int, *, apply_padding: bool = False) -> Any:
    """Process `process_index`'s contiguous share of `inputs` (a list, tuple, tensor, or dict of them of one length).

    The first ``len % num_processes`` processes get one item more; with more processes than items the last
    ones get an empty share (each item once). ``apply_padding`` repeats the last item of `inputs` until every
    share is as long as the first. With one process, `inputs` itself. ``split_between_processes`` of both faces.
    """
    check_processes(num_processes, process_index)
    if num_processes == 1:
        return inputs
    if isinstance(inputs, dict):
        lengths = {key: _split_length(value, f"inputs[{key!r}]") for key, value in inputs.items()}
        if len(set(lengths.values())) > 1:
            raise ValueError(f"split_between_processes needs every value of the dict to have one length, got lengths {lengths}")
        return {key: split_for_process(value, num_processes, process_index, apply_padding=apply_padding)
                for key, value in inputs.items()}
    length = _split_length(inputs, "inputs")
    per, extra = divmod(length, num_processes)
    begin = process_index * per + min(process_index, extra)
    end = begin + per + (1 if process_index < extra else 0)
    missing = per + (1 if extra else 0) - (end - begin) if apply_padding and length else 0
    if not isinstance(inputs, (list, tuple, torch.Tensor)):  # a `datasets.Dataset`
        return inputs.select([*range(begin, end), *[length - 1] * missing])
    share: Any = inputs[begin:end]
    if missing == 0:
        return share
    if isinstance(inputs, torch.Tensor):
        return torch.cat([share, inputs[-1:].expand(missing, *inputs.shape[1:])])
    return share + type(share)([inputs[-1]] * missing)


def _split_length(value: Any, name: str) -> int:
    if isinstance(value, torch.Tensor):
        if value.dim() == 0:
            raise ValueError(f"{name} is a 0-d tensor ({value!r}); split_between_processes splits along dim 0")
        return len(value)
    if not isinstance(value, (list, tuple)) and not (hasattr(value, "select") and hasattr(value, "__len__")):
        raise TypeError(
            f"{name} is a {type(value).__name__}; split_between_processes splits a list, tuple, tensor, or a dict of them "
            "(convert it first, e.g. list(...))"
        )
    return len(value)


class BatchSamplerShard(Sampler[list[int]]):
    """The batches of one process out of any batch sampler (see the module docstring for the policy).

    A `torch.utils.data.BatchSampler` over a sized sampler is sharded by arithmetic on the pass's indices
    (`shard_spans`), so starting at batch ``first_batch`` costs nothing; any other batch sampler (custom,
    variable-size) is sharded as a stream (`shard_batches`) and skipped by drawing its index lists only.

    Args:
        batch_sampler: yields lists of dataset indices.
        num_processes: how many processes share the data.
        process_index: this process's rank.
        split_batches: split every batch across processes instead of dealing whole batches.
        even_batches: complete the last step so every process gets the same number of batches.
    """

    def __init__(
        self,
        batch_sampler: Iterable[list[int]],
        num_processes: int = 1,
        process_index: int = 0,
        split_batches: bool = False,
        even_batches: bool = True,
    ) -> None:
        check_processes(num_processes, process_index)
        self.batch_sampler: Any = batch_sampler
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.even_batches = even_batches
        self.batch_size: int | None = getattr(batch_sampler, "batch_size", None)
        self.drop_last: bool = bool(getattr(batch_sampler, "drop_last", False))
        self.arithmetic = type(batch_sampler) is BatchSampler and hasattr(batch_sampler.sampler, "__len__")
        self.per_process_batch_size: int | None = None  # samples per batch on this process (None: variable)
        self.total_batch_size: int | None = None  # samples per step over all processes (None: variable)
        if self.batch_size is not None:
            self.per_process_batch_size, self.total_batch_size = batch_sizes(self.batch_size, num_processes, split_batches)
        elif split_batches:
            raise ValueError(
                f"split_batches=True needs a batch sampler with a fixed `batch_size`; {type(batch_sampler).__name__} "
                "has none. Use split_batches=False for variable-size batch samplers"
            )
        self.first_batch = 0  # where every pass starts until set back to 0 (no data of skipped batches is read)
        # this pass's order, drawn before (a resumed pass): the indices (arithmetic) or the batches, until set back to None
        self.order: Sequence[Any] | None = None
        self._stream_real = -1

    @property
    def _fixed_batch_size(self) -> int:
        return cast(int, self.batch_size)  # set whenever `arithmetic` is

    @property
    def real_last_step(self) -> int:
        """Real samples in the last step (`last_batch_real_count`); -1 while unknown."""
        if self.arithmetic:
            return last_batch_real_count(
                len(self.batch_sampler.sampler), self._fixed_batch_size, self.num_processes,
                split_batches=self.split_batches, drop_last=self.drop_last,
            )
        return self._stream_real

    def spans(self, length: int, start: int = 0) -> Iterator[tuple[int, int]]:
        """`shard_spans` for a pass of ``length`` indices (arithmetic mode)."""
        return shard_spans(
            length, self._fixed_batch_size, self.num_processes, self.process_index,
            split_batches=self.split_batches, even_batches=self.even_batches, drop_last=self.drop_last, start=start,
        )

    def __iter__(self) -> Iterator[list[int]]:
        # `first_batch` and `order` are read now; the sampler draws at the first batch, as a plain DataLoader's does
        # (after the loader drew its base seed)
        return self._pass(self.first_batch, self.order)

    def _pass(self, start: int, order: Sequence[Any] | None) -> Iterator[list[int]]:
        if self.arithmetic:
            seq = flat_indices(self.batch_sampler.sampler) if order is None else order
            total = cast(int, self.total_batch_size)
            yield from (take_span(seq, begin, end, total) for begin, end in self.spans(len(seq), start))
            return
        stream = shard_batches(
            self.batch_sampler if order is None else order, num_processes=self.num_processes, process_index=self.process_index,
            batch_size=self.batch_size, split_batches=self.split_batches, even_batches=self.even_batches,
            drop_last=self.drop_last, on_end=self._set_stream_real,
        )
        yield from itertools.islice(stream, start, None)

    def _set_stream_real(self, real: int) -> None:
        self._stream_real = real

    def __len__(self) -> int:
        if self.arithmetic:
            return shard_num_batches(
                len(self.batch_sampler.sampler), self._fixed_batch_size, self.num_processes, self.process_index,
                split_batches=self.split_batches, even_batches=self.even_batches, drop_last=self.drop_last,
            )
        n = len(self.batch_sampler)
        if self.split_batches:  # with even_batches=False, a last batch too short to reach this process still counts
            return n
        if self.drop_last:
            return n // self.num_processes
        if self.even_batches and self.num_processes > 1:
            return (n + self.num_processes - 1) // self.num_processes
        return n // self.num_processes + int(self.process_index < n % self.num_processes)


class IterableDatasetShard(IterableDataset):
    """The items of an iterable data set that one process keeps (`shard_stream`).

    Args:
        dataset: the iterable data set.
        batch_size: the loader's batch size (per process, or global with ``split_batches``).
        drop_last: drop an incomplete last step.
        num_processes: how many processes share the data.
        process_index: this process's rank.
        split_batches: ``batch_size`` is the global batch, split across processes.
        even_batches: complete an incomplete last step with the first items.
        dispatch: complete it as Accelerate's ``DataLoaderDispatcher`` does (see `shard_stream`).
        seed_generator: like Accelerate's ``IterableDatasetShard``, reseed the data set's ``generator`` with the
            epoch at every pass when the data set has no ``set_epoch``.
    """

    def __init__(
        self,
        dataset: Iterable[Any],
        batch_size: int = 1,
        drop_last: bool = False,
        num_processes: int = 1,
        process_index: int = 0,
        split_batches: bool = False,
        even_batches: bool = True,
        *,
        dispatch: bool = False,
        seed_generator: bool = False,
    ) -> None:
        check_processes(num_processes, process_index)
        self.per_process_batch_size, self.total_batch_size = batch_sizes(batch_size, num_processes, split_batches)
        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.num_processes = num_processes
        self.process_index = process_index
        self.split_batches = split_batches
        self.even_batches = even_batches
        self.dispatch = dispatch
        self.seed_generator = seed_generator
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Record the epoch and pass it on to the data set when it has ``set_epoch``."""
        self.epoch = epoch
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        generator = getattr(self.dataset, "generator", None)
        if self.seed_generator and isinstance(generator, torch.Generator) and not hasattr(self.dataset, "set_epoch"):
            generator.manual_seed(self.epoch)
        return shard_stream(
            self.dataset, self.batch_size, self.num_processes, self.process_index,
            split_batches=self.split_batches, even_batches=self.even_batches, drop_last=self.drop_last, dispatch=self.dispatch,
        )

    def __len__(self) -> int:
        length = len(self.dataset)  # type: ignore[arg-type]
        per, total = self.per_process_batch_size, self.total_batch_size
        steps = num_steps(length, total, self.drop_last)
        if steps and self.dispatch and not self.drop_last and self.even_batches and self.num_processes > 1:
            tail = length - (steps - 1) * total  # its items, plus the first ones when they do not divide, split evenly
            return (steps - 1) * per + -(-tail // self.num_processes)
        if steps == 0 or self.drop_last or (self.even_batches and self.num_processes > 1):
            return steps * per
        tail = length - (steps - 1) * total - self.process_index * per
        return (steps - 1) * per + min(max(tail, 0), per)
