"""Lightning's ``ModelParallelStrategy``: a 2-D mesh (``data_parallel`` × ``tensor_parallel``) that the module
parallelizes itself, in ``configure_model``, with torch's own APIs (Lightning's contract)::

    class Model(TrainModule):
        def configure_model(self):
            parallelize_module(self.model, self.device_mesh["tensor_parallel"], plan)
            fully_shard(self.model, mesh=self.device_mesh["data_parallel"])

    Trainer(strategy=ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=2))

The strategy builds the mesh, loads each batch once per tensor-parallel group (data sharded over
``data_parallel``), reduces metrics over ``data_parallel`` only, materializes a model built on the meta device, and
saves sharded checkpoints (`torch.distributed.checkpoint`, reshardable onto any mesh). For the common cases without
writing ``configure_model``, `FSDPStrategy(parallel_dims=ParallelDims(...))` applies the plan and sharding itself.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn

from strategies.base import Strategy, materialize_if_empty
from strategies.environment import ClusterEnvironment, detect_environment
from strategies.fsdp import FSDPStrategy
from strategies.mesh import ParallelDims
from strategies.pipeline import PipelineConfig
from strategies.precision import TRUE_PRECISION_MODES, normalize_precision
from strategies.process_group import join_process_group


class ModelParallelStrategy(FSDPStrategy):
    """Lightning's ``ModelParallelStrategy`` (see the module docstring).

    Args:
        data_parallel_size: processes that see different data (``"auto"``: the number of machines).
        tensor_parallel_size: processes that split each layer (``"auto"``: the processes of one machine).
        save_distributed_checkpoint: True: sharded checkpoints (they load onto any mesh). False (one consolidated
            file) is refused for now.
        process_group_backend: ``"gloo"``/``"nccl"``; chosen from the device when None.
        timeout: process-group timeout in seconds.
        pipeline_parallel_size: processes of the pipeline stages (the outermost dimension); with more than 1 the
            strategy splits the module into stages itself (`strategies.pipeline`: ``pipeline`` says how, default 1F1B)
            and splits and shards each stage over the other dimensions, so ``configure_model`` must not parallelize it;
            ``"auto"`` tensor parallelism is then 1. The training step runs through ``self.pipeline_step``.
        pipeline: a `strategies.PipelineConfig` (with ``pipeline_parallel_size > 1`` only).
        cpu, precision, cluster: as for `FSDPStrategy` (mixed precision is the module's ``MixedPrecisionPolicy``,
            given to its own ``fully_shard`` calls; true precisions convert the module).
    """

    name = "model_parallel"

    def __init__(
        self,
        data_parallel_size: int | str = "auto",
        tensor_parallel_size: int | str = "auto",
        save_distributed_checkpoint: bool = True,
        process_group_backend: str | None = None,
        timeout: float | None = None,
        pipeline_parallel_size: int = 1,
        pipeline: PipelineConfig | None = None,
        *,
        cpu: bool = False,
        precision: str = "no",
        cluster: ClusterEnvironment | None = None,
    ) -> None:
        if save_distributed_checkpoint is not True:
            raise NotImplementedError(
                "ModelParallelStrategy(save_distributed_checkpoint=False) is not available: checkpoints of a model the module "
                "parallelized itself are saved sharded (torch.distributed.checkpoint; they load onto any mesh, and "
                "TrainModule.load_from_checkpoint reads them into a plain model). Leave it True"
            )
        mode = normalize_precision(precision)
        if mode not in ("no", *TRUE_PRECISION_MODES):
            raise ValueError(
                f"ModelParallelStrategy(precision={precision!r}): the module shards itself in configure_model, so mixed precision "
                "is its own fully_shard(..., mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16)); pass precision "
                "'32-true' or a true precision ('bf16-true') here"
            )
        cluster = detect_environment() if cluster is None else cluster
        world = cluster.world_size
        pp = _size("pipeline_parallel_size", pipeline_parallel_size)
        auto_tp = cluster.local_world_size if pp == 1 else 1
        tp = _size("tensor_parallel_size", auto_tp if tensor_parallel_size == "auto" else tensor_parallel_size)
        dp = _size("data_parallel_size", max(world // (tp * pp), 1) if data_parallel_size == "auto" else data_parallel_size)
        if dp * tp * pp != world:
            raise ValueError(
                f"ModelParallelStrategy: data_parallel_size={dp} × tensor_parallel_size={tp}"
                f"{f' × pipeline_parallel_size={pp}' if pp > 1 else ''} = {dp * tp * pp}, but there are {world} "
                "processes; choose sizes whose product is the number of processes"
            )
        super().__init__(cluster=cluster, cpu=cpu, precision=mode, timeout=timeout, backend=process_group_backend,
                         parallel_dims=ParallelDims(world_size=world, dp_shard=dp, tp=tp, pp=pp), pipeline=pipeline)
        self.data_parallel_size_arg, self.tensor_parallel_size_arg = dp, tp

    def setup_environment(self) -> None:
        if self.dims.pp_enabled:  # the strategy's own mesh, ("pp", "dp_replicate", "dp_shard", "tp"), as FSDPStrategy's
            FSDPStrategy.setup_environment(self)
            return
        self._owns_group = join_process_group(self.cluster, self.device, self.backend, self.timeout, self.teardown)
        self.device_mesh = self.dims.build_mesh(self.device.type, lightning_names=True, timeout=self.timeout)
        self.mesh = self.dims.fsdp_mesh(self.device_mesh)
        self.data_parallel_group = self.dims.data_parallel_mesh(self.device_mesh).get_group()

    def module_init_context(self, empty_init: bool | None = None) -> AbstractContextManager[Any]:
        """Lightning's: the meta device only when ``empty_init=True`` (``configure_model`` then parallelizes an empty
        model and each process materializes its shards); else the device, so a model built in ``__init__`` keeps its weights."""
        return Strategy.module_init_context(self, empty_init=empty_init)

    def setup_module(self, module: nn.Module, *, move: bool = True, wrap: bool = True) -> nn.Module:
        """The module parallelized itself in ``configure_model``; here it is checked, converted (true precision) and, if
        built on the meta device, materialized shard by shard. With pipeline stages the strategy splits and shards it."""
        if self.pipeline is not None:
            if _has_dtensors(module):
                raise ValueError(
                    "ModelParallelStrategy(pipeline_parallel_size>1) splits the module into pipeline stages and then parallelizes "
                    "each stage itself; configure_model must not parallelize it (remove its parallelize_module/fully_shard calls)"
                )
            return FSDPStrategy.setup_module(self, module, move=move, wrap=wrap)
        module = self.precision.convert_parameters(module)
        if wrap and not _has_dtensors(module):
            raise RuntimeError(
                "ModelParallelStrategy: the module has no parallelized (DTensor) parameters; apply parallelism in "
                "configure_model with self.device_mesh, e.g. parallelize_module(self.model, self.device_mesh['tensor_parallel'], "
                "plan) and fully_shard(self.model, mesh=self.device_mesh['data_parallel']) (Lightning's contract), or use "
                "FSDPStrategy(parallel_dims=ParallelDims(dp_shard=..., tp=...)), which does it for you"
            )
        before = list(module.named_parameters(remove_duplicate=False))
        materialize_if_empty(self, module, torch.device("cpu") if self.cpu_offload else self.device)
        if not _has_dtensors(module) and move:
            module = module.to(self.device)
        self.remember_replaced(before, module)
        return module

    def __repr__(self) -> str:
        pp = f", pipeline_parallel_size={self.dims.pp}" if self.dims.pp_enabled else ""
        return f"ModelParallelStrategy(data_parallel_size={self.dims.dp_shard}, tensor_parallel_size={self.dims.tp}{pp}, device={self.device})"


def _size(name: str, size: Any) -> int:
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"ModelParallelStrategy({name}={size!r}) must be 'auto' or an int >= 1")
    return size


def _has_dtensors(module: nn.Module) -> bool:
    return any(type(p).__name__ == "DTensor" for p in module.parameters())
