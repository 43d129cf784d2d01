"""Sharded, seedable, resumable data loaders.

`prepare_data_loader` rebuilds a `torch.utils.data.DataLoader` around a sharded batch sampler (the policy and
its two-process example are in `strategies.sharding`) and returns a `DataLoaderShard`: a `DataLoader` that
moves batches to the device, knows where it is in the epoch (``state_dict``/``load_state_dict`` resume
mid-epoch without loading the skipped data), and tells ``gather_for_metrics`` how many samples of the last
step are real (``remainder``) while the last batch is in use (``end_of_dataloader``).

Order: Accelerate's, for the same settings (docs/data.md). By default the sampler keeps drawing from its generator,
or from torch's global RNG, at every pass, exactly as a plain DataLoader (with several processes its generator
is synchronized when each pass starts); with a seed, a `RandomSampler` is replaced by a `SeedableRandomSampler`
drawing its permutation from ``seed + epoch``. Either way every process holds the same permutation and takes its
share of it, and ``state_dict`` keeps what a pass resumed mid-epoch needs to draw its order again.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    IterableDataset,
    TensorDataset,
)
from torch.utils.data._utils.collate import default_collate

from strategies.collectives import broadcast_object
from strategies.order import (
    SeedableRandomSampler,
    adopt_order_generator,
    boundary_record,
    decode,
    encode,
    flat_index_tensor,
    order_generator,
    ordered,
    pass_record,
    redraw,
    undraw_unreached,
)
from strategies.sharding import (
    BatchSamplerShard,
    IterableDatasetShard,
    check_processes,
    flat_indices,
    last_batch_real_count,
    take_span,
)

__all__ = [
    "BatchSamplerShard",
    "DataLoaderShard",
    "IterableDatasetShard",
    "SeedableRandomSampler",
    "find_batch_size",
    "prepare_data_loader",
    "send_to_device",
    "skip_first_batches",
]

# Attributes a DataLoader keeps that `prepare_data_loader` carries over unchanged.
_CARRIED = (
    "num_workers", "collate_fn", "pin_memory", "timeout", "worker_init_fn", "multiprocessing_context",
    "generator", "prefetch_factor", "persistent_workers", "pin_memory_device", "in_order",
)


def send_to_device(obj: Any, device: torch.device | str | int | None, non_blocking: bool = False) -> Any:
    """Move every tensor in ``obj`` (nested tuples, lists, dicts, namedtuples, dataclasses) to ``device``.

    Other objects are returned untouched; containers are rebuilt with their own type.
    """
    if device is None:
        return obj
    return _send(obj, torch.device(device), non_blocking)


def _send(obj: Any, device: torch.device, non_blocking: bool) -> Any:
    if isinstance(obj, torch.Tensor):
        return obj if obj.device == device else obj.to(device, non_blocking=non_blocking)
    if isinstance(obj, (list, tuple)):
        moved = [_send(o, device, non_blocking) for o in obj]
        if type(obj) is list:
            return moved
        if hasattr(obj, "_fields"):
            return type(obj)(*moved)
        try:
            return type(obj)(moved)
        except TypeError:
            return tuple(moved) if isinstance(obj, tuple) else moved
    if isinstance(obj, Mapping):
        moved_map = {k: _send(v, device, non_blocking) for k, v in obj.items()}
        mapping_type: Any = type(obj)
        try:
            return mapping_type(moved_map)
        except TypeError:
            return moved_map
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        new = copy.copy(obj)
        for field in dataclasses.fields(obj):
            object.__setattr__(new, field.name, _send(getattr(obj, field.name), device, non_blocking))
        return new
    return obj


def _first_tensor(obj: Any) -> torch.Tensor | None:
    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, Mapping):
        children: Any = obj.values()
    elif isinstance(obj, (list, tuple)):
        children = obj
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        children = (getattr(obj, f.name) for f in dataclasses.fields(obj))
    else:
        return None
    for child in children:
        found = _first_tensor(child)
        if found is not None:
            return found
    return None


def find_batch_size(batch: Any) -> int:
    """The leading dimension of the first tensor found in ``batch`` (depth first).

    Raises:
        TypeError: if ``batch`` holds no tensor with at least one dimension.
    """
    tensor = _first_tensor(batch)
    if tensor is None or tensor.dim() == 0:
        raise TypeError(
            f"find_batch_size needs a tensor with a batch dimension somewhere in the batch; got {type(batch).__name__} "
            f"holding {'a 0-d tensor' if tensor is not None else 'no tensor'}. Pass the batch size explicitly instead"
        )
    return int(tensor.shape[0])


@dataclasses.dataclass
class _Progress:
    """Where a loader is: shared by a loader and the views `skip_first_batches` makes of it."""

    epoch: int = 0
    position: int = 0  # batches handed out in this epoch, skipped ones included
    resume_skip: int = 0  # batches the next pass skips (set by load_state_dict)
    complete: bool = False  # the last batch of the epoch has been handed out
    end: bool = False  # the batch in use is the last of the pass
    started: int = 0  # while a pass is in progress: when it began (passes of all loaders counted in order); else 0
    running: Any = None  # while a pass is in progress: the loader iterating it (a skip_first_batches view shares this)
    # The RNG states the order of the pass in progress was drawn from (taken as it started), and a pass to resume:
    # (epoch, those states) loaded by load_state_dict, redrawn without touching the live RNGs.
    record: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)
    resume: tuple[int, dict[str, torch.Tensor]] | None = None

    def advance(self) -> None:
        if self.complete:
            self.epoch, self.position, self.resume_skip, self.complete = self.epoch + 1, 0, 0, False


def _take_tensor(perm: torch.Tensor, begin: int, end: int, total: int) -> torch.Tensor:
    """`take_span` for an index tensor."""
    length = perm.shape[0]
    if end <= length:
        return perm[begin:end]
    base = min(length, total)
    wrapped = perm[torch.arange(max(begin, length) - length, end - length) % base]
    return torch.cat((perm[begin:length], wrapped)) if begin < length else wrapped


def _batch_fetcher(loader: DataLoader) -> tuple[Callable[[Any], Any], bool] | None:
    """A function fetching a whole batch in the main process, and whether it takes an index tensor.

    Used only where it returns what the default path returns, bit for bit: no workers, no pinning, a
    map-style data set; one indexed read per tensor for a `TensorDataset` with the default collate.
    """
    dataset: Any = loader.dataset
    collate = loader.collate_fn
    if loader.num_workers or loader.pin_memory or not isinstance(loader.batch_sampler, BatchSamplerShard):
        return None
    if type(dataset).__module__.startswith("torch.utils.data.datapipes"):
        return None
    plain_tensors = isinstance(dataset, TensorDataset) and type(dataset).__getitem__ is TensorDataset.__getitem__
    if plain_tensors and collate is default_collate and not hasattr(dataset, "__getitems__"):
        tensors = dataset.tensors
        return (lambda idx: [t[idx] for t in tensors]), True
    if getattr(dataset, "__getitems__", None):
        return (lambda idx: collate(dataset.__getitems__(idx))), False
    return (lambda idx: collate([dataset[i] for i in idx])), False


class DataLoaderShard(DataLoader):
    """A `DataLoader` over one process's shard, placing batches on ``device`` and resumable mid-epoch.

    Built by `prepare_data_loader`; takes the `DataLoader` arguments plus the ones below.

    Args:
        device: where batches go (``None``: left where they are).
        put_on_device: ``False`` leaves batches on the CPU.
        non_blocking: passed to ``Tensor.to``.
        seed: the shuffling seed of a `SeedableRandomSampler` (recorded in ``state_dict``).
        synchronize: called with ``synchronized_generator`` when a pass starts (not when it resumes mid-epoch);
            `Accelerator` makes the processes' RNGs equal there (Accelerate's ``rng_types``).
        synchronized_generator: the generator the order is drawn from, to keep equal on every process.
    """

    def __init__(
        self,
        dataset: Any,
        *,
        device: torch.device | str | None = None,
        put_on_device: bool = True,
        non_blocking: bool = False,
        seed: int = 0,
        synchronize: Callable[[torch.Generator | None], None] | None = None,
        synchronized_generator: torch.Generator | None = None,
        **loader_kwargs: Any,
    ) -> None:
        self._loader_batch_size: int | None = None
        super().__init__(dataset, **loader_kwargs)
        shard = self.batch_sampler if self.batch_sampler is not None else self.sampler
        if isinstance(dataset, IterableDatasetShard):
            shard = dataset
        self._shard = shard if isinstance(shard, (BatchSamplerShard, IterableDatasetShard)) else None
        self.device = torch.device(device) if device is not None and put_on_device else None
        self.non_blocking = non_blocking
        self.seed = seed
        self.synchronize = synchronize
        self.synchronized_generator = synchronized_generator
        self._progress = _Progress()
        self._skip_once: int | None = None
        self._pass_skip: int | None = None
        self._fetcher = _batch_fetcher(self)
        # batches indexed out of tensors that already are on the device need no move (one indexed read is all)
        tensors = dataset.tensors if self._fetcher is not None and self._fetcher[1] else ()
        self._fetched_in_place = bool(tensors) and all(t.device == self.device for t in tensors)

    # ``DataLoader.__init__`` assigns ``batch_size``; it reads back as the per-process batch size.
    @property
    def batch_size(self) -> int | None:
        """Samples per batch on this process."""
        return getattr(self._shard, "per_process_batch_size", None) or self._loader_batch_size

    @batch_size.setter
    def batch_size(self, value: int | None) -> None:
        self._loader_batch_size = value

    @property
    def total_batch_size(self) -> int | None:
        """Samples per step over all processes."""
        return getattr(self._shard, "total_batch_size", None) or self._loader_batch_size

    @property
    def total_dataset_length(self) -> int:
        """Samples in the underlying data set."""
        base: Any = self.dataset.dataset if isinstance(self.dataset, IterableDatasetShard) else self.dataset
        return len(base)

    @property
    def end_of_dataloader(self) -> bool:
        """True while the last batch of the pass is in use."""
        return self._progress.end

    @property
    def shard(self) -> BatchSamplerShard | IterableDatasetShard | None:
        """What deals this process its share (its batch sampler, or its data set for an iterable one); None if neither."""
        return self._shard

    @property
    def pass_in_progress(self) -> tuple[int, Any] | None:
        """While a pass over this loader (or a `skip_first_batches` view of it) runs: ``(when it began, counted over the
        passes of every loader, the loader iterating it)``; None between passes."""
        progress = self._progress
        return (progress.started, progress.running) if progress.started else None

    @property
    def epoch(self) -> int:
        """The epoch the next (or current) pass draws; advances after each full pass."""
        return self._progress.epoch

    @property
    def remainder(self) -> int:
        """Real samples in the last step over all processes (the rest are wrap-around copies); -1 if unknown."""
        if isinstance(self._shard, BatchSamplerShard):
            return self._shard.real_last_step
        if isinstance(self._shard, IterableDatasetShard):
            try:
                length = len(self._shard.dataset)  # type: ignore[arg-type]
            except TypeError:
                return -1
            return last_batch_real_count(
                length, self._shard.batch_size, self._shard.num_processes,
                split_batches=self._shard.split_batches, drop_last=self._shard.drop_last,
            )
        return -1

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass draw epoch ``epoch`` (a resume position loaded for another epoch is dropped)."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ValueError(f"epoch={epoch!r} must be an int >= 0")
        progress = self._progress
        if epoch != progress.epoch or progress.complete:
            self._progress.epoch, progress.position, progress.resume_skip, progress.complete = epoch, 0, 0, False
            progress.resume = None

    def state_dict(self) -> dict[str, Any]:
        """``{"epoch", "batches_yielded", "seed"}``, JSON-serializable: enough to resume at the next batch.

        Where the order is drawn from an RNG, ``"order"`` holds what the pass needs to be drawn again: mid-epoch, the
        states of the RNGs it was drawn from (the sampler's generator, or torch's global RNG) as the pass started; at
        the end of an epoch, the sampler's generator as it is (torch's global RNG is the checkpoint's to restore).

        The position in global terms comes with it, so that a run on another number of processes takes its share from
        there (`resharded_position`): ``"samples"`` (samples of the epoch's order consumed by all processes together),
        ``"total_batch_size"`` (the samples of one step over all processes) and ``"num_processes"``.
        """
        progress = self._progress
        if progress.complete:
            state: dict[str, Any] = {"epoch": progress.epoch + 1, "batches_yielded": 0, "seed": self.seed}
        else:
            state = {"epoch": progress.epoch, "batches_yielded": progress.position, "seed": self.seed}
        order = progress.record if state["batches_yielded"] else boundary_record(self._shard)
        if order:
            state["order"] = encode(order)
        total = self.total_batch_size if self._shard is not None else None
        if total is not None:
            state.update(samples=state["batches_yielded"] * total, total_batch_size=total, num_processes=self._shard.num_processes)  # type: ignore[union-attr]
        return state

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Resume where ``state_dict`` was taken: the next ``iter()`` starts at the following batch.

        A pass resumed mid-epoch redraws the order it was interrupted in from the recorded RNG states, without
        drawing from the live RNGs (the checkpoint restored them as they were after the pass's draws); the
        sampler's generator is left where the uninterrupted pass left it. A state taken on another number of
        processes resumes at the same sample of the epoch's order (`resharded_position`).

        Raises:
            ValueError: ``state_dict`` is not what `state_dict` returned, or it was taken on another number of
                processes with another global batch, or by a loader that cannot be resharded.
        """
        values = {}
        for key in ("epoch", "batches_yielded", "seed"):
            value = state_dict.get(key) if isinstance(state_dict, Mapping) else None
            if isinstance(value, bool) or not isinstance(value, int) or (key != "seed" and value < 0):
                raise ValueError(
                    f"state_dict[{key!r}]={value!r} is not valid; pass the dict returned by DataLoaderShard.state_dict() "
                    "(keys 'epoch', 'batches_yielded', 'seed', non-negative ints)"
                )
            values[key] = value
        values["batches_yielded"] = self.resharded_position(state_dict)
        adopt_order_generator(self._shard, state_dict.get("order"))  # (a run of several processes continued on one)
        record = decode(state_dict.get("order"), self._shard)
        if "global" in record and order_generator(self._shard) is not None:
            warnings.warn(
                "this loader's order was drawn from torch's global RNG by one process and is resumed on several, which draw it "
                "from a generator they share: the interrupted epoch resumes on its own samples, the epochs after it are "
                "drawn differently from an uninterrupted run. Accelerator(dataloader_config=DataLoaderConfiguration("
                "use_seedable_sampler=True)) draws the same order on any number of processes",
                stacklevel=2,
            )
        self.seed = values["seed"]
        inner = getattr(getattr(self._shard, "batch_sampler", None), "sampler", None)
        if isinstance(inner, SeedableRandomSampler):
            inner.seed = self.seed
        self._progress.epoch, self._progress.complete = values["epoch"], False
        self._progress.position = self._progress.resume_skip = values["batches_yielded"]
        if values["batches_yielded"]:
            self._progress.record, self._progress.resume = record, (values["epoch"], record)
        else:
            self._progress.record, self._progress.resume = {}, None
            if "generator" in record:
                order_generator(self._shard).set_state(record["generator"])  # type: ignore[union-attr]

    def resharded_position(self, state_dict: Mapping[str, Any]) -> int:
        """The batches of this loader that ``state_dict`` (from `state_dict`, possibly of a run on another number of
        processes) has consumed of its epoch: its samples consumed over this loader's global batch.

        Step ``k`` of an epoch is samples ``[k * G, (k + 1) * G)`` of the epoch's order whatever the number of processes
        (`strategies.sharding`), so a run resumed on N' processes sees exactly the samples the interrupted one would have
        seen, provided the global batch ``G`` stays the same: each process then takes ``G / N'`` samples a step.

        A position at the start of an epoch is the epoch's first sample for any loader: it is taken whatever the batch.

        Raises:
            ValueError: mid-epoch, the global batch differs (the message gives the per-process batch size that keeps
                it), or the loader deals a custom batch sampler's batches round-robin (their position depends on the
                process count).
        """
        batches: int = state_dict["batches_yielded"]
        saved_total, saved_processes = state_dict.get("total_batch_size"), state_dict.get("num_processes")
        shard, total = self._shard, self.total_batch_size
        if saved_total is None or saved_processes is None or shard is None or total is None:
            return batches  # (a state without the global position: written before it was recorded)
        if batches == 0 and not state_dict.get("samples"):
            return 0  # at an epoch's start: its first sample, whatever the batch (a batch size search restores it so)
        processes = shard.num_processes
        if saved_total != total:
            raise ValueError(_global_batch_message(int(saved_total), int(saved_processes), total, processes, shard.split_batches))
        if saved_processes != processes and isinstance(shard, BatchSamplerShard) and not shard.arithmetic:
            raise ValueError(
                f"this loader's batch sampler ({type(shard.batch_sampler).__name__}) is dealt to the processes whole batch by "
                f"whole batch, so a position taken on {saved_processes} processes cannot be taken on {processes}: resume on "
                f"{saved_processes} processes, or use a torch.utils.data.BatchSampler over a sampler (sharded by samples)"
            )
        samples = state_dict.get("samples", batches * total)
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 0 or samples % total:
            raise ValueError(
                f"state_dict['samples']={samples!r} is not a whole number of steps of {total} samples; pass the dict returned "
                "by DataLoaderShard.state_dict() unchanged"
            )
        return samples // total

    def __len__(self) -> int:
        """Batches the current pass yields on this process (a `skip_first_batches` view: the rest after the skip).

        A position restored by ``load_state_dict`` does not shorten it: like Accelerate's loader, ``len()`` is then
        a whole epoch, which the usual resume recipe (``resume_step // len(loader)``, then `skip_first_batches`)
        relies on.
        """
        full = super().__len__()
        if self._pass_skip is not None:
            return max(full - self._pass_skip, 0)
        return max(full - (self._skip_once or 0), 0)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        progress = self._progress
        progress.advance()
        if self._skip_once is not None:
            skip, self._skip_once = self._skip_once, None
        else:
            skip = progress.resume_skip
        progress.resume_skip, progress.position = 0, skip
        self._set_epoch_on_samplers(progress.epoch)
        progress.end = False
        self._pass_skip = skip
        resume, progress.resume = progress.resume, None
        in_place = self._fetched_in_place and isinstance(self._shard, BatchSamplerShard)  # read by _batches' fetcher
        replay = resume[1] if resume is not None and resume[0] == progress.epoch else None
        return self._run_pass(lambda: self._batches(skip, replay), progress, None if in_place else self.device)

    def _run_pass(
        self, start: Callable[[], Iterator[Any]], progress: _Progress, device: torch.device | None
    ) -> Iterator[Any]:
        # `start` runs when the first batch is asked for, as in Accelerate's loader (a generator): the RNGs are
        # synchronized and drawn from then, so loaders iterated together (zip) draw in the same order as there.
        non_blocking = self.non_blocking
        try:
            progress.started, progress.running = next(_PASSES), self
            batches = start()
            current = next(batches, _END)
            if current is _END:
                progress.complete = True
                return
            for upcoming in batches:
                progress.position += 1
                yield current if device is None else _send(current, device, non_blocking)
                current = upcoming
            progress.end = True
            progress.position += 1
            progress.complete = True
            yield current if device is None else _send(current, device, non_blocking)
        finally:
            self._pass_skip = None
            progress.end = False  # the pass is over: gather_for_metrics must not trim other loaders' batches
            progress.started, progress.running = 0, None
            if not progress.complete:  # left early (break): the sampler's generator as a plain loader's is left
                workers = (self.prefetch_factor or 0) * self.num_workers if self.num_workers else 0
                undraw_unreached(self._shard, progress.record, self.generator, progress.position + 1 + workers)
            progress.advance()

    def _batches(self, skip: int, replay: dict[str, torch.Tensor] | None) -> Iterator[Any]:
        """Raw batches of this pass, starting at batch ``skip``.

        A pass draws as a plain DataLoader does: the processes' RNGs are synchronized (``synchronize``), the base
        seed is drawn, then the sampler draws the order at the first batch. A pass resumed mid-epoch (``replay``:
        the RNG states its order was drawn from) continues one that drew before the checkpoint, which saved the RNGs
        after those draws: it draws nothing from the live RNGs and redraws its order from ``replay``, so a resumed
        run sees the same batches and the same random numbers.
        """
        shard = self._shard
        order = None
        if replay is None:
            if self.synchronize is not None:
                self.synchronize(self.synchronized_generator)
            self._progress.record = pass_record(shard)
        else:
            self._progress.record = replay
            order = redraw(shard, replay, self.generator) if replay and isinstance(shard, BatchSamplerShard) else None
        rng = self.generator if self.generator is not None else torch.default_generator
        state = rng.get_state() if replay is not None else None
        if isinstance(shard, BatchSamplerShard) and self._fetcher is not None:
            torch.empty((), dtype=torch.int64).random_(generator=self.generator)
            batches: Iterator[Any] = self._fetched_batches(skip, order)
        elif isinstance(shard, BatchSamplerShard):
            # read when the DataLoader's iterator draws its sampler iterator(s)
            shard.first_batch, shard.order = skip, order.tolist() if isinstance(order, torch.Tensor) else order
            try:
                batches = super().__iter__()
            finally:
                shard.first_batch, shard.order = 0, None
        else:  # iterable data sets (and unsharded samplers) cannot seek: skipped batches are read and dropped
            batches = itertools.islice(super().__iter__(), skip, None)
        if state is not None:
            rng.set_state(state)
        return batches

    def _fetched_batches(self, skip: int, order: Any) -> Iterator[Any]:
        fetch, takes_tensor = self._fetcher  # type: ignore[misc]
        shard: BatchSamplerShard = self._shard  # type: ignore[assignment]
        if not shard.arithmetic:
            shard.first_batch, shard.order = skip, order
            try:
                indices = iter(shard)
            finally:
                shard.first_batch, shard.order = 0, None
            for idx in indices:
                yield fetch(torch.as_tensor(idx, dtype=torch.int64) if takes_tensor else idx)
            return
        sampler = shard.batch_sampler.sampler
        total: Any = shard.total_batch_size
        if order is not None:
            seq: Any = order if takes_tensor else order.tolist()
        else:
            seq = flat_index_tensor(sampler) if takes_tensor else flat_indices(sampler)
        take = _take_tensor if takes_tensor else take_span
        length = len(seq)
        for begin, end in shard.spans(length, skip):  # a span inside the index tensor is a view of it
            yield fetch(seq[begin:end] if takes_tensor and end <= length else take(seq, begin, end, total))

    def _set_epoch_on_samplers(self, epoch: int) -> None:
        shard = self._shard
        targets = [shard, getattr(shard, "batch_sampler", None)]
        targets.append(getattr(targets[1], "sampler", None))
        for target in targets:
            if target is not None and hasattr(target, "set_epoch"):
                target.set_epoch(epoch)
        # Accelerate tells a map-style data set the epoch too, unless (with several processes) the sampler took it
        several = isinstance(shard, BatchSamplerShard) and shard.num_processes > 1
        if isinstance(shard, BatchSamplerShard) and hasattr(self.dataset, "set_epoch") and not (several and hasattr(targets[2], "set_epoch")):
            self.dataset.set_epoch(epoch)


def _global_batch_message(saved: int, saved_processes: int, total: int, processes: int, split: bool) -> str:
    """Why a loader position of another global batch is refused, and the batch size that keeps it."""
    said = (f"the checkpoint's loader took {saved} samples a step over {saved_processes} processes, this one takes {total} "
            f"over {processes}; resuming on the samples the interrupted run would have seen needs the same global batch. ")
    if saved % processes:
        fits = ", ".join(str(n) for n in range(1, saved + 1) if saved % n == 0)
        return said + (f"{saved} samples cannot be dealt evenly to {processes} processes: run on a number of processes that "
                       f"divides {saved} ({fits})")
    if split:
        return said + f"Give the DataLoader batch_size={saved} (split_batches=True splits it over the processes)"
    return said + f"Give the DataLoader batch_size={saved // processes} ({saved} / {processes} processes)"


_END = object()
_PASSES = itertools.count(1)  # orders the passes in progress (GradientState.active_dataloader: the one begun last)


def carried_kwargs(loader: DataLoader) -> dict[str, Any]:
    """The arguments of `loader` a loader built over its data set keeps (workers, ``collate_fn``, ``pin_memory``, ...)."""
    return {name: getattr(loader, name) for name in _CARRIED if hasattr(loader, name)}


def _build(
    dataloader: DataLoader, *, num_processes: int, process_index: int, split_batches: bool, even_batches: bool,
    seed: int | None, dispatch: bool = False, **shard_kwargs: Any,
) -> DataLoaderShard:
    kwargs = carried_kwargs(dataloader)
    dataset = dataloader.dataset
    if isinstance(dataset, IterableDataset):
        if dataloader.batch_size is None:
            raise ValueError(
                "prepare_data_loader cannot shard an iterable data set loaded with batch_size=None; "
                "give the DataLoader a batch_size"
            )
        several = num_processes > 1 and not dispatch
        shard = IterableDatasetShard(
            dataset, batch_size=dataloader.batch_size, drop_last=dataloader.drop_last, num_processes=num_processes,
            process_index=process_index, split_batches=split_batches, even_batches=even_batches, dispatch=dispatch,
            seed_generator=several,
        )
        if dispatch:  # Accelerate's dispatcher loads without the user's generator (the base seed comes from the global RNG)
            kwargs.pop("generator", None)
        generator = getattr(dataset, "generator", None) if several else None
        return DataLoaderShard(
            shard, batch_size=shard.per_process_batch_size, drop_last=dataloader.drop_last, seed=seed or 0,
            synchronized_generator=generator if isinstance(generator, torch.Generator) else None, **shard_kwargs, **kwargs,
        )
    if dispatch:
        return _build_dispatched(dataloader, num_processes=num_processes, process_index=process_index, split_batches=split_batches,
                                 even_batches=even_batches, seed=seed, shard_kwargs=shard_kwargs, kwargs=kwargs)
    as_sampler = dataloader.batch_sampler is None
    batch_sampler = dataloader.sampler if as_sampler else dataloader.batch_sampler
    if as_sampler and not isinstance(batch_sampler, BatchSampler):
        raise ValueError(
            f"prepare_data_loader cannot shard a DataLoader with batch_size=None over a {type(batch_sampler).__name__}; "
            "give it a batch_size, or pass a BatchSampler as its sampler"
        )
    batch_sampler, generator = ordered(batch_sampler, seed, num_processes)
    batch_shard = BatchSamplerShard(
        batch_sampler, num_processes=num_processes, process_index=process_index, split_batches=split_batches,
        even_batches=even_batches,
    )
    placement = {"sampler": batch_shard, "batch_size": None} if as_sampler else {"batch_sampler": batch_shard}
    return DataLoaderShard(dataset, seed=seed or 0, synchronized_generator=generator, **placement, **shard_kwargs, **kwargs)


class _SampledStream(IterableDataset):
    """A map-style data set read in its sampler's order, as one stream (what Accelerate's dispatcher reads)."""

    def __init__(self, dataset: Any, sampler: Any) -> None:
        self.dataset = dataset
        self.sampler = sampler

    def set_epoch(self, epoch: int) -> None:
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __iter__(self) -> Iterator[Any]:
        return (self.dataset[i] for i in self.sampler)

    def __len__(self) -> int:
        return len(self.sampler)


def _order_from_process_zero(generator: torch.Generator | None) -> None:
    """Set `generator` to process 0's state (each process then draws process 0's order)."""
    if generator is not None:
        generator.set_state(broadcast_object(generator.get_state(), 0))


def _build_dispatched(
    dataloader: DataLoader, *, num_processes: int, process_index: int, split_batches: bool, even_batches: bool,
    seed: int | None, shard_kwargs: dict[str, Any], kwargs: dict[str, Any],
) -> DataLoaderShard:
    """Accelerate's ``DataLoaderDispatcher`` for a map-style data set: each step is the next ``num_processes`` batches of
    the loader (one with ``split_batches``) in process 0's order, split between the processes. Every process reads the
    step and keeps its part (as for an iterable data set, `strategies.sharding.shard_stream`)."""
    if dataloader.batch_size is None or type(dataloader.batch_sampler) is not BatchSampler:
        raise NotImplementedError(
            f"dispatch_batches=True needs a DataLoader with a batch_size over a sampler; this one batches with "
            f"{type(dataloader.batch_sampler).__name__}. Leave dispatch_batches unset (every process loads its own shard)"
        )
    if dataloader.num_workers:
        raise NotImplementedError(
            f"dispatch_batches=True for a map-style data set reads it in the main process; num_workers="
            f"{dataloader.num_workers} is not supported there. Pass num_workers=0, or leave dispatch_batches unset"
        )
    batch_sampler, generator = ordered(dataloader.batch_sampler, seed, num_processes)
    shard = IterableDatasetShard(
        _SampledStream(dataloader.dataset, batch_sampler.sampler), batch_size=dataloader.batch_size, drop_last=dataloader.drop_last,
        num_processes=num_processes, process_index=process_index, split_batches=split_batches, even_batches=even_batches,
        dispatch=True,
    )
    kwargs = {k: v for k, v in kwargs.items() if k not in ("generator", "worker_init_fn", "prefetch_factor", "persistent_workers")}
    if generator is not None and shard_kwargs.get("synchronize") is None:
        shard_kwargs = {**shard_kwargs, "synchronize": _order_from_process_zero}
    return DataLoaderShard(
        shard, batch_size=shard.per_process_batch_size, drop_last=dataloader.drop_last, seed=seed or 0,
        synchronized_generator=generator, **shard_kwargs, **kwargs,
    )


def prepare_data_loader(
    dataloader: DataLoader,
    *,
    device: torch.device | str | None = None,
    num_processes: int = 1,
    process_index: int = 0,
    split_batches: bool = False,
    even_batches: bool = True,
    put_on_device: bool = True,
    non_blocking: bool = False,
    seed: int | None = 0,
    dispatch_batches: bool | None = None,
    synchronize: Callable[[torch.Generator | None], None] | None = None,
) -> DataLoaderShard:
    """Rebuild ``dataloader`` to load only this process's shard (see `strategies.sharding` for the policy).

    Two processes, 22 samples, ``batch_size=3``: process 0 gets ``[0,1,2] [6,7,8] [12,13,14] [18,19,20]``
    and process 1 gets ``[3,4,5] [9,10,11] [15,16,17] [21,0,1]``. Workers, collate function, pinning,
    worker init function, generator and persistent workers are kept.

    The order is Accelerate's for the same settings. With an int ``seed`` a shuffling loader shuffles with
    ``seed + epoch`` on every process (Accelerate's ``use_seedable_sampler=True``, ``data_seed=seed``). With
    ``seed=None`` the sampler draws from its generator, or from torch's global RNG, at every pass, as a plain
    DataLoader does; with several processes a sampler without a generator is given one (seeded from the global
    RNG) and ``synchronize`` is called with it when each pass starts, to make it equal on every process.
    ``dispatch_batches`` (default: ``put_on_device``) gives an iterable data set the last step of Accelerate's
    ``DataLoaderDispatcher`` (see `strategies.sharding.shard_stream`); every process reads the stream.
    ``dispatch_batches=True`` with a map-style data set reads it in process 0's order as such a stream.

    Raises:
        TypeError: if ``dataloader`` is not a `torch.utils.data.DataLoader`.
        ValueError: for a bad process count or index, ``split_batches`` with a batch size that does not
            divide, or a loader with no batch size over a plain sampler.
        NotImplementedError: for ``dispatch_batches=True`` with a map-style data set loaded by workers or by a
            custom batch sampler.
    """
    if not isinstance(dataloader, DataLoader):
        raise TypeError(f"prepare_data_loader expects a torch.utils.data.DataLoader, got {_not_a_loader(dataloader)}")
    check_processes(num_processes, process_index)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise TypeError(f"seed={seed!r} must be an int, or None (the sampler draws from its generator or the global RNG)")
    iterable = isinstance(dataloader.dataset, IterableDataset)
    dispatch = (put_on_device if dispatch_batches is None else bool(dispatch_batches)) and (iterable or dispatch_batches is True)
    return _build(
        dataloader, num_processes=num_processes, process_index=process_index, split_batches=split_batches,
        even_batches=even_batches, seed=seed, dispatch=dispatch, device=device, put_on_device=put_on_device,
        non_blocking=non_blocking, synchronize=synchronize,
    )


def skip_first_batches(dataloader: DataLoader, num_batches: int = 0) -> DataLoaderShard:
    """A loader whose next pass starts at batch ``num_batches``; later passes are whole.

    Skipping happens at the batch-sampler level: no sample of a skipped batch is loaded. For a
    `DataLoaderShard` the result shares its epoch and position (its ``state_dict`` is the loader's); a
    resume position loaded with ``load_state_dict`` is replaced by ``num_batches``. A plain `DataLoader` is
    wrapped as one process with its sampler unchanged.

    Raises:
        ValueError: if ``num_batches`` is not a non-negative int.
        TypeError: if ``dataloader`` is not a `DataLoader`.
    """
    if isinstance(num_batches, bool) or not isinstance(num_batches, int) or num_batches < 0:
        raise ValueError(f"num_batches={num_batches!r} must be an int >= 0")
    if isinstance(dataloader, DataLoaderShard):
        view = copy.copy(dataloader)
        view._iterator = None
    elif isinstance(dataloader, DataLoader):
        view = _build(
            dataloader, num_processes=1, process_index=0, split_batches=False, even_batches=False, seed=None, put_on_device=False,
        )
    else:
        raise TypeError(f"skip_first_batches expects a torch.utils.data.DataLoader, got {_not_a_loader(dataloader)}")
    view._skip_once = num_batches
    return view


def _not_a_loader(data: Any) -> str:
    """What a loader's place got, and what to pass instead (for the TypeError)."""
    name = type(data).__name__
    fix = ("wrap the data in a torch.utils.data.DataLoader (a generator or stream: over an IterableDataset whose __iter__ "
           "yields the samples) and pass that" if hasattr(data, "__iter__") and not isinstance(data, (str, bytes)) else
           "pass a torch.utils.data.DataLoader")
    return f"{'an' if name[:1] in 'aeiouAEIOU' else 'a'} {name} ({data!r:.60}); {fix}"
