"""``lightning.pytorch.utilities.rank_zero`` under the rename: run or print on the process of global rank 0 only.

``rank_zero_only.rank`` is the process's global rank, read from the launcher's environment variables when this
module is imported (``RANK``, ``LOCAL_RANK``, ``SLURM_PROCID``, ``JSM_NAMESPACE_RANK``, as Lightning; 0 without them).
Every process `Trainer(devices=N)` or ``trainer launch`` starts has them before the script runs.
"""

from __future__ import annotations

import functools
import logging
import os
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
log = logging.getLogger(__name__)


def _rank_from_environment() -> int | None:
    for key in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):  # LOCAL_RANK before SLURM_PROCID, as Lightning
        value = os.environ.get(key)
        if value is not None:
            return int(value)
    return None


class LightningDeprecationWarning(DeprecationWarning):
    """Lightning's category for deprecation warnings (what `rank_zero_deprecation` warns with)."""


def rank_zero_only(fn: Callable[..., T], default: T | None = None) -> Callable[..., T | None]:
    """Decorate `fn` to run on global rank 0 only; on the other processes the call returns `default`.

    Raises:
        RuntimeError: on call, when ``rank_zero_only.rank`` was set to None.
    """

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> T | None:
        rank = getattr(rank_zero_only, "rank", None)
        if rank is None:
            raise RuntimeError("The `rank_zero_only.rank` needs to be set before use")
        return fn(*args, **kwargs) if rank == 0 else default

    return wrapped


rank_zero_only.rank = _rank_from_environment() or 0  # type: ignore[attr-defined]


@rank_zero_only
def rank_zero_debug(*args: Any, stacklevel: int = 4, **kwargs: Any) -> None:
    """``logging.debug`` on rank 0."""
    log.debug(*args, stacklevel=stacklevel, **kwargs)


@rank_zero_only
def rank_zero_info(*args: Any, stacklevel: int = 4, **kwargs: Any) -> None:
    """``logging.info`` on rank 0 (Lightning's logger is ``lightning.pytorch``; ours is this module's)."""
    log.info(*args, stacklevel=stacklevel, **kwargs)


@rank_zero_only
def rank_zero_warn(message: str | Warning, stacklevel: int = 4, **kwargs: Any) -> None:
    """``warnings.warn`` on rank 0."""
    warnings.warn(message, stacklevel=stacklevel, **kwargs)


def rank_zero_deprecation(message: str | Warning, stacklevel: int = 5, **kwargs: Any) -> None:
    """`rank_zero_warn` with `LightningDeprecationWarning`."""
    rank_zero_warn(message, stacklevel=stacklevel, category=kwargs.pop("category", LightningDeprecationWarning), **kwargs)


def rank_prefixed_message(message: str, rank: int | None) -> str:
    """`message` prefixed with ``[rank: N]`` (unchanged when `rank` is None)."""
    return f"[rank: {rank}] {message}" if rank is not None else message


__all__ = [
    "LightningDeprecationWarning", "rank_prefixed_message", "rank_zero_debug", "rank_zero_deprecation", "rank_zero_info",
    "rank_zero_only", "rank_zero_warn",
]
