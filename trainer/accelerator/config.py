"""Small configuration records of the `Accelerator` face (the names Accelerate users know)."""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass, field
from typing import Any


class DistributedType(str, enum.Enum):
    """What kind of distributed run this is."""

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    MULTI_XPU = "MULTI_XPU"
    FSDP = "FSDP"
    DEEPSPEED = "DEEPSPEED"
    XLA = "XLA"


@dataclass
class ProjectConfiguration:
    """Where a project writes checkpoints and logs, and how checkpoints are named.

    With ``automatic_checkpoint_naming=True``, `Accelerator.save_state()` writes
    ``{project_dir}/checkpoints/checkpoint_{iteration}`` and keeps at most ``total_limit`` of them.
    """

    project_dir: str | None = None
    logging_dir: str | None = None
    automatic_checkpoint_naming: bool = False
    total_limit: int | None = None
    iteration: int = 0
    save_on_each_node: bool = False

    def __post_init__(self) -> None:
        if self.logging_dir is None:
            self.logging_dir = self.project_dir
        if self.total_limit is not None and (not isinstance(self.total_limit, int) or self.total_limit < 1):
            raise ValueError(f"total_limit={self.total_limit!r} must be a positive int (or None to keep every checkpoint)")
        if self.automatic_checkpoint_naming and self.project_dir is None:
            raise ValueError("automatic_checkpoint_naming=True needs a project_dir; pass ProjectConfiguration(project_dir='...')")

    def set_directories(self, project_dir: str | os.PathLike | None = None) -> None:
        self.project_dir = None if project_dir is None else os.fspath(project_dir)
        if self.logging_dir is None:
            self.logging_dir = self.project_dir


@dataclass
class DataLoaderConfiguration:
    """How `prepare` shards data loaders."""

    split_batches: bool = False
    even_batches: bool = True
    dispatch_batches: bool | None = None
    use_seedable_sampler: bool = True
    non_blocking: bool = False
    data_seed: int | None = None

    def __post_init__(self) -> None:
        if self.dispatch_batches:
            raise NotImplementedError(
                "dispatch_batches=True (rank 0 loads and scatters every batch) is not supported; every rank loads its own shard. "
                "Leave dispatch_batches unset"
            )


@dataclass
class GradientAccumulationPlugin:
    """Gradient accumulation settings (``num_steps``; ``sync_with_dataloader`` syncs at the end of a loader)."""

    num_steps: int = 1
    adjust_scheduler: bool = True
    sync_with_dataloader: bool = True
    sync_each_batch: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.num_steps, int) or isinstance(self.num_steps, bool) or self.num_steps < 1:
            raise ValueError(f"gradient accumulation num_steps={self.num_steps!r} must be an int >= 1")


@dataclass
class DDPKwargs:
    """Extra arguments for `DistributedDataParallel` (Accelerate's ``DistributedDataParallelKwargs``)."""

    find_unused_parameters: bool = False
    static_graph: bool = False
    bucket_cap_mb: float | None = None
    gradient_as_bucket_view: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


DistributedDataParallelKwargs = DDPKwargs
