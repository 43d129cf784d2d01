"""Fully sharded data parallel with FSDP2 (`torch.distributed.fsdp.fully_shard`).

Each process holds one shard of every parameter, gradient and optimizer state; a module's full
parameters exist only during its forward and backward. Sharding is a plain function, `apply_fsdp`,
that the strategy calls on the module in place (torchtitan's style), so a user can also shard a
model by hand and pass it in.

    accelerator = Accelerator(strategy="fsdp", mixed_precision="bf16")
    trainer = Trainer(strategy=FSDPStrategy(wrap_classes=[Block], reshard_after_forward=False))

FSDP1 (`FullyShardedDataParallel`) is not supported: its full-state-dict and optimizer checkpoint
paths are unreliable, and FSDP2 replaces it upstream.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist
from torch import nn

from strategies import checkpoint_io, fp8
from strategies import checkpoint_store as store
from strategies.abilities import Float8AllGather
from strategies.activation_checkpointing import Policy, apply_activation_checkpointing, check_policy
from strategies.base import Strategy, best_device, materialize_if_empty, repoint_optimizer
from strategies.blocks import find_blocks
from strategies.checkpoint_staging import Staging
from strategies.checkpoint_store import Write
from strategies.environment import ClusterEnvironment, detect_environment, process_group_timeout
from strategies.materialize import allocate_empty, full_state, has_meta_tensors, scatter_from_rank0, to_meta
from strategies.mesh import ParallelDims
from strategies.pipeline import Pipeline, PipelineConfig
from strategies.precision import FSDPPrecision
from strategies.process_group import join_process_group, leave_process_group
from strategies.tensor_parallel import apply_tensor_parallel

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

NO_SPLIT_MODULES = "<the model's _no_split_modules>"  # in wrap_classes: the block classes a Hugging Face model names


def apply_fsdp(
    model: nn.Module,
    mesh: DeviceMesh | None,
    *,
    wrap_classes: Iterable[type[nn.Module] | str] | None = None,
    min_num_params: int | None = None,
    reshard_after_forward: bool = True,
    mp_policy: Any = None,
    cpu_offload: bool = False,
) -> nn.Module:
    """Shard `model` in place with `fully_shard`: the chosen submodules first, then the root.

    Args:
        model: the module to shard (its parameters are replaced by sharded DTensor parameters).
        mesh: the 1-D `DeviceMesh` of the data-parallel processes.
        wrap_classes: submodule classes (or class names) that get their own FSDP unit, e.g. transformer blocks.
            None (with no `min_num_params`): the model's repeated blocks (`strategies.blocks.find_blocks`: a
            ``transformers`` model's ``_no_split_modules``, else the longest list of same-class modules), or the root
            alone when it has none; ``()``: the root alone.
        min_num_params: also give an FSDP unit to every submodule holding at least this many parameters
            not already in a unit below it.
        reshard_after_forward: free the gathered parameters after forward (less memory, one more all-gather in backward).
        mp_policy: a `MixedPrecisionPolicy`, or None for full precision.
        cpu_offload: keep parameter shards, gradients and optimizer states in CPU memory.
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    kwargs: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": reshard_after_forward}
    root_kwargs = dict(kwargs)
    if mp_policy is not None:
        # the units inside hand their outputs on in the compute dtype; only the root casts the model's output
        kwargs["mp_policy"] = dataclasses.replace(mp_policy, output_dtype=None)
        root_kwargs["mp_policy"] = mp_policy
    if cpu_offload:
        kwargs["offload_policy"] = root_kwargs["offload_policy"] = CPUOffloadPolicy()
    if wrap_classes is None:
        wrap_classes = find_blocks(model).classes if min_num_params is None else ()
    wrap_classes = _resolve_no_split(model, tuple(wrap_classes))
    classes = tuple(c for c in wrap_classes if isinstance(c, type))
    names = {c for c in wrap_classes if isinstance(c, str)}
    sharded: set[int] = set()
    for sub in reversed(list(model.modules())):  # children before their parents
        if sub is model:
            continue
        by_class = isinstance(sub, classes) or type(sub).__name__ in names
        by_size = min_num_params is not None and _unsharded_params(sub, sharded) >= min_num_params
        if by_class or by_size:
            fully_shard(sub, **kwargs)
            sharded.update(id(m) for m in sub.modules())
    fully_shard(model, **root_kwargs)
    return model


def _resolve_no_split(model: nn.Module, wrap_classes: tuple[Any, ...]) -> tuple[Any, ...]:
    if NO_SPLIT_MODULES not in wrap_classes:
        return wrap_classes
    names = getattr(model, "_no_split_modules", None)
    if not names:
        raise ValueError(
            f"auto_wrap_policy='transformer_based_wrap' without transformer_cls_names_to_wrap needs a model that names its "
            f"blocks in _no_split_modules (Hugging Face models do); {type(model).__name__} has none. Pass "
            "transformer_cls_names_to_wrap=['MyBlock']"
        )
    return tuple(c for c in wrap_classes if c != NO_SPLIT_MODULES) + tuple(names)


def _unsharded_params(module: nn.Module, sharded: set[int]) -> int:
    """Parameters of `module` outside the FSDP units already made below it."""
    total = 0
    for sub in module.modules():
        if id(sub) not in sharded:
            total += sum(p.numel() for p in sub.parameters(recurse=False))
    return total


def is_fsdp1(module: nn.Module) -> bool:
    return any(type(m).__name__ == "FullyShardedDataParallel" for m in module.modules())


class FSDPStrategy(Strategy, Float8AllGather):
    """Shards parameters, gradients and optimizer states across processes with FSDP2.

    Args:
        cluster: the process layout (detected from the environment by default).
        cpu: force CPU (gloo) even when GPUs are present.
        precision: ``"no"``, ``"bf16"`` (bf16 parameters in compute, float32 gradient reduction), ``"fp16"``
            (the same with a `ShardedGradScaler`), or a true mode (``"bf16-true"``, ``"fp16-true"``, ``"fp64-true"``:
            the module is converted before sharding, so shards, gradients and optimizer states are in that dtype).
        timeout: process-group timeout in seconds (as for DDP).
        wrap_classes: submodule classes (or names) that get their own FSDP unit; by default the model's repeated
            blocks (a ``transformers`` model's ``_no_split_modules``), then the root; ``()`` shards the root alone.
            See `apply_fsdp`.
        min_num_params: also shard submodules holding this many parameters; see `apply_fsdp`.
        reshard_after_forward: free gathered parameters after forward; see `apply_fsdp`.
        cpu_offload: keep shards, gradients and optimizer states in CPU memory.
        backend: ``"gloo"``/``"nccl"``; chosen from the device when None.
        activation_checkpointing_policy: submodule classes (or names, or a ``module -> bool`` function) whose forward
            is recomputed in backward instead of keeping its activations (`apply_activation_checkpointing`, before
            sharding). ``activation_checkpointing`` is Lightning's older name for it.
        auto_wrap_policy: Lightning's name for `wrap_classes` (a set of block classes).
        cpu_ram_efficient_loading: fill every process's shards from process 0's weights (a scatter: each process
            receives only its slices). Process 0 may then build the model with its real weights and the others on the
            meta device (``trainer.init_empty_weights()``), so only one process ever holds the full model.
        mixed_precision_policy: an explicit `torch.distributed.fsdp.MixedPrecisionPolicy` (instead of the one
            `precision` implies; e.g. fp32 master shards with bf16 compute and bf16 gradient reduction).
        parallel_dims: a `strategies.mesh.ParallelDims` (``dp_replicate``, ``dp_shard``, ``tp``) for an N-D mesh: HSDP
            (sharded inside a ``dp_shard`` group, replicated across ``dp_replicate``) and tensor parallelism (layers
            split over ``tp`` by `tp_plan`, before activation checkpointing and sharding: torchtitan's order). Default:
            every process shards (``dp_shard=-1``).
        tp_plan: with ``tp > 1``, submodule names → parallel styles (`strategies.tensor_parallel`); None: the model's
            own plan (`transformers` models carry one).
        device_mesh: Lightning's HSDP spelling, ``(replicas, shards)``: the same as
            ``parallel_dims=ParallelDims(dp_replicate=replicas, dp_shard=shards)``.
        pipeline: with ``parallel_dims.pp > 1``, how the model is split into pipeline stages and scheduled
            (`strategies.pipeline.PipelineConfig`; default: 1F1B, one stage per process). Each stage's module is then
            split over ``tp`` and sharded over the data-parallel dimensions (``reshard_after_forward=False``, as
            torchtitan does under pipeline stages). The training step runs through ``pipeline_step``.
        **unsupported: refused with a `TypeError` naming the supported arguments.
    """

    name = "fsdp"
    precision_class = FSDPPrecision
    precision: FSDPPrecision
    sharded = True

    def __init__(
        self,
        *,
        cluster: ClusterEnvironment | None = None,
        cpu: bool = False,
        precision: str = "no",
        timeout: float | None = None,
        wrap_classes: Iterable[type[nn.Module] | str] | None = None,
        min_num_params: int | None = None,
        reshard_after_forward: bool = True,
        cpu_offload: bool = False,
        backend: str | None = None,
        activation_checkpointing_policy: Policy | None = None,
        activation_checkpointing: Policy | None = None,
        auto_wrap_policy: Iterable[type[nn.Module] | str] | None = None,
        cpu_ram_efficient_loading: bool = False,
        mixed_precision_policy: Any = None,
        parallel_dims: ParallelDims | None = None,
        tp_plan: Mapping[str, Any] | None = None,
        device_mesh: tuple[int, int] | None = None,
        pipeline: PipelineConfig | None = None,
        **unsupported: Any,
    ) -> None:
        if unsupported:
            raise TypeError(
                f"FSDPStrategy got unsupported arguments {sorted(unsupported)}; it takes wrap_classes (auto_wrap_policy), "
                "min_num_params, reshard_after_forward, cpu_offload, activation_checkpointing_policy, cpu_ram_efficient_loading, "
                "mixed_precision_policy, parallel_dims, tp_plan, device_mesh, pipeline, precision, cpu, timeout, backend"
            )
        if activation_checkpointing is not None and activation_checkpointing_policy is not None:
            raise ValueError("pass activation_checkpointing_policy or activation_checkpointing (its older name), not both")
        if auto_wrap_policy is not None:
            if wrap_classes:
                raise ValueError("pass wrap_classes or auto_wrap_policy (Lightning's name for it), not both")
            if callable(auto_wrap_policy) and not isinstance(auto_wrap_policy, type):
                raise TypeError(
                    f"auto_wrap_policy={auto_wrap_policy!r}: FSDP2 takes the block classes to shard, not FSDP1's policy functions; "
                    "pass a set of module classes, e.g. auto_wrap_policy={TransformerBlock}"
                )
            given: Any = (auto_wrap_policy,) if isinstance(auto_wrap_policy, type) else auto_wrap_policy
            wrap_classes = tuple(given)
        wrap_classes = None if wrap_classes is None else tuple(wrap_classes)
        if not dist.is_available():
            raise RuntimeError("strategy='fsdp' needs torch.distributed, which this torch build lacks; use strategy='single'")
        if min_num_params is not None and (isinstance(min_num_params, bool) or not isinstance(min_num_params, int) or min_num_params < 1):
            raise ValueError(f"min_num_params={min_num_params!r} must be a positive int or None")
        bad = [c for c in wrap_classes or () if not (isinstance(c, str) or (isinstance(c, type) and issubclass(c, nn.Module)))]
        if bad:
            raise TypeError(f"wrap_classes must hold nn.Module subclasses or class names, got {bad!r}")
        cluster = detect_environment() if cluster is None else cluster
        device = best_device(cpu=cpu, local_rank=cluster.local_rank, assigned=cluster.device)
        super().__init__(cluster=cluster, device=device, precision=precision)
        self.backend = backend or ("nccl" if device.type == "cuda" else "gloo")
        self.timeout: float = process_group_timeout(timeout)
        self.wrap_classes = wrap_classes
        self.min_num_params = min_num_params
        self.reshard_after_forward = bool(reshard_after_forward)
        self.cpu_offload = bool(cpu_offload)
        self.activation_checkpointing = check_policy(
            activation_checkpointing if activation_checkpointing is not None else activation_checkpointing_policy
        )
        self.cpu_ram_efficient_loading = bool(cpu_ram_efficient_loading)
        if mixed_precision_policy is not None:
            _check_policy(mixed_precision_policy)
            self.configure_precision(dataclasses.replace(self.precision.settings, policy=mixed_precision_policy))
        self.dims = _parallel_dims(parallel_dims, device_mesh, cluster.world_size)
        if tp_plan is not None and not self.dims.tp_enabled:
            raise ValueError(f"tp_plan was given but tp=1 ({self.dims}); pass parallel_dims=ParallelDims(tp=...) too, or leave tp_plan out")
        if self.dims.n_d and self.cpu_ram_efficient_loading:
            raise NotImplementedError(
                f"cpu_ram_efficient_loading with an N-D mesh ({self.dims}) is not available yet; build the model on every "
                "process (or on the meta device everywhere: it is then initialized shard by shard)"
            )
        self.tp_plan = tp_plan
        self.pipeline_config = _pipeline_config(pipeline, self.dims)
        self.mesh: Any = None  # what fully_shard shards over
        self.device_mesh: Any = None  # the whole mesh (named dimensions: strategies.mesh)
        self._owns_group = False
        self._pipeline_held: set[int] | None = None  # ids of the parameters this process's pipeline stages hold

    def setup_environment(self) -> None:
        self._owns_group = join_process_group(self.cluster, self.device, self.backend, self.timeout, self.teardown)
        self.device_mesh = self.dims.build_mesh(self.device.type, timeout=self.timeout)
        self.mesh = self.dims.fsdp_mesh(self.device_mesh)
        if self.dims.tp_enabled or self.dims.pp_enabled:
            self.data_parallel_group = self.dims.data_parallel_mesh(self.device_mesh).get_group()
        if self.pipeline_config is not None:
            self.pipeline = Pipeline(self.pipeline_config, group=self.device_mesh["pp"].get_group(), device=self.device,
                                     pp_rank=self.dims.coordinates(self.rank)["pp"], pp_size=self.dims.pp)

    @property
    def data_parallel_rank(self) -> int:
        return self.dims.coordinates(self.rank)["dp"]

    @property
    def data_parallel_size(self) -> int:
        return self.dims.dp_size

    @property
    def repeats_batches(self) -> bool:
        where = self.dims.coordinates(self.rank)
        return where["tp"] > 0 or where["pp"] > 0

    def module_init_context(self, empty_init: bool | None = None) -> AbstractContextManager[Any]:
        """Build on the meta device (unless ``empty_init=False``): `setup_module` shards the empty model, then each
        process allocates and initializes only its shards (`strategies.materialize`)."""
        return super().module_init_context(empty_init=empty_init is not False)

    def setup_module(self, module: nn.Module, *, move: bool = True, wrap: bool = True) -> nn.Module:
        from torch.distributed.fsdp import FSDPModule

        if is_fsdp1(module):
            raise TypeError(
                "FSDP1 (torch.distributed.fsdp.FullyShardedDataParallel) is not supported; pass the plain module and "
                "use strategy='fsdp', which shards it with FSDP2 (torch.distributed.fsdp.fully_shard)"
            )
        if isinstance(module, FSDPModule):
            return module  # sharded by hand: placed and typed by the user
        module = self.precision.convert_parameters(module)  # true precision: the shards are made in that dtype
        if self.pipeline is not None and wrap:
            return self._setup_pipelined(module, self.pipeline, move)
        if not wrap:
            materialize_if_empty(self, module)
            return module.to(self.device) if move else module
        empty = has_meta_tensors(module)
        before = list(module.named_parameters(remove_duplicate=False))  # (an optimizer built on these is re-pointed)
        from_rank0, source = self._rank0_source(module, empty)
        if from_rank0 and not empty:  # process 0's real weights stay on its CPU (in `source`) until sliced out
            module, empty = to_meta(module), True
        target = torch.device("cpu") if self.cpu_offload else self.device
        if move and not empty:
            module = module.to(target)
        if self.dims.tp_enabled:  # tensor parallel first, then activation checkpointing, then sharding (torchtitan's order)
            apply_tensor_parallel(module, self.device_mesh["tp"], self.tp_plan)
        if self.activation_checkpointing is not None:
            policy = self.activation_checkpointing
            policy = _resolve_no_split(module, tuple(policy)) if not callable(policy) else policy
            apply_activation_checkpointing(module, policy)
        apply_fsdp(
            module,
            self.mesh,
            wrap_classes=self.wrap_classes,
            min_num_params=self.min_num_params,
            reshard_after_forward=self.reshard_after_forward,
            mp_policy=self.precision.mp_policy(),
            cpu_offload=self.cpu_offload,
        )
        if from_rank0:  # every process allocates its shards; process 0 sends each its slices
            allocate_empty(module, target)
            scatter_from_rank0(module, source, rank=self.rank, group=self.mesh.get_group())
        elif empty:  # built empty everywhere: each process initializes its own shards
            materialize_if_empty(self, module, target)
        self.remember_replaced(before, module)
        return module

    def _setup_pipelined(self, module: nn.Module, pipeline: Pipeline, move: bool) -> nn.Module:
        """Split `module` into this process's pipeline stages; each stage's module is split over ``tp``, checkpointed
        and sharded over the data-parallel dimensions (each its own FSDP root, as torchtitan shards each model part)."""
        if self.pipeline is not None and self.pipeline.stages:
            raise RuntimeError("this FSDPStrategy's pipeline is set up already; one strategy sets up one pipelined model")
        empty = has_meta_tensors(module)
        before = list(module.named_parameters(remove_duplicate=False))
        target = torch.device("cpu") if self.cpu_offload else self.device

        def shard(part: nn.Module) -> nn.Module:
            if move and not empty:
                part.to(target)
            if self.dims.tp_enabled:
                apply_tensor_parallel(part, self.device_mesh["tp"], self.tp_plan)
            if self.activation_checkpointing is not None:
                policy = self.activation_checkpointing
                apply_activation_checkpointing(part, _resolve_no_split(part, tuple(policy)) if not callable(policy) else policy)
            if self.dims.dp_size > 1:
                apply_fsdp(part, self.mesh, wrap_classes=self.wrap_classes, min_num_params=self.min_num_params,
                           reshard_after_forward=False, mp_policy=self.precision.mp_policy(), cpu_offload=self.cpu_offload)
            return part

        module = pipeline.setup(module, shard)
        if empty:
            materialize_if_empty(self, module, target)
        self.remember_replaced(before, module)
        self._pipeline_held = {id(p) for p in module.parameters()}
        return module

    def _rank0_source(self, module: nn.Module, empty: bool) -> tuple[bool, dict[str, torch.Tensor] | None]:
        """Whether process 0's weights fill every process's shards, and (on process 0) its full state.

        So when process 0 built the model with real weights and the others on the meta device (Accelerate's
        ``cpu_ram_efficient_loading``), or when ``cpu_ram_efficient_loading=True`` asks for process 0's weights anyway.
        """
        if not self.is_distributed:
            return False, None
        built_empty = self.all_gather_object(empty)
        if all(built_empty) or (not any(built_empty) and not self.cpu_ram_efficient_loading):
            return False, None
        if built_empty[0]:
            real = [rank for rank, e in enumerate(built_empty) if not e]
            raise ValueError(
                f"process 0 built the model on the meta device but processes {real} built it with real weights; with "
                "cpu_ram_efficient_loading, process 0 loads the real weights and the others build empty "
                "(`with trainer.init_empty_weights(): model = ...` when not accelerator.is_main_process)"
            )
        return True, (full_state(module) if self.rank == 0 else None)

    def setup_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        optimizer = repoint_optimizer(self, optimizer, "FSDP cannot move its state onto the shards")
        if self.pipeline is not None:  # an optimizer built on the whole model steps this process's stages' parameters
            held = self._pipeline_held
            if held is None:
                raise ValueError("with pipeline stages, prepare (set up) the model before its optimizer, or both in one call")
            for group in optimizer.param_groups:
                group["params"] = [p for p in group["params"] if id(p) in held]
            return optimizer
        plain = [p for group in optimizer.param_groups for p in group["params"] if type(p).__name__ != "DTensor"]
        if plain:  # no prepared model holds them: they would be neither sharded nor synchronized across the processes
            raise ValueError(
                f"this optimizer steps {len(plain)} parameters that no model prepared with strategy='fsdp' holds (of shapes "
                f"{[tuple(p.shape) for p in plain[:3]]}...): it was built on another model object, or before its model was "
                "prepared in a separate prepare() call. Build the optimizer on the model you pass to prepare(), and prepare the "
                "model first (or both in one call)"
            )
        return optimizer

    def redirects_forward(self, wrapped: nn.Module, module: nn.Module) -> bool:
        return self.pipeline is None  # fully_shard works in place: the root's pre-forward unshard runs only through __call__

    def no_sync(self, module: nn.Module) -> AbstractContextManager[Any]:
        return _without_gradient_sync(module)

    @contextlib.contextmanager
    def trigger_sync_in_backward(self, module: nn.Module) -> Iterator[None]:
        """FSDP reduces in backward hooks: turning the sync back on for the block is enough."""
        from torch.distributed.fsdp import FSDPModule

        if not isinstance(module, FSDPModule):
            yield
            return
        module.set_requires_gradient_sync(True)
        try:
            yield
        finally:
            module.set_requires_gradient_sync(not getattr(module, "_trainwright_sync_off", False))

    def gathered_parameters(self, module: nn.Module) -> AbstractContextManager[Any]:
        return _unsharded(module, self.reshard_after_forward)

    def module_state_dict(self, module: nn.Module) -> dict[str, torch.Tensor]:
        """The full (unsharded) state dict on CPU, on rank 0; other ranks get ``{}``. Every rank must call it."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        if self.pipeline is not None:
            return self._pipelined_state_dict(module, self.pipeline)
        state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return cast(dict[str, torch.Tensor], state)

    def _pipelined_state_dict(self, module: nn.Module, pipeline: Pipeline) -> dict[str, torch.Tensor]:
        """Every stage's full weights, gathered on process 0 (each pipeline's first data-parallel process sends its own)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        full: dict[str, Any] = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True))
        own = {key: value.detach().cpu() for key, value in full.items()}
        first = pipeline.pp_rank == 0  # (every pipeline gathers; process 0's is the one returned)
        gathered: list[Any] = [None] * pipeline.pp_size
        dist.gather_object(own, gathered if first else None, group=pipeline.group, group_dst=0)
        if self.rank != 0:
            return {}
        return {key: value for part in gathered for key, value in part.items()}

    def load_module_state_dict(self, module: nn.Module, state: dict[str, torch.Tensor], strict: bool = True) -> None:
        """Load a full state dict (the same on every rank) into the shards. Every rank must call it."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        values: Any = state
        if self.pipeline is not None:  # this process's stages take their own layers' weights
            own = set(module.state_dict())
            values = {key: value for key, value in state.items() if key in own}
        set_model_state_dict(module, values, options=StateDictOptions(full_state_dict=True, strict=strict))

    def collect_checkpoint(self, models: list[nn.Module], optimizers: list[torch.optim.Optimizer], staging: Staging | None) -> Write:
        """Every process writes its own shards (``sharded/__<rank>_0.distcp``, `torch.distributed.checkpoint`), hashing
        them as it writes them; nothing is gathered. Staged, only this process's shards are copied."""
        state = checkpoint_io.sharded_state(models, optimizers, flatten=self.pipeline is not None)
        if staging is not None:
            state = staging.copy("sharded", state)
        return lambda writer: writer.save_dcp(store.SHARDED_DIR, state)

    def load_checkpoint(
        self, reader: checkpoint_io.CheckpointReader | os.PathLike[str] | str, models: list[nn.Module],
        optimizers: list[torch.optim.Optimizer], *, strict: bool = True,
    ) -> None:
        path = reader.directory if isinstance(reader, checkpoint_io.CheckpointReader) else reader
        if not checkpoint_io.is_sharded(Path(path)) and optimizers:
            raise ValueError(
                f"checkpoint {str(path)!r} holds full (unsharded) optimizer states, written by a non-sharded strategy; "
                "strategy='fsdp' loads only sharded ones. Resume it with the strategy that wrote it, or load its "
                "weights alone (TrainModule.load_from_checkpoint, or strategies.checkpoint_io.load_weights(directory, model))"
            )
        super().load_checkpoint(reader, models, optimizers, strict=strict)

    def precompute_float8_scales_after_step(self, optimizer: torch.optim.Optimizer, module: nn.Module) -> None:
        fp8.precompute_scales_after_step(optimizer, module)

    def teardown(self) -> None:
        leave_process_group(self._owns_group)
        self._owns_group = False


def _parallel_dims(dims: ParallelDims | None, device_mesh: tuple[int, int] | None, world_size: int) -> ParallelDims:
    if dims is not None and device_mesh is not None:
        raise ValueError("pass parallel_dims or device_mesh (Lightning's HSDP shorthand), not both")
    if device_mesh is not None:
        if not (isinstance(device_mesh, tuple) and len(device_mesh) == 2 and all(isinstance(n, int) for n in device_mesh)):
            raise TypeError(f"device_mesh={device_mesh!r} must be a tuple (replicas, shards), e.g. (2, 4) for HSDP on 8 processes")
        return ParallelDims(world_size=world_size, dp_replicate=device_mesh[0], dp_shard=device_mesh[1])
    if dims is None:
        return ParallelDims(world_size=world_size)
    if not isinstance(dims, ParallelDims):
        raise TypeError(f"parallel_dims={dims!r} must be a strategies.mesh.ParallelDims")
    if dims.world_size != world_size:
        raise ValueError(f"parallel_dims is for {dims.world_size} processes ({dims}), but this run has {world_size}")
    return dims


def _pipeline_config(config: PipelineConfig | None, dims: ParallelDims) -> PipelineConfig | None:
    if config is not None and not isinstance(config, PipelineConfig):
        raise TypeError(f"pipeline={config!r} must be a strategies.PipelineConfig")
    if config is not None and not dims.pp_enabled:
        raise ValueError(f"pipeline={config!r} was given but pp=1 ({dims}); pass parallel_dims=ParallelDims(pp=2, ...) too, or leave pipeline out")
    if dims.pp_enabled:
        return config if config is not None else PipelineConfig()
    return None


def _check_policy(policy: Any) -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if not isinstance(policy, MixedPrecisionPolicy):
        raise TypeError(
            f"mixed_precision_policy={policy!r} must be a torch.distributed.fsdp.MixedPrecisionPolicy, e.g. "
            "MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)"
        )


@contextlib.contextmanager
def _without_gradient_sync(module: nn.Module) -> Iterator[None]:
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(module, FSDPModule):
        yield
        return
    module.set_requires_gradient_sync(False)
    module.__dict__["_trainwright_sync_off"] = True  # read by trigger_sync_in_backward
    try:
        yield
    finally:
        module.__dict__["_trainwright_sync_off"] = False
        module.set_requires_gradient_sync(True)


def weights_view(module: nn.Module) -> nn.Module:
    """`module`'s own parameters and buffers (not copies) in plain `nn.Module` containers of the same names and
    order, tied tensors still tied. An FSDP module refuses ``deepcopy``; this view can be deep-copied, and under FSDP
    the copy's parameters are DTensor shards with the module's placements (`torch.optim.swa_utils.AveragedModel` of
    it averages shard by shard). It has no forward: it holds weights only.
    """
    reshard(module)  # (its parameters are the shards)
    holders: dict[nn.Module, nn.Module] = {}
    for name, sub in module.named_modules(remove_duplicate=False):
        holder = holders.setdefault(sub, nn.Module())
        if name:
            parent, _, child = name.rpartition(".")
            holders[module.get_submodule(parent)].add_module(child, holder)
        for key, param in sub._parameters.items():
            holder.register_parameter(key, param)
        for key, buf in sub._buffers.items():
            holder.register_buffer(key, buf, persistent=key not in sub._non_persistent_buffers_set)
    return holders[module]


def reshard(module: nn.Module) -> None:
    """Free the gathered parameters of every FSDP unit of `module` (no collective), so that its parameters are its
    shards again and its next forward gathers them afresh; a no-op for an unsharded module."""
    from torch.distributed.fsdp import FSDPModule

    for unit in module.modules():
        if isinstance(unit, FSDPModule):
            unit.reshard()


@contextlib.contextmanager
def _unsharded(module: nn.Module, reshard_after_forward: bool) -> Iterator[None]:
    """All-gather every FSDP unit of `module` once (a collective), keep the full parameters through the block, reshard after.

    Afterwards every unit reshards after forward as `reshard_after_forward` says (what `apply_fsdp` set).
    """
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in module.modules() if isinstance(m, FSDPModule)]
    for unit in units:
        unit.unshard()
        unit.set_reshard_after_forward(False, recurse=False)
    try:
        yield
    finally:
        for unit in units:
            unit.reshard()
            unit.set_reshard_after_forward(reshard_after_forward, recurse=False)
