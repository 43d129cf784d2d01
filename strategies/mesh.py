"""One description of how the processes divide the work: `ParallelDims` and the device mesh built from it.

After torchtitan's ``ParallelDims``: a size per dimension — ``dp_replicate`` (data-parallel replicas: HSDP's
replicate dimension, across machines), ``dp_shard`` (FSDP's shard dimension), ``tp`` (tensor parallel, inside a
machine) — whose product is the number of processes; ``-1`` means "the rest". The mesh has those dimensions in that
order (``tp`` innermost, so a tensor-parallel group is neighbouring ranks, on one machine), plus the flattened
sub-meshes other code asks for by name:

* ``"dp"`` = ``dp_replicate × dp_shard``: the data-parallel processes. Every process of one ``tp`` group sees the
  same batch; data loading, ``gather_for_metrics`` and ``self.log(sync_dist=True)`` work over ``"dp"`` only.
* ``"dp_shard"`` / ``("dp_replicate", "dp_shard")``: what ``fully_shard`` shards over (HSDP with both).
* ``"tp"``: what ``parallelize_module`` splits layers over.
* ``"pp"`` (outermost, with ``pp > 1``): the pipeline stages (`strategies.pipeline`); every process of one pipeline
  sees the same batch (the first stage reads the inputs, the last the targets).

Context parallelism (``cp``) is not built yet: a size other than 1 is refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

DIMS = ("dp_replicate", "dp_shard", "tp")
PP_DIMS = ("pp", *DIMS)
LIGHTNING_DIMS = ("data_parallel", "tensor_parallel")  # Lightning's ModelParallelStrategy


@dataclass(frozen=True)
class ParallelDims:
    """Sizes of the parallel dimensions, checked against the number of processes.

    Args:
        dp_replicate: data-parallel replicas (HSDP's replicate dimension); 1 for none.
        dp_shard: processes each model replica is sharded over (FSDP); ``-1``: the processes the others leave.
        tp: tensor-parallel degree; 1 for none.
        cp: context parallelism; only 1 is supported.
        world_size: the number of processes.
        pp: pipeline stages' processes (the outermost dimension); 1 for none.

    Raises:
        ValueError: a size is not a positive int (or ``-1``), more than one is ``-1``, or their product is not
            `world_size` (the message names the product and a fix).
    """

    world_size: int
    dp_replicate: int = 1
    dp_shard: int = -1
    tp: int = 1
    cp: int = 1
    pp: int = 1

    def __post_init__(self) -> None:
        sizes = {"pp": self.pp, "dp_replicate": self.dp_replicate, "dp_shard": self.dp_shard, "tp": self.tp, "cp": self.cp}
        for name, size in sizes.items():
            if isinstance(size, bool) or not isinstance(size, int) or (size < 1 and size != -1):
                raise ValueError(f"{name}={size!r} must be a positive int, or -1 for the processes the other dimensions leave")
        if self.cp != 1:
            raise NotImplementedError(
                f"cp={self.cp}: context parallelism is not available yet; use dp_replicate, dp_shard and tp (cp=1)"
            )
        rest = [name for name, size in sizes.items() if size == -1]
        if len(rest) > 1:
            raise ValueError(f"only one dimension may be -1 (the rest), got {', '.join(f'{n}=-1' for n in rest)}")
        known = math.prod(size for size in sizes.values() if size != -1)
        if rest:
            if self.world_size % known:
                raise ValueError(
                    f"{' × '.join(f'{n}={s}' for n, s in sizes.items() if s != -1)} = {known} does not divide the "
                    f"{self.world_size} processes, so {rest[0]}=-1 has no size; choose sizes whose product divides {self.world_size}"
                )
            object.__setattr__(self, rest[0], self.world_size // known)
        product = self.pp * self.dp_replicate * self.dp_shard * self.tp * self.cp
        if product != self.world_size:
            raise ValueError(
                f"{f'pp={self.pp} × ' if self.pp > 1 else ''}dp_replicate={self.dp_replicate} × dp_shard={self.dp_shard} × tp={self.tp} = {product}, but there are "
                f"{self.world_size} processes; the sizes must multiply to the number of processes (pass -1 for one of "
                "them to take the rest, e.g. dp_shard=-1)"
            )

    @property
    def dp_size(self) -> int:
        """Data-parallel processes: each sees its own batches."""
        return self.dp_replicate * self.dp_shard

    @property
    def tp_enabled(self) -> bool:
        return self.tp > 1

    @property
    def pp_enabled(self) -> bool:
        return self.pp > 1

    @property
    def hsdp(self) -> bool:
        return self.dp_replicate > 1 and self.dp_shard > 1

    @property
    def n_d(self) -> bool:
        """More than the one data-parallel dimension plain FSDP has."""
        return self.dp_replicate > 1 or self.tp > 1 or self.pp > 1

    def build_mesh(self, device_type: str, *, lightning_names: bool = False, timeout: float | None = None) -> DeviceMesh:
        """The processes' `DeviceMesh` (every process calls it, in step); the one place a mesh is built.

        * plain FSDP (``dp_shard`` only): one unnamed dimension over every process, the mesh ``fully_shard`` makes
          by default;
        * otherwise ``("dp_replicate", "dp_shard", "tp")`` plus the flattened ``"dp"``, with ``"pp"`` first when
          ``pp > 1``;
        * ``lightning_names``: Lightning's ``ModelParallelStrategy`` mesh, ``("data_parallel", "tensor_parallel")``
          (``dp_shard × tp``), the names a Lightning module's ``configure_model`` indexes.

        `timeout`: the run's process-group timeout in seconds, given to every group the mesh makes (torch would give
        them the backend's default, 30 minutes for gloo).
        """
        from torch.distributed.device_mesh import init_device_mesh

        from strategies.process_group import give_timeout  # lazy: it imports torch.distributed, which planning code need not

        if lightning_names:
            if self.dp_replicate != 1 or self.pp != 1:
                raise ValueError(f"Lightning's two-dimensional mesh has no replicate dimension, got {self}")
            mesh = init_device_mesh(device_type, (self.dp_shard, self.tp), mesh_dim_names=LIGHTNING_DIMS)
        elif not self.n_d:
            mesh = init_device_mesh(device_type, (self.world_size,))
        elif self.pp > 1:
            mesh = init_device_mesh(device_type, (self.pp, self.dp_replicate, self.dp_shard, self.tp), mesh_dim_names=PP_DIMS)
            mesh["dp_replicate", "dp_shard"]._flatten("dp")
        else:
            mesh = init_device_mesh(device_type, (self.dp_replicate, self.dp_shard, self.tp), mesh_dim_names=DIMS)
            mesh["dp_replicate", "dp_shard"]._flatten("dp")
        if timeout is not None:
            flattened = [mesh["dp"].get_group()] if self.n_d and not lightning_names else []
            give_timeout([*(mesh.get_group(dim) for dim in range(mesh.ndim)), *flattened], timeout)
        return mesh

    def fsdp_mesh(self, mesh: DeviceMesh) -> DeviceMesh:
        """What ``fully_shard`` shards over on a mesh `build_mesh` made: ``dp_shard``, or ``(dp_replicate, dp_shard)``
        for HSDP (replicated across the first, sharded across the second); the whole of a one-dimensional mesh."""
        names = tuple(mesh.mesh_dim_names or ())
        if not names:
            return mesh
        if names == LIGHTNING_DIMS:
            return mesh["data_parallel"]
        return mesh["dp_replicate", "dp_shard"] if self.dp_replicate > 1 else mesh["dp_shard"]

    def data_parallel_mesh(self, mesh: DeviceMesh) -> DeviceMesh:
        """The processes that see different batches, on a mesh `build_mesh` made (its ``"dp"`` or ``"data_parallel"``
        dimension; the whole of a one-dimensional mesh)."""
        names = tuple(mesh.mesh_dim_names or ())
        if not names:
            return mesh
        return mesh["data_parallel"] if names == LIGHTNING_DIMS else mesh["dp"]

    def coordinates(self, rank: int) -> dict[str, int]:
        """Where process `rank` sits on each dimension (and its data-parallel rank, ``"dp"``)."""
        tp = rank % self.tp
        dp_shard = (rank // self.tp) % self.dp_shard
        dp_replicate = (rank // (self.tp * self.dp_shard)) % self.dp_replicate
        pp = rank // (self.tp * self.dp_shard * self.dp_replicate)
        return {"pp": pp, "dp_replicate": dp_replicate, "dp_shard": dp_shard, "tp": tp, "dp": dp_replicate * self.dp_shard + dp_shard}

    def __str__(self) -> str:
        return f"{f'pp={self.pp} × ' if self.pp > 1 else ''}dp_replicate={self.dp_replicate} × dp_shard={self.dp_shard} × tp={self.tp}"
