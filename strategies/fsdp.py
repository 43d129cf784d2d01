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
import weakref
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager
from typing import Any, cast

import torch
import torch.distributed as dist
from torch import nn

from strategies import checkpoint_io
from strategies.base import Strategy, best_device
from strategies.environment import ClusterEnvironment, detect_environment, process_group_timeout
from strategies.precision import FSDPPrecision
from strategies.process_group import join_process_group, leave_process_group


def apply_fsdp(
    model: nn.Module,
    mesh: Any,
    *,
    wrap_classes: Iterable[type[nn.Module] | str] = (),
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
        min_num_params: also give an FSDP unit to every submodule holding at least this many parameters
            not already in a unit below it.
        reshard_after_forward: free the gathered parameters after forward (less memory, one more all-gather in backward).
        mp_policy: a `MixedPrecisionPolicy`, or None for full precision.
        cpu_offload: keep parameter shards, gradients and optimizer states in CPU memory.
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    kwargs: dict[str, Any] = {"mesh": mesh, "reshard_after_forward": reshard_after_forward}
    if mp_policy is not None:
        kwargs["mp_policy"] = mp_policy
    if cpu_offload:
        kwargs["offload_policy"] = CPUOffloadPolicy()
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
    fully_shard(model, **kwargs)
    return model


def _unsharded_params(module: nn.Module, sharded: set[int]) -> int:
    """Parameters of `module` outside the FSDP units already made below it."""
    total = 0
    for sub in module.modules():
        if id(sub) not in sharded:
            total += sum(p.numel() for p in sub.parameters(recurse=False))
    return total


def is_fsdp1(module: nn.Module) -> bool:
    return any(type(m).__name__ == "FullyShardedDataParallel" for m in module.modules())


class FSDPStrategy(Strategy):
    """Shards parameters, gradients and optimizer states across processes with FSDP2.

    Args:
        cluster: the process layout (detected from the environment by default).
        cpu: force CPU (gloo) even when GPUs are present.
        precision: ``"no"``, ``"bf16"`` (bf16 parameters in compute, float32 gradient reduction) or ``"fp16"``
            (the same with a `ShardedGradScaler`).
        timeout: process-group timeout in seconds (as for DDP).
        wrap_classes: submodule classes (or names) that get their own FSDP unit; see `apply_fsdp`.
        min_num_params: also shard submodules holding this many parameters; see `apply_fsdp`.
        reshard_after_forward: free gathered parameters after forward; see `apply_fsdp`.
        cpu_offload: keep shards, gradients and optimizer states in CPU memory.
        backend: ``"gloo"``/``"nccl"``; chosen from the device when None.
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
        wrap_classes: Iterable[type[nn.Module] | str] = (),
        min_num_params: int | None = None,
        reshard_after_forward: bool = True,
        cpu_offload: bool = False,
        backend: str | None = None,
        **unsupported: Any,
    ) -> None:
        if unsupported:
            raise TypeError(
                f"FSDPStrategy got unsupported arguments {sorted(unsupported)}; it takes wrap_classes, min_num_params, "
                "reshard_after_forward, cpu_offload, precision, cpu, timeout, backend"
            )
        if not dist.is_available():
            raise RuntimeError("strategy='fsdp' needs torch.distributed, which this torch build lacks; use strategy='single'")
        if min_num_params is not None and (isinstance(min_num_params, bool) or not isinstance(min_num_params, int) or min_num_params < 1):
            raise ValueError(f"min_num_params={min_num_params!r} must be a positive int or None")
        bad = [c for c in wrap_classes if not (isinstance(c, str) or (isinstance(c, type) and issubclass(c, nn.Module)))]
        if bad:
            raise TypeError(f"wrap_classes must hold nn.Module subclasses or class names, got {bad!r}")
        cluster = detect_environment() if cluster is None else cluster
        device = best_device(cpu=cpu, local_rank=cluster.local_rank)
        super().__init__(cluster=cluster, device=device, precision=precision)
        self.backend = backend or ("nccl" if device.type == "cuda" else "gloo")
        self.timeout = process_group_timeout(timeout)
        self.wrap_classes = tuple(wrap_classes)
        self.min_num_params = min_num_params
        self.reshard_after_forward = bool(reshard_after_forward)
        self.cpu_offload = bool(cpu_offload)
        self.mesh: Any = None
        self._owns_group = False
        # old parameter -> its sharded replacement, so optimizers built before prepare() step the shards
        # (tensors compare element-wise, so they are keyed by id and checked by a weak reference)
        self._replaced: dict[int, tuple[weakref.ref[torch.Tensor], nn.Parameter]] = {}

    def setup_environment(self) -> None:
        from torch.distributed.device_mesh import init_device_mesh

        self._owns_group = join_process_group(self.cluster, self.device, self.backend, self.timeout, self.teardown)
        self.mesh = init_device_mesh(self.device.type, (self.world_size,))

    def setup_module(self, module: nn.Module, *, move: bool = True, wrap: bool = True) -> nn.Module:
        from torch.distributed.fsdp import FSDPModule

        if is_fsdp1(module):
            raise TypeError(
                "FSDP1 (torch.distributed.fsdp.FullyShardedDataParallel) is not supported; pass the plain module and "
                "use strategy='fsdp', which shards it with FSDP2 (torch.distributed.fsdp.fully_shard)"
            )
        if not wrap or isinstance(module, FSDPModule):
            return module.to(self.device) if move and not isinstance(module, FSDPModule) else module
        if self.cpu_offload and move:
            module = module.cpu()
        elif move:
            module = module.to(self.device)
        before = dict(module.named_parameters(remove_duplicate=False))
        apply_fsdp(
            module,
            self.mesh,
            wrap_classes=self.wrap_classes,
            min_num_params=self.min_num_params,
            reshard_after_forward=self.reshard_after_forward,
            mp_policy=self.precision.mp_policy(),
            cpu_offload=self.cpu_offload,
        )
        for name, new in module.named_parameters(remove_duplicate=False):
            old = before.get(name)
            if old is not None and old is not new:
                self._replaced[id(old)] = (weakref.ref(old), new)
        return module

    def _sharded_version(self, param: torch.Tensor) -> torch.Tensor:
        """The parameter `setup_module` put in place of `param` (`param` itself when it was not replaced)."""
        entry = self._replaced.get(id(param))
        return entry[1] if entry is not None and entry[0]() is param else param

    def setup_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        stale = [p for group in optimizer.param_groups for p in group["params"] if self._sharded_version(p) is not p]
        if stale and optimizer.state:
            raise ValueError(
                "this optimizer already took steps on the unsharded parameters; FSDP cannot move its state onto the "
                "shards. Create the optimizer before training (or after prepare(model)), then prepare it"
            )
        for group in optimizer.param_groups:
            group["params"] = [self._sharded_version(p) for p in group["params"]]
        self._replaced = {k: v for k, v in self._replaced.items() if v[0]() is not None}
        return optimizer

    def redirects_forward(self, wrapped: nn.Module, module: nn.Module) -> bool:
        return True  # fully_shard works in place: the root's pre-forward unshard runs only through __call__

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

        state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return cast(dict[str, torch.Tensor], state)

    def load_module_state_dict(self, module: nn.Module, state: dict[str, torch.Tensor], strict: bool = True) -> None:
        """Load a full state dict (the same on every rank) into the shards. Every rank must call it."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        values: Any = state
        set_model_state_dict(module, values, options=StateDictOptions(full_state_dict=True, strict=strict))

    def save_checkpoint(self, writer: Any, models: list[nn.Module], optimizers: list[torch.optim.Optimizer]) -> None:
        """Every rank writes its own shards (``sharded/__<rank>_0.distcp``, `torch.distributed.checkpoint`); nothing is gathered."""
        directory = writer.staging / checkpoint_io.SHARDED_DIR
        checkpoint_io.save_sharded(directory, models, optimizers)
        written = [f"{checkpoint_io.SHARDED_DIR}/{p.name}" for p in directory.glob(f"__{self.rank}_*.distcp")]
        writer.hash_written(written + ([f"{checkpoint_io.SHARDED_DIR}/.metadata"] if self.rank == 0 else []))

    def load_checkpoint(self, path: Any, models: list[nn.Module], optimizers: list[torch.optim.Optimizer], *, strict: bool = True) -> None:
        if not checkpoint_io.is_sharded(path) and optimizers:
            raise ValueError(
                f"checkpoint {str(path)!r} holds full (unsharded) optimizer states, written by a non-sharded strategy; "
                "strategy='fsdp' loads only sharded ones. Resume it with the strategy that wrote it, or load its "
                "weights alone (TrainModule.load_from_checkpoint, or strategies.checkpoint_io.load_weights(directory, model))"
            )
        super().load_checkpoint(path, models, optimizers, strict=strict)

    def teardown(self) -> None:
        leave_process_group(self._owns_group)
        self._owns_group = False


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
