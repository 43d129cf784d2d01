"""The `Strategy` interface: everything distributed that the two faces need.

A strategy owns the device, the process layout, a `Precision`, module/optimizer setup, backward, gradient
sync control, collectives and teardown. Concrete strategies subclass this class only; shared code lives in
plain functions (`strategies.collectives`).
"""

from __future__ import annotations

import contextlib
import math
import os
import weakref
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from strategies import checkpoint_io, collectives
from strategies import checkpoint_store as store
from strategies.checkpoint_staging import Staging
from strategies.checkpoint_store import Write
from strategies.environment import ClusterEnvironment
from strategies.materialize import has_meta_tensors, materialize
from strategies.precision import Precision, PrecisionSettings

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup
    from torch.distributed.algorithms import Joinable
    from torch.distributed.device_mesh import DeviceMesh

    from strategies.pipeline import Pipeline

_MISSING = object()


class Strategy:
    """Base class. Subclasses set ``name`` and implement `setup_environment`, `setup_module`.

    ``precision_class`` is the `Precision` a strategy composes (FSDP's casts differ from autocast), built from the
    constructor's mode and rebuilt by `configure_precision` (the one way its settings change), and
    ``sharded`` says whether it shards parameters (forward is then a collective, and its checkpoints hold
    one shard per process). Optional abilities are small interfaces a strategy also derives from
(`strategies.abilities.Engine`: module and optimizer set up together, the step inside backward).
    """

    name: str = "base"
    precision_class: type[Precision] = Precision
    sharded: bool = False
    # the processes' `DeviceMesh` once `setup_environment` built one (FSDP2 and the N-D meshes: named dimensions,
    # `strategies.mesh`; Lightning's ModelParallelStrategy: its two), else None
    device_mesh: DeviceMesh | None = None
    # where a checkpoint's optimizer states are read to (None: this strategy's device); `optimizer.load_state_dict` then
    # moves them next to their parameters. XLA reads to "cpu": torch.load cannot restore a storage onto an XLA device
    load_location: str | None = None
    # the process-group timeout in seconds of a strategy of several processes (None: one process, or the backend's)
    timeout: float | None = None
    # this process's pipeline stages and their schedule, once set up (`strategies.pipeline`); None without pipeline stages
    pipeline: Pipeline | None = None

    def __init__(self, *, cluster: ClusterEnvironment, device: torch.device, precision: str = "no") -> None:
        self.cluster = cluster
        self.device = torch.device(device)
        self.precision = self.precision_class(precision, self.device)
        # old parameter -> what setup replaced it with (sharded, or allocated from the meta device), so optimizers
        # built before prepare() step the new ones (keyed by id, checked by a weak reference: tensors compare element-wise)
        self._replaced: dict[int, tuple[weakref.ref[torch.Tensor], nn.Parameter]] = {}
        self.init_rng_state: torch.Tensor | None = None  # the CPU generator at the end of module_init_context: init draws from it

    def configure_precision(self, settings: PrecisionSettings) -> None:
        """Rebuild this strategy's precision from `settings` (what a face's arguments add to the mode: FP8, FSDP's
        `MixedPrecisionPolicy`, a loss scaler or its arguments, autocast's settings). The one way a precision changes.

        Settings equal to the precision's own change nothing. Refused (``ValueError``): another mode than the one the
        strategy was built with, settings the precision cannot take (`Precision.from_settings` says which), and any
        change once a module was set up or prepared with the precision (its forward, dtype and shards follow it), or
        where the precision is one set on the strategy by hand, which the strategy cannot rebuild.
        """
        current = self.precision
        if settings == current.settings:
            return
        if type(current) is not self.precision_class:
            raise ValueError(
                f"{settings!r} cannot be applied: this {type(self).__name__}'s precision is a {type(current).__name__} set on it, "
                f"which the strategy does not rebuild; build that object with what you need, or leave the strategy its own "
                f"{self.precision_class.__name__} (precision={current.mode!r} in its constructor)"
            )
        if settings.mode != current.mode:
            raise ValueError(
                f"{settings!r} has mode {settings.mode!r}, but the {type(self).__name__} was built with precision={current.mode!r}, "
                f"which it keeps; pass precision={settings.mode!r} to the strategy's constructor instead"
            )
        if current.in_use:
            raise ValueError(
                f"{settings!r} comes after a module was set up with this {type(self).__name__}'s precision, whose forward, dtype "
                "and shards already follow the old settings; configure the precision before prepare() / fit()"
            )
        self.precision = self.precision_class.from_settings(settings, self.device)

    @property
    def root_device(self) -> torch.device:
        """The device this process computes on (Lightning's name for `device`)."""
        return self.device

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

    data_parallel_group: ProcessGroup | None = None  # the processes that see different data: metrics gather and reduce over it (None: all)

    @property
    def data_parallel_rank(self) -> int:
        """This process's index among the data-parallel processes (with tensor parallelism, one per tensor-parallel group)."""
        return self.rank

    @property
    def data_parallel_size(self) -> int:
        """The number of processes that see different batches (the world size, unless some share a batch)."""
        return self.world_size

    @property
    def repeats_batches(self) -> bool:
        """Whether this process sees the same batches as a process of a lower rank (its tensor-parallel or pipeline
        peer): what it gathers per sample (predictions) that process gathers already."""
        return False

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    # setup
    def setup_environment(self) -> None:
        """Create process groups / select the device. Called once before anything else."""

    def module_init_context(self, empty_init: bool | None = None) -> AbstractContextManager[None]:
        """Where a model is built: ``Trainer.init_module()``, around ``TrainModule.configure_model()``, and the
        Accelerator's ``init_module()``.

        Here (one full copy per process): on this strategy's device, in the precision's dtype for the ``-true``
        modes. ``empty_init=True`` builds on the meta device instead (no memory, no initialization): `setup_module`
        then allocates the tensors and runs the model's own initialization (`strategies.materialize`), or you load
        weights into it. A sharding strategy builds empty by default (``empty_init=None``) and materializes only
        each process's shard; ``empty_init=False`` asks for a full copy on every process.
        """
        return _init_context(self, torch.device("meta") if empty_init else self.device)

    def setup_module(self, module: nn.Module, *, move: bool = True, wrap: bool = True) -> nn.Module:
        """Place `module` on the device (``move``) and wrap it for this strategy (``wrap``); returns what to call."""
        module = self.precision.convert_parameters(module)  # true precision: module.to(dtype) (an empty model too)
        materialize_if_empty(self, module)  # initialized in that dtype, as under module_init_context, and as FSDP does
        return module.to(self.device) if move else module

    def remember_replaced(self, before: list[tuple[str, nn.Parameter]], module: nn.Module) -> None:
        """Record which parameters of `module` setup replaced (by name, against `before`), for `setup_optimizer`."""
        old = dict(before)
        now: dict[int, tuple[nn.Parameter, nn.Parameter]] = {}
        for name, new in module.named_parameters(remove_duplicate=False):
            previous = old.get(name)
            if previous is not None and previous is not new:
                now[id(previous)] = (previous, new)
        for key, (ref, target) in list(self._replaced.items()):  # replaced twice (materialized, then moved): the newest
            if id(target) in now:
                self._replaced[key] = (ref, now[id(target)][1])
        for key, (previous, new) in now.items():
            self._replaced[key] = (weakref.ref(previous), new)

    def replacement(self, param: torch.Tensor) -> torch.Tensor:
        """The parameter setup put in place of `param` (`param` itself when it was not replaced)."""
        entry = self._replaced.get(id(param))
        return entry[1] if entry is not None and entry[0]() is param else param

    def setup_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Make `optimizer` step the parameters `setup_module` left (sharding and empty init replace them)."""
        repoint_optimizer(self, optimizer, "its state cannot move onto the new parameters")
        for state in optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and key != "step" and value.device != self.device:
                    state[key] = value.to(self.device)
        return optimizer

    def setup_module_and_optimizers(
        self,
        module: nn.Module,
        optimizers: list[torch.optim.Optimizer],
        *,
        move: bool = True,
        batch_size: int | None = None,
    ) -> tuple[nn.Module, list[torch.optim.Optimizer]]:
        """Set up `module` and the optimizers built on its parameters together; returns what to call and step.

        Here: `setup_module`, then `setup_optimizer` for each. ``batch_size`` (the per-process batch of the
        training loader, when known) is for engines that want it in their configuration.
        """
        wrapped = self.setup_module(module, move=move)
        return wrapped, [self.setup_optimizer(opt) for opt in optimizers]

    def agree_accumulation(self, steps: int) -> int:
        """The gradient-accumulation steps this strategy and a face agree on, given the face's `steps`.

        Here: the face's. A strategy whose own configuration sets them (DeepSpeed's config) adopts the face's
        value, or imposes its own when the face kept the default of 1, or refuses a conflict.
        """
        return steps

    def agree_clipping(self, value: float | None, algorithm: str = "norm") -> None:
        """Take the Trainer's ``gradient_clip_val`` into the strategy's configuration, before setup.

        Here nothing: the faces clip through `clip_grad_norm_`. An engine that clips inside its own step
        (DeepSpeed) records it, or refuses what it cannot do.
        """

    def call_through(self, wrapped: nn.Module, module: nn.Module, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``module.<method>(*args)`` through `wrapped`'s ``__call__``, so the wrapper's forward hooks run.

        DDP arms its gradient all-reduce in forward and FSDP gathers the root's parameters there; a
        ``training_step`` called directly would skip both. `module`'s ``forward`` is pointed at `method` for
        exactly one call and restored before the step runs, so the step's own ``self(x)`` reaches the real forward.
        """
        step = getattr(module, method)
        if not self.redirects_forward(wrapped, module):
            return step(*args, **kwargs)
        saved = module.__dict__.get("forward", _MISSING)

        def restore() -> None:
            if saved is _MISSING:
                module.__dict__.pop("forward", None)
            else:
                module.__dict__["forward"] = saved

        def redirect(*inner: Any, **inner_kwargs: Any) -> Any:
            restore()
            return step(*inner, **inner_kwargs)

        module.__dict__["forward"] = redirect
        try:
            return wrapped(*args, **kwargs)
        finally:
            restore()

    def redirects_forward(self, wrapped: nn.Module, module: nn.Module) -> bool:
        """Whether `call_through` must go through `wrapped`'s forward (a wrapper object here)."""
        return wrapped is not module

    def unwrap_module(self, module: nn.Module) -> nn.Module:
        while hasattr(module, "module") and isinstance(module.module, nn.Module) and type(module).__name__ in _WRAPPERS:
            module = module.module
        compiled = getattr(module, "_orig_mod", None)
        return compiled if isinstance(compiled, nn.Module) else module

    # training
    def backward(self, loss: torch.Tensor, *, accumulation_steps: int = 1, boundary: bool = True, **kwargs: Any) -> None:
        """Backward of `loss` divided by `accumulation_steps`; `boundary` says this is the last micro-batch before a step."""
        if accumulation_steps > 1:
            loss = loss / accumulation_steps
        if kwargs:
            self.precision.backward(loss, **kwargs)
        else:  # every step: a plain call costs less than unpacking an empty dict (the same below)
            self.precision.backward(loss)

    def prepare_for_backward(self, module: nn.Module, output: Any) -> None:
        """Arm gradient synchronization for a backward of `output` computed outside `module`'s forward.

        Called before ``backward`` when a step ran the wrapped module's methods directly (manual
        optimization). No-op here; `DDPStrategy` prepares its reducer.
        """

    def optimizer_step(self, optimizer: torch.optim.Optimizer, **kwargs: Any) -> bool:
        return self.precision.optimizer_step(optimizer, **kwargs) if kwargs else self.precision.optimizer_step(optimizer)

    def plain_steps(self) -> bool:
        """True when `backward` (of an unscaled loss) is ``loss.backward()`` and `optimizer_step` is ``optimizer.step()``:
        no loss scaler and neither method overridden here or in the precision. The faces then make those calls
        themselves, two layers of calls less per step."""
        precision = type(self.precision)
        return (self.precision.scaler is None and type(self).backward is Strategy.backward
                and type(self).optimizer_step is Strategy.optimizer_step and precision.backward is Precision.backward
                and precision.optimizer_step is Precision.optimizer_step)

    def no_sync(self, module: nn.Module) -> AbstractContextManager[None]:
        """Skip gradient synchronization inside the block (gradient accumulation)."""
        return contextlib.nullcontext()

    def trigger_sync_in_backward(self, module: nn.Module) -> AbstractContextManager[None]:
        """Reduce `module`'s gradients in the next backward inside the block, even within `no_sync`."""
        return contextlib.nullcontext()

    def join(self, joinables: list[Joinable | nn.Module], enable: bool) -> AbstractContextManager[None]:
        """Let processes with fewer batches shadow the others' gradient reductions (``enable``); DDP only."""
        if enable:
            raise NotImplementedError(
                f"join_uneven_inputs with uneven batches needs strategy='ddp': the {type(self).__name__} cannot let a process "
                "that ran out of batches shadow the others, and they would hang. Keep even_batches=True (the default)"
            )
        return contextlib.nullcontext()

    def evaluation_context(self, inference_mode: bool) -> AbstractContextManager[None]:
        """The autograd mode evaluation runs in: ``torch.inference_mode()`` when asked (Lightning's default), else
        ``torch.no_grad()``. Parameters gathered by a sharded strategy cannot be inference tensors: there, no_grad."""
        return torch.inference_mode() if inference_mode and not self.sharded else torch.no_grad()

    def gathered_parameters(self, module: nn.Module) -> AbstractContextManager[None]:
        """Keep `module`'s full parameters on every process inside the block, so its forward needs no collective.

        For evaluation where the processes run different numbers of batches. Nothing to do unless parameters are sharded.
        """
        return contextlib.nullcontext()

    def clip_grad_norm_(self, parameters: torch.Tensor | Iterable[torch.Tensor], max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """Clip gradients to a total norm of `max_norm`; returns the total norm before clipping, over all shards."""
        params = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
        grads = [p.grad for p in params if p.grad is not None]
        by_mesh: dict[Any, list[torch.Tensor]] = {}  # sharded gradients of one mesh reduce together (2-D: FSDP × TP)
        for param in params:
            if param.grad is not None:
                by_mesh.setdefault(getattr(param.grad, "device_mesh", None), []).append(param)
        if len(by_mesh) <= 1:
            total = torch.nn.utils.get_total_norm(grads, norm_type)
            full = getattr(total, "full_tensor", None)  # a sharded (DTensor) norm is partial per process
            total = self.combine_grad_norm(full() if callable(full) else total, norm_type)
            torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
            return total
        norms = []
        for group in by_mesh.values():
            norm = torch.nn.utils.get_total_norm([p.grad for p in group if p.grad is not None], norm_type)
            full = getattr(norm, "full_tensor", None)  # a sharded (DTensor) norm is partial per process
            norms.append(full() if callable(full) else norm)
        stacked = torch.stack(norms)
        total = stacked.max() if math.isinf(norm_type) else stacked.pow(norm_type).sum().pow(1.0 / norm_type)
        total = self.combine_grad_norm(total, norm_type)
        for group in by_mesh.values():
            torch.nn.utils.clip_grads_with_norm_(group, max_norm, total)
        return total

    def combine_grad_norm(self, norm: torch.Tensor, norm_type: float) -> torch.Tensor:
        """The total gradient norm from this process's `norm` of the parameters it holds whole or sharded: the same
        here; with pipeline stages, combined over the pipeline's processes (each holds other layers)."""
        if self.pipeline is None or self.pipeline.pp_size == 1:
            return norm
        import torch.distributed as dist

        if math.isinf(norm_type):
            dist.all_reduce(norm, op=dist.ReduceOp.MAX, group=self.pipeline.group)
            return norm
        powered = norm.pow(norm_type)
        dist.all_reduce(powered, group=self.pipeline.group)
        return powered.pow(1.0 / norm_type)

    def clip_grad_value_(self, parameters: torch.Tensor | Iterable[torch.Tensor], clip_value: float) -> None:
        """Clamp every gradient element into ``[-clip_value, clip_value]`` (element-wise, so shards need no sync)."""
        torch.nn.utils.clip_grad_value_(parameters, clip_value)

    # collectives
    def all_gather(self, data: Any) -> Any:
        """Gather over the data-parallel processes (those of one tensor-parallel group hold the same values)."""
        return collectives.gather(data, group=self.data_parallel_group)

    def all_gather_object(self, obj: Any) -> list[Any]:
        return collectives.gather_object(obj)

    def all_reduce(self, data: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        return collectives.reduce(data, reduction, scale, group=self.data_parallel_group)

    def pad_across_processes(self, data: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False) -> Any:
        return collectives.pad_across_processes(data, dim, pad_index, pad_first, group=self.data_parallel_group)

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

    def collect_checkpoint(self, models: list[nn.Module], optimizers: list[torch.optim.Optimizer], staging: Staging | None) -> Write:
        """Read the models' and optimizers' states for a checkpoint (every process, in step: it may be a collective)
        and return the function that writes this process's files of them (`strategies.checkpoint_store`).

        With `staging` (an asynchronous save) the states are copied into its buffers now and written from there
        later; without, the write reads the live tensors. Here: process 0 writes full state dicts
        (``model.safetensors``, ``optimizer.bin``, ...); a sharded strategy writes each process's shards instead.
        """
        states = [self.module_state_dict(m) for m in models]  # may be a collective: all ranks
        if self.rank != 0:
            return _write_nothing
        optimizer_states = [opt.state_dict() for opt in optimizers]
        if staging is not None:
            states, optimizer_states = staging.copy("models", states), staging.copy("optimizers", optimizer_states)
        return full_states_writer(states, optimizer_states)

    def load_checkpoint(
        self, reader: checkpoint_io.CheckpointReader | os.PathLike[str] | str, models: list[nn.Module],
        optimizers: list[torch.optim.Optimizer], *, strict: bool = True,
    ) -> None:
        """Restore what `save_checkpoint` wrote, by this or another strategy, in any process count.

        Sharded states (an FSDP checkpoint) are resharded by `torch.distributed.checkpoint` into whatever
        these models are; full ones load on every rank. Every file is read through `reader`, which checks it
        against the manifest in the same pass (a bare directory path reads them unchecked).
        """
        reader = reader if isinstance(reader, checkpoint_io.CheckpointReader) else checkpoint_io.CheckpointReader(reader)
        path = reader.directory
        if checkpoint_io.is_sharded(path):
            checkpoint_io.load_sharded(reader, models, optimizers, strict=strict, flatten=self.pipeline is not None)
            return
        if optimizers and (path / store.DEEPSPEED_DIR).is_dir():
            raise checkpoint_io.CheckpointError(
                f"checkpoint {str(path)!r} holds DeepSpeed engine states, which only strategy='deepspeed' resumes (its "
                f"optimizer states are partitioned by DeepSpeed); this run uses strategy={self.name!r}. Resume it with "
                "strategy='deepspeed', or start from its weights alone (model.safetensors: TrainModule.load_from_checkpoint, "
                "or strategies.checkpoint_io.load_weights(directory, model))"
            )
        sources = [store.model_file(i) for i in range(len(models))]
        for model, source in zip(models, sources):  # every model is checked (from the file headers) before any is changed
            shapes = checkpoint_io.safetensors_shapes(path / source)
            checkpoint_io.check_state_fits(shapes, self.unwrap_module(model), path / source, strict=strict)
        # The helper thread hashes the weights (and, where a core is idle, the optimizer files first) while the
        # optimizer files are parsed here, each otherwise hashed in the pass that reads it (the least CPU where no core
        # is idle). Nothing is applied before every file it uses is checked.
        optimizer_files = [store.optimizer_file(i) for i in range(len(optimizers))]
        reader.prefetch((optimizer_files if checkpoint_io.core_to_spare() else []) + sources)
        optimizer_states = [reader.torch_load(name, map_location=self.load_location or self.device) for name in optimizer_files]
        for model, source in zip(models, sources):
            self.load_module_state_dict(model, reader.load_safetensors(source), strict=strict)
        for opt, state in zip(optimizers, optimizer_states):
            opt.load_state_dict(state)

    def teardown(self) -> None:
        """Release process groups and other resources."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(device={self.device}, world_size={self.world_size}, precision={self.precision.mode!r})"


@contextlib.contextmanager
def _init_context(strategy: Strategy, device: torch.device) -> Iterator[None]:
    """Build on `device` in the precision's dtype; remember the CPU generator state at the end, which materializing draws from."""
    with device, strategy.precision.module_init_context():
        yield
    strategy.init_rng_state = torch.get_rng_state()


def _write_nothing(writer: checkpoint_io.CheckpointWriter) -> None:
    """What a process without files of its own in a checkpoint writes."""


def write_nothing() -> Write:
    """The write function of a process without files of its own in a checkpoint."""
    return _write_nothing


def full_states_writer(states: list[dict[str, torch.Tensor]], optimizer_states: list[dict[str, Any]]) -> Write:
    """The write function of full (unsharded) states: ``model.safetensors``, ``optimizer.bin``, ... of each model and
    optimizer, in order."""

    def write(writer: checkpoint_io.CheckpointWriter) -> None:
        for i, state in enumerate(states):
            writer.save_safetensors(store.model_file(i), state)
        for i, state in enumerate(optimizer_states):
            writer.save_torch(store.optimizer_file(i), state)

    return write


def materialize_if_empty(strategy: Strategy, module: nn.Module, device: torch.device | None = None) -> None:
    """Allocate and initialize `module`'s meta tensors on `device` (the strategy's by default): every process draws
    from process 0's generator state at the end of `module_init_context`."""
    if has_meta_tensors(module):
        before = list(module.named_parameters(remove_duplicate=False))
        materialize(module, strategy.device if device is None else device,
                    broadcast_object=strategy.broadcast_object if strategy.is_distributed else None, rng_state=strategy.init_rng_state)
        strategy.remember_replaced(before, module)


def repoint_optimizer(strategy: Strategy, optimizer: torch.optim.Optimizer, why: str) -> torch.optim.Optimizer:
    """Point `optimizer` at the parameters the strategy's setup put in place of the ones it was built on."""
    stale = [p for group in optimizer.param_groups for p in group["params"] if strategy.replacement(p) is not p]
    if stale and optimizer.state:
        raise ValueError(
            f"this optimizer already took steps on the parameters that prepare() replaced; {why}. Create the optimizer "
            "before training (or after prepare(model)), then prepare it"
        )
    for group in optimizer.param_groups:
        group["params"] = [strategy.replacement(p) for p in group["params"]]
    strategy._replaced = {k: v for k, v in strategy._replaced.items() if v[0]() is not None}
    return optimizer


def user_class(module: nn.Module) -> type:
    """The class the user defined: `fully_shard` swaps in a subclass named ``FSDP<Name>`` in place."""
    cls = type(module)
    bases = cls.__bases__
    if len(bases) == 2 and bases[0].__name__ == "FSDPModule" and cls.__name__ == f"FSDP{bases[1].__name__}":
        return bases[1]
    return cls


_WRAPPERS = {"DistributedDataParallel", "DataParallel", "FullyShardedDataParallel", "DeepSpeedEngine"}


def best_device(*, cpu: bool = False, local_rank: int = 0, assigned: str | None = None) -> torch.device:
    """The device the launcher `assigned` this process (Ray Train's), else CUDA (by local rank) > MPS > CPU;
    ``cpu=True`` forces CPU."""
    if cpu:
        return torch.device("cpu")
    if assigned:
        return torch.device(assigned)
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")
