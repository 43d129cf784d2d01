"""Accelerate's ``accelerate.data_loader`` under the renamed import: ``from trainer.data_loader import skip_first_batches``.

The loaders live in `strategies.data` (both faces use them): `prepare_data_loader` shards a ``DataLoader`` into a
`DataLoaderShard`; `skip_first_batches` starts one some batches in (resuming mid-epoch). Accelerate's other loader
classes are provided when `strategies.data` has them, else listed in `trainer.unsupported` with the reason.
"""

from __future__ import annotations

from typing import Any

from strategies import data as _data
from strategies.data import DataLoaderShard, SeedableRandomSampler, prepare_data_loader, skip_first_batches
from trainer.unsupported import unsupported_names

_unsupported = unsupported_names(__name__)
_ACCELERATE_NAMES = ("BatchSamplerShard", "DataLoaderAdapter", "DataLoaderDispatcher", "DataLoaderStateMixin", "IterableDatasetShard",
                     "SkipBatchSampler", "SkipDataLoader", "get_sampler")


def __getattr__(name: str) -> Any:
    if name in _ACCELERATE_NAMES and hasattr(_data, name):
        return getattr(_data, name)
    return _unsupported(name)


__all__ = ["DataLoaderShard", "SeedableRandomSampler", "prepare_data_loader", "skip_first_batches"]
