"""Accelerate's ``ParallelismConfig``: the Accelerator face's spelling of `strategies.mesh.ParallelDims`.

``Accelerator(parallelism_config=ParallelismConfig(dp_replicate_size=..., dp_shard_size=..., tp_size=...))`` runs
FSDP2 on the N-D mesh those sizes describe (HSDP with both data-parallel sizes above 1, tensor parallelism with
``tp_size > 1``: the model's own plan — `transformers` models carry one — or ``tp_plan=`` here), or DDP for
``dp_replicate_size`` alone. Unset sizes come from ``PARALLELISM_CONFIG_*_SIZE`` (what ``accelerate launch`` sets),
else 1; with every size 1 on several processes, the processes replicate (DDP), as Accelerate does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from strategies.mesh import ParallelDims
from strategies.pipeline import PipelineConfig


@dataclass
class TorchTensorParallelConfig:
    """Accelerate's tensor-parallel handler; ``enable_async_tp`` (asynchronous TP, CUDA only) is refused."""

    enable_async_tp: bool = False

    def __post_init__(self) -> None:
        if self.enable_async_tp:
            raise NotImplementedError(
                "TorchTensorParallelConfig(enable_async_tp=True) is not available: asynchronous tensor parallelism needs "
                "CUDA symmetric memory; leave it False (tensor parallelism itself runs)"
            )


@dataclass
class ParallelismConfig:
    """Sizes of the parallel dimensions (Accelerate 1.15's fields and properties; see the module docstring).

    Args:
        dp_replicate_size: data-parallel replicas (HSDP's replicate dimension, or DDP alone).
        dp_shard_size: processes each replica is sharded over (FSDP2).
        tp_size: tensor-parallel degree.
        pp_size: pipeline stages' processes (the outermost dimension): the model is split into stages by layer name and
            each stage sharded over the data-parallel sizes (`strategies.pipeline`); train with
            ``accelerator.pipeline_step(model, x, target=y, loss_fn=...)``.
        pp_handler: a `strategies.PipelineConfig` (schedule, microbatches, split); default 1F1B with ``pp_size > 1``.
        cp_size, sp_size: context / sequence parallelism: only 1 (not available yet).
        tp_handler: a `TorchTensorParallelConfig`.
        tp_plan: submodule names → parallel styles; None: the model's own plan (an addition to Accelerate's fields:
            Accelerate expects a model split already by ``from_pretrained(tp_plan="auto")``).
    """

    dp_replicate_size: int | None = None
    dp_shard_size: int | None = None
    tp_size: int | None = None
    cp_size: int | None = None
    cp_backend: str | None = None
    sp_size: int | None = None
    sp_backend: str | None = None
    tp_handler: TorchTensorParallelConfig | None = None
    cp_handler: Any = None
    sp_handler: Any = None
    tp_plan: dict[str, Any] | None = None
    device_mesh: Any = field(default=None, repr=False)
    pp_size: int | None = None
    pp_handler: PipelineConfig | None = None

    def _size(self, name: str) -> int:
        return int(getattr(self, f"{name}_size"))

    def __post_init__(self) -> None:
        for name in ("dp_replicate", "dp_shard", "tp", "cp", "sp", "pp"):
            if getattr(self, f"{name}_size") is None:
                raw = os.environ.get(f"PARALLELISM_CONFIG_{name.upper()}_SIZE", "1")
                try:
                    setattr(self, f"{name}_size", int(raw))
                except ValueError:
                    raise ValueError(f"PARALLELISM_CONFIG_{name.upper()}_SIZE={raw!r} is not an int") from None
            size = getattr(self, f"{name}_size")
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ValueError(f"ParallelismConfig({name}_size={size!r}) must be an int >= 1")
        if self._size("cp") > 1 or self._size("sp") > 1 or self.cp_handler is not None or self.sp_handler is not None:
            raise NotImplementedError(
                f"ParallelismConfig(cp_size={self._size('cp')}, sp_size={self._size('sp')}): context and sequence parallelism are not "
                "available yet; use dp_replicate_size, dp_shard_size and tp_size"
            )
        if self.pp_handler is not None and (not isinstance(self.pp_handler, PipelineConfig) or self._size("pp") == 1):
            raise ValueError(
                f"ParallelismConfig(pp_handler={self.pp_handler!r}) needs pp_size > 1 and a strategies.PipelineConfig; pass "
                "pp_size=2 (or more) with it, or leave pp_handler out"
            )
        if self._size("tp") > 1 and self.tp_handler is None:
            self.tp_handler = TorchTensorParallelConfig()
        if self._size("tp") > 1 and self._size("dp_replicate") > 1 and self._size("dp_shard") == 1:
            raise ValueError(
                "ParallelismConfig: tensor parallelism (tp_size > 1) with pure data parallelism (dp_replicate_size > 1, "
                "dp_shard_size == 1) is not supported (nor by Accelerate); set dp_shard_size > 1 (FSDP + TP, or HSDP + TP "
                "with dp_replicate_size > 1)"
            )

    # Accelerate's properties ------------------------------------------------------------------------------
    @property
    def total_size(self) -> int:
        return (self._size("dp_replicate") * self._size("dp_shard") * self._size("tp") * self._size("cp") * self._size("sp")
                * self._size("pp"))

    @property
    def data_parallel_size(self) -> int:
        return self._size("dp_replicate") * self._size("dp_shard")

    @property
    def non_data_parallel_size(self) -> int:
        return self._size("tp") * self._size("cp") * self._size("sp") * self._size("pp")

    @property
    def dp_replicate_enabled(self) -> bool:
        return self._size("dp_replicate") > 1

    @property
    def dp_shard_enabled(self) -> bool:
        return self._size("dp_shard") > 1

    @property
    def tp_enabled(self) -> bool:
        return self._size("tp") > 1

    @property
    def cp_enabled(self) -> bool:
        return False

    @property
    def sp_enabled(self) -> bool:
        return False

    @property
    def dp_dim_names(self) -> list[str]:
        return [n for n, on in (("dp_replicate", self.dp_replicate_enabled), ("dp_shard", self.dp_shard_enabled)) if on]

    @property
    def non_dp_dim_names(self) -> list[str]:
        return ["tp"] if self.tp_enabled else []

    @property
    def active_mesh_dims(self) -> list[str]:
        return self.dp_dim_names + self.non_dp_dim_names

    @property
    def fsdp_dim_names(self) -> list[str]:
        return (["dp_replicate"] if self.dp_replicate_enabled else []) + ["dp_shard"]

    def resolved(self, num_processes: int) -> ParallelismConfig:
        """Check the sizes against the number of processes (every size 1 on several processes: they replicate)."""
        if self.total_size == 1 and num_processes > 1:
            self.dp_replicate_size = num_processes
        if self.total_size != num_processes:
            pp = f"{self._size('pp')} × " if self._size("pp") > 1 else ""
            raise ValueError(
                f"ParallelismConfig total_size ({pp}{self._size('dp_replicate')} × {self._size('dp_shard')} × {self._size('tp')} = "
                f"{self.total_size}) does not match num_processes ({num_processes}); adjust dp_replicate_size/dp_shard_size/"
                "tp_size/pp_size so their product is the number of processes"
            )
        return self

    @property
    def shards(self) -> bool:
        """Whether this runs FSDP2 (sharding or tensor parallelism), not plain data parallelism."""
        return self.dp_shard_enabled or self.tp_enabled or self._size("pp") > 1

    def parallel_dims(self, world_size: int) -> ParallelDims:
        return ParallelDims(world_size=world_size, dp_replicate=self._size("dp_replicate"), dp_shard=self._size("dp_shard"),
                            tp=self._size("tp"), pp=self._size("pp"))
