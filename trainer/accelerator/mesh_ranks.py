"""The Accelerator's view of its device mesh: Accelerate's ``torch_device_mesh`` and per-dimension ``*_rank`` properties."""

from __future__ import annotations

from typing import Any

from trainer.accelerator.layout import ProcessLayout
from trainer.accelerator.parallelism import ParallelismConfig


class MeshRanks(ProcessLayout):
    """The Accelerator's view of its mesh (Accelerate's ``torch_device_mesh`` and ``*_rank`` properties)."""

    __slots__ = ()
    _parallelism_config: ParallelismConfig | None

    @property
    def parallelism_config(self) -> ParallelismConfig | None:
        return self._parallelism_config

    @property
    def torch_device_mesh(self) -> Any:
        """The device mesh with named dimensions (``dp_replicate``, ``dp_shard``, ``tp``, flattened ``dp``), or None."""
        return self.strategy.device_mesh if self._parallelism_config is not None else None

    @property
    def is_composable_parallelism_enabled(self) -> bool:
        return self.strategy.sharded and self.strategy.device_mesh is not None  # (FSDP2: a mesh the shards follow)

    def _mesh_rank(self, dim: str, enabled: bool, what: str) -> int:
        if self._parallelism_config is None:
            raise RuntimeError(f"{what} is not configured; pass Accelerator(parallelism_config=ParallelismConfig(...)) first")
        return self.torch_device_mesh.get_local_rank(dim) if enabled and self.torch_device_mesh is not None else 0

    @property
    def tensor_parallel_rank(self) -> int:
        """This process's index in its tensor-parallel group (0 without tensor parallelism)."""
        return self._mesh_rank("tp", bool(self._parallelism_config and self._parallelism_config.tp_enabled), "Tensor parallelism")

    @property
    def data_parallel_rank(self) -> int:
        """Accelerate's meaning: the index along ``dp_replicate`` (0 without replicas); see `data_parallel_shard_rank`."""
        config = self._parallelism_config
        if config is not None and config.dp_replicate_enabled and not config.shards:  # DDP replicas: the process index
            return self.process_index
        return self._mesh_rank("dp_replicate", bool(config and config.dp_replicate_enabled), "Data parallelism")

    @property
    def data_parallel_shard_rank(self) -> int:
        """The index along ``dp_shard`` (0 without sharding)."""
        return self._mesh_rank("dp_shard", bool(self._parallelism_config and self._parallelism_config.dp_shard_enabled),
                               "Shard-based data parallelism")

    @property
    def pipeline_parallel_rank(self) -> int:
        raise NotImplementedError("pipeline parallelism is not available (nor in Accelerate)")

    @property
    def context_parallel_rank(self) -> int:
        raise NotImplementedError("context parallelism is not available yet; ParallelismConfig(cp_size>1) is refused")
