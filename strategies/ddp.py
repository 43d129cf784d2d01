"""Distributed data parallel: one process per device, gloo on CPU, nccl on CUDA."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from strategies.base import Strategy, best_device, materialize_if_empty
from strategies.environment import ClusterEnvironment, detect_environment, process_group_timeout
from strategies.process_group import join_process_group, leave_process_group


class DDPStrategy(Strategy):
    """Wraps the model in `DistributedDataParallel` and owns the process group.

    Args:
        cluster: the process layout (detected from the environment by default).
        cpu: force CPU (gloo) even when GPUs are present.
        precision: ``"no"``, ``"fp16"``, ``"bf16"``, or a true mode (``"fp16-true"``, ``"bf16-true"``, ``"fp64-true"``: the
            module is converted to that dtype before DDP wraps it, so gradients are reduced in it).
        timeout: process-group timeout in seconds (default ``TRAINWRIGHT_PG_TIMEOUT`` or 300 s, far below
            gloo's 30 minutes), so a rank that never joins a collective fails the job instead of hanging it.
        backend: ``"gloo"``/``"nccl"``; chosen from the device when None.
        find_unused_parameters: passed to DDP.
        static_graph: passed to DDP.
        bucket_cap_mb: passed to DDP.
        gradient_as_bucket_view: passed to DDP.
    """

    name = "ddp"

    def __init__(
        self,
        *,
        cluster: ClusterEnvironment | None = None,
        cpu: bool = False,
        precision: str = "no",
        timeout: float | None = None,
        backend: str | None = None,
        find_unused_parameters: bool = False,
        static_graph: bool = False,
        bucket_cap_mb: float | None = None,
        gradient_as_bucket_view: bool = False,
    ) -> None:
        cluster = detect_environment() if cluster is None else cluster
        if not dist.is_available():
            raise RuntimeError("strategy='ddp' needs torch.distributed, which this torch build lacks; use strategy='single'")
        device = best_device(cpu=cpu, local_rank=cluster.local_rank)
        super().__init__(cluster=cluster, device=device, precision=precision)
        self.backend = backend or ("nccl" if device.type == "cuda" else "gloo")
        self.timeout = process_group_timeout(timeout)
        self.ddp_kwargs: dict[str, Any] = {
            "find_unused_parameters": find_unused_parameters,
            "static_graph": static_graph,
            "gradient_as_bucket_view": gradient_as_bucket_view,
        }
        if bucket_cap_mb is not None:
            self.ddp_kwargs["bucket_cap_mb"] = bucket_cap_mb
        self._owns_group = False

    def setup_environment(self) -> None:
        self._owns_group = join_process_group(self.cluster, self.device, self.backend, self.timeout, self.teardown)

    def setup_module(self, module: nn.Module, *, move: bool = True, wrap: bool = True) -> nn.Module:
        module = self.precision.convert_parameters(module)  # true precision: before DDP sizes its gradient buckets
        materialize_if_empty(self, module)  # an empty model: initialized in that dtype (as every strategy does)
        module = module.to(self.device) if move else module
        if not wrap or not self.is_distributed or not any(p.requires_grad for p in module.parameters()):
            return module
        device_ids = [self.device.index] if self.device.type == "cuda" else None
        return nn.parallel.DistributedDataParallel(module, device_ids=device_ids, **self.ddp_kwargs)

    def no_sync(self, module: nn.Module) -> AbstractContextManager[Any]:
        if isinstance(module, nn.parallel.DistributedDataParallel):
            return module.no_sync()
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def trigger_sync_in_backward(self, module: nn.Module) -> Iterator[None]:
        """Arm DDP's reducer now, so the next backward all-reduces even inside `no_sync` (Accelerate's recipe)."""
        if not isinstance(module, nn.parallel.DistributedDataParallel):
            yield
            return
        saved = module.require_backward_grad_sync, module.require_forward_param_sync
        module.require_backward_grad_sync = module.require_forward_param_sync = True
        module.reducer.prepare_for_backward([])
        try:
            yield
        finally:
            module.require_backward_grad_sync, module.require_forward_param_sync = saved

    def join(self, joinables: list[Any], enable: bool) -> AbstractContextManager[Any]:
        from torch.distributed.algorithms import Join, Joinable

        if not isinstance(joinables, (list, tuple)):
            raise TypeError(f"joinables={joinables!r} must be a list of prepared models, e.g. join_uneven_inputs([model])")
        bad = [j for j in joinables if not isinstance(j, Joinable)]
        if bad:
            raise TypeError(f"join_uneven_inputs takes the models prepared for DDP; {bad!r} cannot join (pass what prepare() returned)")
        return Join(list(joinables), enable=enable, throw_on_early_termination=False)

    def prepare_for_backward(self, module: nn.Module, output: Any) -> None:
        """Prepare DDP's reducer for a backward of `output` that did not come from ``module.forward``.

        DDP arms its gradient all-reduce in ``forward``; a step that called the module's methods directly
        (manual optimization) skipped that, so arm it here, as ``forward`` would have. Does nothing when
        `module` is not DDP-wrapped, gradients are off, or inside `no_sync`.
        """
        if not isinstance(module, nn.parallel.DistributedDataParallel):
            return
        if not torch.is_grad_enabled() or not module.require_backward_grad_sync:
            return
        from torch.nn.parallel.distributed import _find_tensors

        module.require_forward_param_sync = True
        used = list(_find_tensors(output)) if module.find_unused_parameters and not module.static_graph else []
        module.reducer._rebuild_buckets()
        module.reducer.prepare_for_backward(used)

    def teardown(self) -> None:
        leave_process_group(self._owns_group)
        self._owns_group = False
