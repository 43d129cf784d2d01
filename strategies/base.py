"""The `Strategy` interface: everything distributed that the two faces need.

A strategy owns the device, the process layout, a `Precision`, module/optimizer setup, backward, gradient
sync control, collectives and teardown. Concrete strategies subclass this class only; shared code lives in
plain functions (`strategies.collectives`).
"""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager

import torch
from torch import nn

from strategies import collectives
from strategies.environment import ClusterEnvironment
from strategies.precision import Precision


class Strategy:
    """Base class. Subclasses set ``name`` and implement `setup_environment`, `setup_module`."""

    name: str = "base"

    def __init__(self, *, cluster: ClusterEnvironment, device: torch.device, precision: str = "no") -> None:
        self.cluster = cluster
        self.device = torch.device(device)
        self.precision = Precision(precision, self.device)

    # process layout
    @property
    def world_size(self) -> int:
        return self.cluster.world_size

    @property
    def rank(self) -> int:
        return self.cluster.rank

    @property
    def local_rank(self) -> int:
        return self.cluster.local_rank

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    # setup
    def setup_environment(self) -> None:
        """Create process groups / select the device. Called once before anything else."""

    def setup_module(self, module: nn.Module) -> nn.Module:
        return module.to(self.device)

    def setup_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        return optimizer

    def unwrap_module(self, module: nn.Module) -> nn.Module:
        while hasattr(module, "module") and isinstance(module.module, nn.Module) and type(module).__name__ in _WRAPPERS:
            module = module.module
        compiled = getattr(module, "_orig_mod", None)
        return compiled if isinstance(compiled, nn.Module) else module

    # training
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        self.precision.backward(loss, **kwargs)

    def prepare_for_backward(self, module: nn.Module, output: Any) -> None:
        """Arm gradient synchronization for a backward of `output` computed outside `module`'s forward.

        Called before ``backward`` when a step ran the wrapped module's methods directly (manual
        optimization). No-op here; `DDPStrategy` prepares its reducer.
        """

    def optimizer_step(self, optimizer: torch.optim.Optimizer, **kwargs: Any) -> bool:
        return self.precision.optimizer_step(optimizer, **kwargs)

    def no_sync(self, module: nn.Module) -> ContextManager[Any]:
        """Skip gradient synchronization inside the block (gradient accumulation)."""
        return contextlib.nullcontext()

    # collectives
    def all_gather(self, data: Any) -> Any:
        return collectives.gather(data)

    def all_gather_object(self, obj: Any) -> list[Any]:
        return collectives.gather_object(obj)

    def all_reduce(self, data: Any, reduction: str = "sum") -> Any:
        return collectives.reduce(data, reduction)

    def broadcast(self, data: Any, src: int = 0) -> Any:
        return collectives.broadcast(data, src)

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        return collectives.broadcast_object(obj, src)

    def barrier(self, name: str | None = None) -> None:
        collectives.barrier()

    # checkpoints
    def module_state_dict(self, module: nn.Module) -> dict[str, torch.Tensor]:
        """The full state dict of the unwrapped module (the same on every rank)."""
        return self.unwrap_module(module).state_dict()

    def load_module_state_dict(self, module: nn.Module, state: dict[str, torch.Tensor], strict: bool = True) -> None:
        self.unwrap_module(module).load_state_dict(state, strict=strict)

    def teardown(self) -> None:
        """Release process groups and other resources."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={self.device}, world_size={self.world_size}, precision={self.precision.mode!r})"


_WRAPPERS = {"DistributedDataParallel", "DataParallel", "FullyShardedDataParallel"}


def best_device(*, cpu: bool = False, local_rank: int = 0) -> torch.device:
    """CUDA (by local rank) > MPS > CPU; ``cpu=True`` forces CPU."""
    if cpu:
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")
