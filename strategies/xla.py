"""TPU (and other XLA devices) through `torch_xla`: one process per XLA device, PJRT runtime.

XLA traces operations lazily and compiles the graph of a step when it is cut (``mark_step``). So the
optimizer step here is ``xm.optimizer_step`` (all-reduce the gradients across devices, then step) followed
by a step marker, and shapes must stay static between steps: keep ``even_batches=True`` (the default) and
``drop_last=True`` on training loaders, pad variable-length inputs to a few fixed lengths, and avoid
``.item()``/``print(tensor)`` inside the step (each one cuts the graph and syncs with the device).

    accelerator = Accelerator(strategy="xla", mixed_precision="bf16")     # PJRT_DEVICE=TPU python train.py
    trainer = Trainer(strategy="tpu")

`torch_xla` must be the build for this torch (torch_xla 2.9 pairs with torch 2.9); without it, or with a
mismatched one, asking for this strategy raises an `ImportError` naming the fix.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from strategies.base import Strategy, full_states_writer, materialize_if_empty, write_nothing
from strategies.checkpoint_staging import Staging
from strategies.checkpoint_store import Write
from strategies.collectives import apply_to_tensors
from strategies.environment import ClusterEnvironment, running_xla
from strategies.precision import TRUE_PRECISION_MODES, normalize_precision

INSTALL_HINT = (
    "install the torch_xla build for this torch, e.g. pip install 'torch==2.9.*' 'torch_xla[tpu]==2.9.*' "
    "(see https://github.com/pytorch/xla#installation), and run on a machine with an XLA device (PJRT_DEVICE=TPU)"
)
_XLA_DEVICE_VARIABLES = ("PJRT_DEVICE", "TPU_NAME", "TPU_ACCELERATOR_TYPE", "XRT_TPU_CONFIG", "COLAB_TPU_ADDR")


def xla_device_present(env: Mapping[str, str] | None = None) -> bool:
    """Whether this machine announces an XLA device (TPU VM/pod, Colab TPU, ``PJRT_DEVICE``) and torch_xla is installed.

    Cheap: reads environment variables and looks torch_xla up without importing it.
    """
    env = os.environ if env is None else env
    announced = any(env.get(name) for name in _XLA_DEVICE_VARIABLES)
    return announced and importlib.util.find_spec("torch_xla") is not None


def import_xla() -> tuple[Any, Any, Any]:
    """``(torch_xla, torch_xla.core.xla_model, torch_xla.runtime)``, or an `ImportError` naming the fix."""
    try:
        import torch_xla
        import torch_xla.core.xla_model as xm
        import torch_xla.runtime as xr
    except (ImportError, OSError) as err:  # not installed, or built for another torch (undefined symbols)
        raise ImportError(f"strategy='xla' needs torch_xla built for torch {torch.__version__} ({err}); {INSTALL_HINT}") from err
    return torch_xla, xm, xr


_pending_seed: list[int] = []  # the seed of a `seed_xla` before the runtime started, applied by XLAStrategy


def seed_xla(seed: int) -> None:
    """Seed the XLA device's generator (``set_seed`` seeds every device; ``torch.manual_seed`` does not reach XLA's):
    now when this process's runtime is up, else when `XLAStrategy` starts it. It never starts the runtime itself: a
    launcher's parent process must not, and a CPU run need not."""
    xm = running_xla()
    if xm is not None:
        xm.set_rng_state(seed % 2**64)
        _pending_seed.clear()
    else:
        _pending_seed[:] = [seed]


def check_xla_processes(num_processes: int | None, runtime: str | None) -> None:
    """Refuse several processes on torch_xla's CPU runtime (``runtime`` is ``PJRT_DEVICE``), before any starts.

    There each process's client holds every device, so a cross-process all-reduce waits for threads of its own process
    that never come; torch_xla 2.9 aborts it after 10 s with "Expected 2 threads to join the rendezvous, but only 1 of
    them arrived on time" (pytorch/xla#9496).
    """
    if (runtime or "").upper() == "CPU" and num_processes is not None and num_processes > 1:
        raise ValueError(
            f"strategy='xla' on torch_xla's CPU runtime (PJRT_DEVICE=CPU) runs one process, but {num_processes} were asked "
            "for: its collectives cannot meet across processes (torch_xla aborts the first all-reduce with \"Expected 2 "
            "threads to join the rendezvous, but only 1 of them arrived on time\", pytorch/xla#9496). Run one process "
            "(--num_processes 1), use strategy='ddp' for several CPU processes, or run on TPUs (PJRT_DEVICE=TPU)"
        )


def _to_host(tensor: torch.Tensor) -> torch.Tensor:
    """A CPU copy of `tensor`: of an XLA tensor the transfer itself, of a CPU one a clone (``.cpu()`` would return it,
    and an asynchronous save would then write what later steps made of it)."""
    return tensor.detach().to("cpu", copy=True)


def _check_xla_precision(precision: str) -> None:
    """Refuse what XLA cannot run, before torch_xla is imported: fp16 and the true modes."""
    mode = normalize_precision(precision)
    if mode == "fp16":
        raise ValueError("mixed_precision='fp16' is not supported on XLA devices; use 'bf16' (TPUs compute in bfloat16) or 'no'")
    if mode in TRUE_PRECISION_MODES:
        instead = "'no'" if mode == "fp64-true" else "'bf16' (bfloat16 autocast on the XLA device) or 'no'"
        raise ValueError(f"mixed_precision={mode!r} is not supported by strategy='xla' (no true-precision mode there); use {instead}")


class XLAStrategy(Strategy):
    """Data parallel over XLA devices: gradients all-reduced in the optimizer step, graphs cut at every step.

    Args:
        cluster: the process layout; read from the XLA runtime (`torch_xla.runtime`) unless one from it is passed.
        cpu: refused (an XLA strategy runs on the XLA device; use strategy='single' for CPU).
        precision: ``"no"`` or ``"bf16"`` (autocast on the XLA device); ``"fp16"`` and the true modes (``"bf16-true"``, ...)
            are refused with a `ValueError` (TPUs compute in bf16; use ``"bf16"``).
        timeout: accepted for a uniform signature; XLA's collectives have their own.
    """

    name = "xla"
    load_location = "cpu"  # torch.load cannot restore a storage onto an XLA device; load_state_dict moves it there

    def __init__(self, *, cluster: ClusterEnvironment | None = None, cpu: bool = False, precision: str = "no", timeout: float | None = None) -> None:
        if cpu:
            raise ValueError("strategy='xla' runs on the XLA device, but cpu=True was passed; use strategy='single' for CPU")
        _check_xla_precision(precision)
        torch_xla, xm, xr = import_xla()
        self._xm = xm
        self._mark_step = getattr(torch_xla, "sync", xm.mark_step)  # (xm.mark_step is deprecated from torch_xla 2.8)
        if cluster is None or cluster.source != "xla":  # the runtime knows the layout (xmp.spawn sets no RANK variables)
            cluster = ClusterEnvironment(
                world_size=int(xr.world_size()), rank=int(xr.global_ordinal()), local_rank=int(xr.local_ordinal()),
                local_world_size=int(xr.local_process_count()) if hasattr(xr, "local_process_count") else 1, source="xla",
            )
        device = torch_xla.device() if hasattr(torch_xla, "device") else xm.xla_device()
        check_xla_processes(cluster.world_size, getattr(xr, "device_type", lambda: None)())  # xmp.spawn, CPU_NUM_DEVICES=2
        if _pending_seed:  # set_seed ran before the runtime started
            seed_xla(_pending_seed[0])
        super().__init__(cluster=cluster, device=device, precision=precision)
        self._optimizers: list[torch.optim.Optimizer] = []  # prepared here: their gradients are reduced before clipping
        self._reduced: set[int] = set()

    def setup_environment(self) -> None:
        if self.world_size > 1 and not dist.is_initialized():
            import torch_xla.distributed.xla_backend  # noqa: F401  (registers the "xla" process-group backend)

            dist.init_process_group("xla", init_method="xla://")

    def setup_module(self, module: nn.Module, *, move: bool = True, wrap: bool = True) -> nn.Module:
        materialize_if_empty(self, module)
        before = list(module.named_parameters(remove_duplicate=False))
        module = module.to(self.device) if move else module  # no wrapper: the optimizer step reduces gradients
        self.remember_replaced(before, module)  # moving to an XLA device makes new parameters: optimizers follow them
        return module

    def backward(self, loss: torch.Tensor, *, accumulation_steps: int = 1, boundary: bool = True, **kwargs: Any) -> None:
        try:
            super().backward(loss, accumulation_steps=accumulation_steps, boundary=boundary, **kwargs)
        except RuntimeError as err:
            if "device_ready_queues_" not in str(err):
                raise
            raise RuntimeError(
                "backward on the XLA device failed because a backward pass ran in this process before torch_xla's runtime "
                "started: torch's autograd engine counts each device type's devices once, at its first backward "
                "(pytorch/xla#4174). Create the Accelerator or Trainer with strategy='xla' (or call torch_xla.device()) "
                "before any backward on the CPU in this process, e.g. at the top of the script"
            ) from err

    def _reduce_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        if self.world_size > 1 and id(optimizer) not in self._reduced:
            self._xm.reduce_gradients(optimizer)
            self._reduced.add(id(optimizer))

    def setup_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        optimizer = super().setup_optimizer(optimizer)
        self._optimizers.append(optimizer)
        return optimizer

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip after the gradients are reduced across devices (else each device would clip its own)."""
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        ids = {id(p) for p in params}
        for optimizer in self._optimizers:
            if any(id(p) in ids for group in optimizer.param_groups for p in group["params"]):
                self._reduce_gradients(optimizer)
        return super().clip_grad_norm_(params, max_norm, norm_type)

    def optimizer_step(self, optimizer: torch.optim.Optimizer, **kwargs: Any) -> bool:
        """All-reduce the gradients (unless clipping did), step, and cut the graph (``mark_step``)."""
        if id(optimizer) in self._reduced or self.world_size == 1:
            stepped = super().optimizer_step(optimizer, **kwargs)
        else:
            self._xm.optimizer_step(optimizer, optimizer_args=kwargs)
            stepped = True
        self._reduced.discard(id(optimizer))
        self._mark_step()
        return stepped

    def no_sync(self, module: nn.Module) -> AbstractContextManager[Any]:
        return contextlib.nullcontext()  # gradients are reduced only in the optimizer step

    def evaluation_context(self, inference_mode: bool) -> AbstractContextManager[Any]:
        return torch.no_grad()  # XLA traces the graph lazily; inference tensors do not mix with it

    def barrier(self, name: str | None = None) -> None:
        """``xm.rendezvous`` (it cuts the graph twice), leaving the device's generator as it was; nothing on one device."""
        if self.world_size > 1:
            with self._rng_kept():
                self._xm.rendezvous(name or "trainwright")

    @contextlib.contextmanager
    def _rng_kept(self) -> Iterator[None]:
        """Every step marker advances XLA's seed: one that only saves or waits must not change what training draws."""
        seed = self._xm.get_rng_state()
        try:
            yield
        finally:
            self._xm.set_rng_state(seed)

    def module_state_dict(self, module: nn.Module) -> dict[str, torch.Tensor]:
        """The weights on the CPU (XLA tensors are device handles; moving them also waits for pending steps), always
        copies: one already on the CPU (a model prepared with ``device_placement=False``) is not shared with training."""
        return {k: _to_host(v) for k, v in super().module_state_dict(module).items()}

    def collect_checkpoint(self, models: list[nn.Module], optimizers: list[torch.optim.Optimizer], staging: Staging | None) -> Write:
        """As the base class, with every tensor copied to the CPU first (what ``xm.save`` does; that copy is the one an
        asynchronous save needs, so `staging` is not used: tensors already on the CPU are cloned); rank 0 writes.

        The step marker that runs what is pending leaves the device's generator as it was: every ``mark_step``
        advances XLA's seed, and a run that saves must draw what the same run without saves (or resumed here) draws."""
        with self._rng_kept():
            self._mark_step()
        states = [self.module_state_dict(m) for m in models]
        if self.rank != 0:
            return write_nothing()
        optimizer_states = [apply_to_tensors(_to_host, opt.state_dict()) for opt in optimizers]  # (Adam's step counts live on the CPU)
        return full_states_writer(states, optimizer_states)

    def teardown(self) -> None:
        self._optimizers.clear()
