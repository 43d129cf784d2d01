"""Accelerate's ``accelerate.data_loader`` under the renamed import: ``from trainer.data_loader import skip_first_batches``.

The loaders live in `strategies.data` (both faces use them): `prepare_data_loader` (Accelerate's signature, for any
process of any layout) shards a ``DataLoader`` into a `DataLoaderShard`; `skip_first_batches` starts one some batches
in (resuming mid-epoch). Accelerate's other loader
classes are provided when `strategies.data` has them, else listed in `trainer.unsupported` with the reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from strategies import data as _data
from strategies.data import DataLoaderShard, SeedableRandomSampler, skip_first_batches
from trainer.accelerator.layout import PartialState
from trainer.accelerator.preparation import checked_rng_types, rng_synchronizer
from trainer.unsupported import unsupported_names

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

_unsupported = unsupported_names(__name__)
_ACCELERATE_NAMES = ("BatchSamplerShard", "DataLoaderAdapter", "DataLoaderDispatcher", "DataLoaderStateMixin", "IterableDatasetShard",
                     "SkipBatchSampler", "SkipDataLoader", "get_sampler")


def prepare_data_loader(
    dataloader: torch.utils.data.DataLoader,
    device: Any = None,
    num_processes: int | None = None,
    process_index: int | None = None,
    split_batches: bool = False,
    put_on_device: bool = False,
    rng_types: list[Any] | None = None,
    dispatch_batches: bool | None = None,
    even_batches: bool = True,
    slice_fn_for_dispatch: Any = None,
    use_seedable_sampler: bool = False,
    data_seed: int | None = None,
    non_blocking: bool = False,
    use_stateful_dataloader: bool = False,
    torch_device_mesh: DeviceMesh | None = None,
) -> DataLoaderShard:
    """Accelerate's ``prepare_data_loader``: `dataloader` rebuilt to load the shard of process `process_index` of
    `num_processes` (default: this process's place in `PartialState`; no process group is needed to give others).

    Args:
        device: where batches go when `put_on_device` (``None``: left where they are).
        rng_types: RNGs set to process 0's when each pass starts (``"generator"``, ``"torch"``, ``"cuda"``), so that
            shuffling loaders draw one order on every process; needs the process group.
        dispatch_batches: an iterable data set is read by every process and split as Accelerate's dispatcher splits it
            (default: with `put_on_device`, for iterable data sets); needs `put_on_device`. Not for map-style data sets.
        use_seedable_sampler: a shuffling loader shuffles with ``data_seed + epoch`` (``data_seed`` default: the seed
            torch was seeded with), the same order on every process.
        use_stateful_dataloader: accepted; every loader returned is stateful (``state_dict``/``load_state_dict``).
        torch_device_mesh: processes that share a tensor- or context-parallel group get the same batches: the shard is
            the one of the data-parallel place (``dp_replicate`` x ``dp_shard``) of the mesh.

    Raises:
        ValueError: for ``dispatch_batches=True`` without `put_on_device`, a bad process count or index, or
            ``split_batches`` with a batch size the process count does not divide.
        NotImplementedError: for ``dispatch_batches=True`` with a map-style data set, or ``slice_fn_for_dispatch``
            (the dispatcher here splits batches by Accelerate's default rule only).
    """
    if dispatch_batches and not put_on_device:
        raise ValueError("dispatch_batches=True requires put_on_device=True (as Accelerate's); pass put_on_device=True")
    if slice_fn_for_dispatch is not None:
        raise NotImplementedError(
            "slice_fn_for_dispatch is not supported: a dispatched batch is split by Accelerate's default rule (every tensor "
            "along dim 0); leave it None"
        )
    if not isinstance(use_stateful_dataloader, bool):
        raise TypeError(f"use_stateful_dataloader={use_stateful_dataloader!r} must be True or False")
    if data_seed is not None and (isinstance(data_seed, bool) or not isinstance(data_seed, int)):
        raise TypeError(f"data_seed={data_seed!r} must be an int or None")
    state = PartialState() if num_processes is None or process_index is None or rng_types else None
    num_processes = state.num_processes if num_processes is None and state is not None else num_processes
    process_index = state.process_index if process_index is None and state is not None else process_index
    if torch_device_mesh is not None:
        num_processes, process_index = _data_parallel_place(torch_device_mesh, process_index)  # type: ignore[arg-type]
    seed = None
    if use_seedable_sampler:
        seed = data_seed if data_seed is not None else torch.random.initial_seed()
    synchronize = None
    if rng_types:
        synchronize = rng_synchronizer(checked_rng_types(rng_types))
    return _data.prepare_data_loader(
        dataloader, device=device, num_processes=num_processes, process_index=process_index,  # type: ignore[arg-type]
        split_batches=split_batches, even_batches=even_batches, put_on_device=put_on_device, non_blocking=non_blocking,
        seed=seed, dispatch_batches=bool(dispatch_batches) if dispatch_batches is not None else None, synchronize=synchronize,
    )


def _data_parallel_place(mesh: DeviceMesh, process_index: int) -> tuple[int, int]:
    """(data-parallel size, data-parallel index) of `process_index` on `mesh` (Accelerate's rule: ranks of one tensor-
    or context-parallel group share a batch)."""
    names = tuple(getattr(mesh, "mesh_dim_names", None) or ())
    size = {name: mesh[name].size() for name in ("tp", "cp", "dp_replicate", "dp_shard") if name in names}
    return size.get("dp_replicate", 1) * size.get("dp_shard", 1), process_index // (size.get("tp", 1) * size.get("cp", 1))


def __getattr__(name: str) -> Any:
    if name in _ACCELERATE_NAMES and hasattr(_data, name):
        return getattr(_data, name)
    return _unsupported(name)


__all__ = ["DataLoaderShard", "SeedableRandomSampler", "prepare_data_loader", "skip_first_batches"]
