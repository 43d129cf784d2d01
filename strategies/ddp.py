"""Distributed data parallel: one process per device, gloo on CPU, nccl on CUDA."""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from strategies.base import Strategy, best_device, materialize_if_empty
from strategies.environment import ClusterEnvironment, detect_environment, process_group_timeout
from strategies.fault_tolerance import FaultTolerance, check_fault_tolerance
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
        ddp_options: further ``DistributedDataParallel`` keyword arguments (``dim``, ``broadcast_buffers``, ...).
        comm_hook: a communication hook registered on the DDP model (`register_comm_hook`): ``"fp16"``, ``"bf16"``,
            ``"power_sgd"`` or ``"batched_power_sgd"``.
        comm_wrapper: ``"fp16"``/``"bf16"``: wrap a PowerSGD `comm_hook` in that compression.
        comm_state_option: ``PowerSGDState`` arguments for a PowerSGD hook.
        fault_tolerance: a `strategies.FaultTolerance`: train across torchft replica groups (not built yet: its inputs
            are checked, then a `NotImplementedError` says what recovers from failures today).
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
        ddp_options: dict[str, Any] | None = None,
        comm_hook: str | None = None,
        comm_wrapper: str | None = None,
        comm_state_option: dict[str, Any] | None = None,
        fault_tolerance: FaultTolerance | None = None,
    ) -> None:
        if fault_tolerance is not None:
            check_fault_tolerance(fault_tolerance, "DDPStrategy")
        cluster = detect_environment() if cluster is None else cluster
        if not dist.is_available():
            raise RuntimeError("strategy='ddp' needs torch.distributed, which this torch build lacks; use strategy='single'")
        device = best_device(cpu=cpu, local_rank=cluster.local_rank, assigned=cluster.device)
        super().__init__(cluster=cluster, device=device, precision=precision)
        self.backend = backend or ("nccl" if device.type == "cuda" else "gloo")
        self.timeout: float = process_group_timeout(timeout)
        self.ddp_kwargs: dict[str, Any] = {
            "find_unused_parameters": find_unused_parameters,
            "static_graph": static_graph,
            "gradient_as_bucket_view": gradient_as_bucket_view,
        }
        if bucket_cap_mb is not None:
            self.ddp_kwargs["bucket_cap_mb"] = bucket_cap_mb
        self.ddp_kwargs.update(ddp_options or {})
        _check_comm_hook(comm_hook, comm_wrapper, comm_state_option)
        if comm_hook == "batched_power_sgd" and not _batched_power_sgd_works():
            raise NotImplementedError(
                f"comm_hook='batched_power_sgd' fails in torch {torch.__version__}: its batched_powerSGD_hook hands one matrix to "
                "_orthogonalize, which asserts a batch of matrices, so the first compressed backward raises a bare AssertionError; "
                "use comm_hook='power_sgd'"
            )
        if "bf16" in (comm_hook, comm_wrapper) and self.backend not in ("nccl", "xccl"):
            raise ValueError(
                f"the bf16 DDP communication hook (comm_hook={comm_hook!r}, comm_wrapper={comm_wrapper!r}) needs NCCL 2.10+ on CUDA "
                f"or XCCL on XPU (torch's requirement), but this run uses backend={self.backend!r}; use 'fp16' instead"
            )
        self.comm_hook: dict[str, Any] | None = {"hook": comm_hook, "wrapper": comm_wrapper, "state_option": dict(comm_state_option or {})} if comm_hook else None
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
        wrapped = nn.parallel.DistributedDataParallel(module, device_ids=device_ids, **self.ddp_kwargs)
        if self.comm_hook is not None:
            register_comm_hook(wrapped, **self.comm_hook)
        return wrapped

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
        if bad:  # as Accelerate: enter, with a warning, rather than fail
            warnings.warn(
                f"Joining uneven inputs is only supported for multi-GPU (DDP) training: {bad!r:.120} cannot join (not a "
                "DDP-wrapped model: pass what prepare() returned), so join_uneven_inputs has no effect",
                stacklevel=4,
            )
            return contextlib.nullcontext()
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


_HOOKS = ("fp16", "bf16", "power_sgd", "batched_power_sgd")


def _check_comm_hook(hook: str | None, wrapper: str | None, state_option: dict[str, Any] | None) -> None:
    if hook is not None and hook not in _HOOKS:
        raise ValueError(f"comm_hook={hook!r} is not a DDP communication hook; choose one of {_HOOKS}")
    if wrapper is not None and (wrapper not in ("fp16", "bf16") or hook is None):
        raise ValueError(f"comm_wrapper={wrapper!r} must be 'fp16' or 'bf16', around a comm_hook")
    if state_option and hook not in ("power_sgd", "batched_power_sgd"):
        raise ValueError(f"comm_state_option={state_option!r} configures PowerSGD; set comm_hook='power_sgd' or drop it")


def _batched_power_sgd_works() -> bool:
    """Whether torch's batched PowerSGD hook can orthogonalize the single matrix it passes (not in torch 2.13)."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    try:
        powerSGD_hook._orthogonalize(torch.ones(2, 1))
    except AssertionError:
        return False
    return True


def register_comm_hook(model: nn.Module, hook: str, wrapper: str | None = None, state_option: dict[str, Any] | None = None) -> None:
    """Register torch's DDP communication `hook` on the ``DistributedDataParallel`` `model` (as Accelerate's
    ``DistributedDataParallelKwargs.register_comm_hook``).

    ``"fp16"``/``"bf16"``: gradients are all-reduced in that dtype (``default_hooks.fp16_compress_hook`` /
    ``bf16_compress_hook``) and divided by the world size; ``"power_sgd"``/``"batched_power_sgd"``: PowerSGD low-rank
    compression, with a ``PowerSGDState(process_group=None, **state_option)``; `wrapper` ``"fp16"``/``"bf16"`` compresses
    the PowerSGD hook's own communication too.
    """
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    _check_comm_hook(hook, wrapper, state_option)
    if not isinstance(model, nn.parallel.DistributedDataParallel):
        raise TypeError(f"a communication hook goes on a DistributedDataParallel model, got {type(model).__name__}")
    hooks: dict[str, Any] = {"fp16": default_hooks.fp16_compress_hook, "bf16": default_hooks.bf16_compress_hook,
                             "power_sgd": powerSGD_hook.powerSGD_hook, "batched_power_sgd": powerSGD_hook.batched_powerSGD_hook}
    wrappers: dict[str, Any] = {"fp16": default_hooks.fp16_compress_wrapper, "bf16": default_hooks.bf16_compress_wrapper}
    function = hooks[hook]
    if wrapper is not None:
        function = wrappers[wrapper](function)
    state = powerSGD_hook.PowerSGDState(None, **(state_option or {})) if hook in ("power_sgd", "batched_power_sgd") else None
    model.register_comm_hook(state=state, hook=function)
