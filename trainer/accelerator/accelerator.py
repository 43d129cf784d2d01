"""The `Accelerator` face: keep your own loop, let a strategy do the distributed work.

    accelerator = Accelerator(mixed_precision="bf16")
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for batch in loader:
        with accelerator.accumulate(model):
            loss = model(batch).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()

Written to be a drop-in for Hugging Face Accelerate's ``Accelerator``: the same names, arguments and
semantics, without its traps (silent single-process CPU runs, ignored ``split_batches``, hangs on
unequal gathers, an inexact resume).
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import numbers
import os
import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Literal, overload

import torch
from torch import nn

from strategies import Strategy
from strategies import fp8 as fp8_module
from strategies.checkpoint_store import CheckpointStore
from strategies.environment import env_flag, env_setting
from strategies.fault_tolerance import FaultTolerance, check_fault_tolerance
from strategies.precision import PrecisionSettings, normalize_precision
from trainer.accelerator import layout
from trainer.accelerator.builder import accumulation_plugin, build_strategy
from trainer.accelerator.collectives import Collectives
from trainer.accelerator.config import (
    DataLoaderConfiguration,
    DeepSpeedPlugin,
    FullyShardedDataParallelPlugin,
    GradientAccumulationPlugin,
    ProjectConfiguration,
    TorchDynamoPlugin,
)
from trainer.accelerator.gradient_state import GradientState, gradient_state_of
from trainer.accelerator.gradient_state import track as track_gradient_state
from trainer.accelerator.kwargs import AORecipeKwargs, AutocastKwargs, KwargsHandler, KwargsHandlers, ProfileKwargs, check_fp8
from trainer.accelerator.layout import AcceleratorState, accelerator_state_of, share_strategy
from trainer.accelerator.mesh_ranks import MeshRanks
from trainer.accelerator.parallelism import ParallelismConfig
from trainer.accelerator.pipelining import PipelineSteps, is_pipeline_loss
from trainer.accelerator.preparation import Preparation, checked_rng_types
from trainer.accelerator.registry import Prepared
from trainer.accelerator.saving import Checkpointing, check_path
from trainer.accelerator.signals import SIGNALS, SignalRecorder
from trainer.accelerator.stepper import Stepper, check_loss
from trainer.accelerator.wrappers import PreparedOptimizer, PreparedScheduler

if TYPE_CHECKING:
    from torch.distributed.algorithms import Joinable

    from callbacks.trackers.base import GeneralTracker, NoOpTracker
    from callbacks.trackers.registry import LogWith

_UNSET: Any = object()


class Accelerator(MeshRanks, Collectives, Checkpointing, Preparation, PipelineSteps):
    """One object for device placement, distributed data, mixed precision, accumulation and checkpoints.

    Args:
        mixed_precision: ``"no"``, ``"fp16"``, ``"bf16"`` (also ``"32"``, ``"16-mixed"``, ``"bf16-mixed"``), or true
            precision ``"bf16-true"``, ``"fp16-true"``, ``"fp64-true"`` (also ``"16-true"``, ``"64-true"``, ``64``,
            ``"double"``); default from ``TRAINWRIGHT_MIXED_PRECISION``, else ``"no"``. See docs/precision.md.
        gradient_accumulation_steps: optimizer steps happen every this many batches.
        split_batches: split each global batch across processes instead of giving each rank a full batch.
        even_batches: complete the last batches by wrapping around so every rank gets as many batches.
        dataloader_config: a `DataLoaderConfiguration` (its flags win over the two above).
        device_placement: move models and batches to the device.
        rng_types: the RNGs made equal on every process (from process 0's) when a pass over a prepared loader starts:
            ``"generator"`` (the sampler's; the default), ``"torch"``, ``"cuda"``. See docs/data.md.
        cpu: force CPU even when an accelerator is present.
        strategy: ``"auto"``, ``"single"``, ``"ddp"``, ``"fsdp"`` or a `Strategy`.
        log_with: tracker name(s), `LoggerType`, tracker instances, or ``"all"``.
        project_dir: where checkpoints and logs go.
        project_config: a `ProjectConfiguration` (directories, automatic checkpoint naming).
        gradient_accumulation_plugin: a `GradientAccumulationPlugin` (instead of the step count).
        step_scheduler_with_optimizer: step prepared schedulers only when the optimizer really stepped.
        process_group_timeout: seconds a collective may wait for a missing rank before failing the job.
        kwargs_handlers: `DDPKwargs` objects (Accelerate's ``DistributedDataParallelKwargs``).
        deepspeed_plugin: a `DeepSpeedPlugin` (Accelerate's): runs `strategies.DeepSpeedStrategy` with its settings.
        fsdp_plugin: a `FullyShardedDataParallelPlugin` (Accelerate's): runs `strategies.FSDPStrategy` (FSDP2) with its settings.
        parallelism_config: a `ParallelismConfig` (``dp_replicate_size``, ``dp_shard_size``, ``tp_size``): FSDP2 on that N-D
            mesh (HSDP, tensor parallel with the model's own plan or ``tp_plan``), or DDP for replicas alone.
        dynamo_backend: a ``torch.compile`` backend (``"inductor"``, ...; ``"no"``: off): models are compiled after `prepare`
            set them up (default from ``TRAINWRIGHT_DYNAMO_BACKEND``).
        dynamo_plugin: a `TorchDynamoPlugin` (mode, fullgraph, dynamic, ``use_regional_compilation``), instead of `dynamo_backend`.
        fault_tolerance: a `strategies.FaultTolerance`: train across torchft replica groups (not built yet: its inputs
            are checked, then a `NotImplementedError` says what recovers from failures today; docs/fault-tolerance.md).
    """

    def __init__(
        self,
        *,
        mixed_precision: str | None = None,
        gradient_accumulation_steps: int | None = None,
        split_batches: bool = _UNSET,
        even_batches: bool = _UNSET,
        dataloader_config: DataLoaderConfiguration | None = None,
        device_placement: bool = True,
        rng_types: list[str] | None = None,
        cpu: bool | None = None,
        strategy: str | Strategy | None = None,
        log_with: LogWith = None,
        project_dir: str | os.PathLike | None = None,
        project_config: ProjectConfiguration | None = None,
        gradient_accumulation_plugin: GradientAccumulationPlugin | None = None,
        step_scheduler_with_optimizer: bool = True,
        process_group_timeout: float | None = None,
        kwargs_handlers: list[KwargsHandler] | None = None,
        deepspeed_plugin: DeepSpeedPlugin | None = None,
        fsdp_plugin: FullyShardedDataParallelPlugin | None = None,
        dynamo_backend: str | Callable[..., object] | None = None,
        dynamo_plugin: TorchDynamoPlugin | None = None,
        parallelism_config: ParallelismConfig | None = None,
        fault_tolerance: FaultTolerance | None = None,
    ) -> None:
        if fault_tolerance is not None:
            check_fault_tolerance(fault_tolerance, "Accelerator")
        handlers = KwargsHandlers.sort(kwargs_handlers)  # Accelerate's kwargs_handlers, one per kind: each honoured below, or refused
        fp8_backend = _fp8_backend(mixed_precision or env_setting("MIXED_PRECISION", "no"), handlers,
                                   bool(env_flag("CPU")) if cpu is None else bool(cpu))
        if fp8_backend is not None:  # Accelerate runs FP8 under bf16 autocast; the Float8Linear swap happens at prepare
            mixed_precision = "bf16"
            if handlers.ao_recipe_handler is None and not handlers.fp8_recipes():
                handlers.ao_recipe_handler = AORecipeKwargs()  # Accelerate fills in the default recipe the same way
        if isinstance(strategy, Strategy) and mixed_precision is not None and normalize_precision(mixed_precision) != strategy.precision.mode:
            raise ValueError(
                f"mixed_precision={mixed_precision!r} but the {type(strategy).__name__} passed was built with precision="
                f"{strategy.precision.mode!r}, which it keeps; pass precision={normalize_precision(mixed_precision)!r} to the "
                "strategy, or leave mixed_precision out"
            )
        cpu = bool(env_flag("CPU")) if cpu is None else bool(cpu)
        mixed_precision = normalize_precision(mixed_precision or env_setting("MIXED_PRECISION", "no"))
        self.gradient_plugin = accumulation_plugin(gradient_accumulation_steps, gradient_accumulation_plugin)
        self.dataloader_config = dataloader_config or DataLoaderConfiguration()
        if split_batches is not _UNSET:
            self.dataloader_config.split_batches = bool(split_batches)
        if even_batches is not _UNSET:
            self.dataloader_config.even_batches = bool(even_batches)
        check_path(project_dir, "project_dir")
        self.project_configuration = project_config or ProjectConfiguration(project_dir=None if project_dir is None else os.fspath(project_dir))
        if project_dir is not None and project_config is not None:
            self.project_configuration.set_directories(project_dir)
        strategy = build_strategy(strategy, precision=mixed_precision, cpu=cpu, timeout=handlers.timeout(process_group_timeout),
                                  handlers=handlers, deepspeed_plugin=deepspeed_plugin, fsdp_plugin=fsdp_plugin,
                                  parallelism=parallelism_config)
        if parallelism_config is not None and not isinstance(parallelism_config, ParallelismConfig):
            raise TypeError(f"parallelism_config={parallelism_config!r} must be a trainer.ParallelismConfig")
        self._parallelism_config = parallelism_config
        # FP8 and Accelerate's GradScalerKwargs / AutocastKwargs, as settings the strategy rebuilds its precision from
        strategy.configure_precision(_precision_settings(strategy.precision.settings, handlers, float8=fp8_backend is not None))
        # Accelerate's public handler attributes (ddp_handler, scaler_handler, init_handler, autocast_handler, profile_handler,
        # fp8_recipe_handler, ao_recipe_handler, te_recipe_handler, msamp_recipe_handler): each what was passed, else None
        self.ddp_handler, self.scaler_handler, self.init_handler = handlers.ddp_handler, handlers.scaler_handler, handlers.init_handler
        self.autocast_handler, self.profile_handler = handlers.autocast_handler, handlers.profile_handler
        self.fp8_recipe_handler, self.ao_recipe_handler = handlers.fp8_recipe_handler, handlers.ao_recipe_handler
        self.te_recipe_handler, self.msamp_recipe_handler = handlers.te_recipe_handler, handlers.msamp_recipe_handler
        self.has_fp8_handler = bool(handlers.fp8_recipes())
        self._fp8_backend = fp8_backend or "NO"
        if dynamo_plugin is not None and dynamo_backend is not None:
            raise ValueError("pass dynamo_backend or dynamo_plugin, not both (the plugin carries a backend)")
        if dynamo_plugin is None and dynamo_backend is None and env_setting("DYNAMO_PLUGIN"):
            dynamo_plugin = TorchDynamoPlugin(**json.loads(str(env_setting("DYNAMO_PLUGIN"))))  # `trainer launch`'s config
        self.dynamo_plugin = dynamo_plugin if dynamo_plugin is not None else TorchDynamoPlugin(backend=dynamo_backend)
        self.strategy = strategy
        self.strategy.setup_environment()
        share_strategy(self.strategy)
        self._state = accelerator_state_of(self.strategy)
        self._resets = layout.resets[0]  # AcceleratorState._reset_state() after this makes prepare() refuse
        self.gradient_plugin.num_steps = self.strategy.agree_accumulation(self.gradient_plugin.num_steps)
        self.stepper = Stepper(self.strategy, self.gradient_plugin)  # the step: boundaries, backward, clip, optimizer step
        track_gradient_state(self)  # `GradientState()` reads the Accelerator made last
        self.checkpoints = CheckpointStore(self.strategy)  # every save of this run, the one in flight, the layout on disk
        self.device_placement = device_placement
        self.rng_types = checked_rng_types(rng_types)
        self.step_scheduler_with_optimizer = step_scheduler_with_optimizer
        self.flag_tensor: torch.Tensor | None = None
        self._signals = SignalRecorder()  # trigger_on_signals' handlers record here
        self.prepared = Prepared(data_seed=self.dataloader_config.data_seed)  # what save_state checkpoints, in order
        self._save_state_pre_hooks: OrderedDict[int, Callable[..., None]] = OrderedDict()  # register_save_state_pre_hook
        self._load_state_pre_hooks: OrderedDict[int, Callable[..., None]] = OrderedDict()  # register_load_state_pre_hook
        self.checkpoint_parts: list[Any] = []  # what a Trainer adds to every checkpoint (`state.Part`s)
        self._log_with = log_with
        self._trackers: Any = None
        if log_with is not None:
            self._tracker_hub()  # validate names now, not after an hour of training

    # properties ---------------------------------------------------------------------------------------
    @property
    def state(self) -> AcceleratorState:
        """A read-only view: ``num_processes``, ``process_index``, ``device``, ``distributed_type``, ``mixed_precision``..."""
        return self._state

    @property
    def mixed_precision(self) -> str:
        return self._state.mixed_precision

    @property
    def fp8_backend(self) -> str:
        """The FP8 backend, as Accelerate names it: ``"AO"`` (torchao) with FP8, else ``"NO"``."""
        return self._fp8_backend

    @property
    def deepspeed_plugin(self) -> DeepSpeedPlugin | None:
        """The DeepSpeed settings of this run (None without DeepSpeed); see `AcceleratorState.deepspeed_plugin`."""
        return self._state.deepspeed_plugin

    @property
    def scaler(self) -> torch.amp.GradScaler | None:
        return self.strategy.precision.scaler

    @property
    def gradient_accumulation_steps(self) -> int:
        return self.gradient_plugin.num_steps

    @gradient_accumulation_steps.setter
    def gradient_accumulation_steps(self, value: int) -> None:
        self.gradient_plugin = GradientAccumulationPlugin(num_steps=value)
        self.stepper.configure(self.gradient_plugin)

    @property
    def gradient_state(self) -> GradientState:
        """Accelerate's ``GradientState``: a view of this accelerator's accumulation window and of its prepared loaders."""
        return gradient_state_of(self)

    @property
    def sync_gradients(self) -> bool:
        """True on a batch that ends an accumulation window: gradients are reduced and optimizers step."""
        return self.stepper.sync_gradients

    @sync_gradients.setter
    def sync_gradients(self, value: bool) -> None:
        self.stepper.sync_gradients = bool(value)

    @property
    def step(self) -> int:
        """Batches counted by `accumulate` since the accumulation window began (Accelerate's ``accelerator.step``)."""
        return self.stepper.batches_in_window

    @step.setter
    def step(self, value: int) -> None:
        self.stepper.batches_in_window = int(value)

    @property
    def optimizer_step_was_skipped(self) -> bool:
        """True when fp16 loss scaling skipped the last step (inf/nan gradients); never without a scaler."""
        if self.strategy.precision.scaler is None:
            return False
        return any(opt.step_was_skipped for opt in self.prepared.optimizers)

    @property
    def project_dir(self) -> str | None:
        return self.project_configuration.project_dir

    @property
    def logging_dir(self) -> str | None:
        return self.project_configuration.logging_dir

    @property
    def save_iteration(self) -> int:
        """The number the next automatically named checkpoint gets (``checkpoint_<n>``)."""
        return self.project_configuration.iteration

    # training -----------------------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``loss.backward()`` with loss scaling and division by the accumulation steps (`Stepper.backward`); nothing
        for the loss of ``pipeline_step``, whose backward ran in the pipeline schedule."""
        if is_pipeline_loss(loss):
            return
        check_loss(loss, kwargs)
        if kwargs:
            self.stepper.backward(loss, **kwargs)
        else:  # a plain call costs less than unpacking an empty dict
            self.stepper.backward(loss)

    @contextlib.contextmanager
    def accumulate(self, *models: nn.Module) -> Iterator[None]:
        """Accumulate gradients: inside, gradient sync and optimizer steps happen only on boundaries."""
        bad = [m for m in models if not isinstance(m, nn.Module)]
        if bad:
            raise TypeError(f"accumulate() takes the prepared models (torch.nn.Module), got {bad!r:.120}: accelerator.accumulate(model)")
        stepper = self.stepper
        stepper.advance(stepper.accumulation.sync_with_dataloader and self._active_dataloader() is not None)
        with stepper.sync_context(models):
            yield

    def no_sync(self, model: nn.Module) -> AbstractContextManager[None]:
        """Skip DDP gradient sync in the block (gradients still accumulate locally)."""
        return self.strategy.no_sync(model)

    def trigger_sync_in_backward(self, model: nn.Module) -> AbstractContextManager[None]:
        """Make the next backward in the block reduce `model`'s gradients, even inside `no_sync`/`accumulate`.

        For a step with several forwards under ``no_sync`` and one backward of their combined loss: DDP arms
        its gradient reduction in ``forward``, so the backward would otherwise reduce nothing.
        """
        return self.strategy.trigger_sync_in_backward(model)

    @contextlib.contextmanager
    def join_uneven_inputs(self, joinables: list[Joinable | nn.Module], even_batches: bool | None = None) -> Iterator[None]:
        """Train DDP models on processes with different batch counts (PyTorch's ``Join``).

        `even_batches` overrides the prepared loaders' setting inside the block; ``even_batches=False`` makes
        the loaders uneven and turns the join on. DDP only: a sharded strategy cannot join, and asking it to
        raises (its next collective would hang). With one process nothing happens.
        """
        if even_batches is not None and not isinstance(even_batches, bool):
            raise TypeError(f"even_batches={even_batches!r} must be True, False or None (keep the loaders' setting)")
        shards: list[Any] = [getattr(loader, "shard", None) for loader in self.prepared.dataloaders]
        shards = [shard for shard in shards if hasattr(shard, "even_batches")]
        saved = [(shard, shard.even_batches) for shard in shards]
        if even_batches is not None:
            for shard in shards:
                shard.even_batches = even_batches
        uneven = not (self.even_batches if even_batches is None else even_batches)
        try:
            with self.strategy.join(joinables, enable=uneven and self.use_distributed):
                yield
        finally:
            for shard, value in saved:
                shard.even_batches = value

    def autocast(self, autocast_handler: AutocastKwargs | None = None) -> AbstractContextManager[None]:
        """Run the block in the mixed-precision dtype (a no-op with ``mixed_precision="no"``).

        `autocast_handler` (an `AutocastKwargs`) replaces the Accelerator's for this block, e.g.
        ``AutocastKwargs(enabled=False)`` for a float32 region inside a mixed-precision step.
        """
        handler = self.autocast_handler if autocast_handler is None else autocast_handler
        if handler is None:
            return self.strategy.precision.autocast()
        if not isinstance(handler, AutocastKwargs):
            raise TypeError(f"autocast_handler={handler!r} must be an AutocastKwargs, e.g. AutocastKwargs(enabled=False)")
        return self.strategy.precision.autocast(**handler.settings())

    @contextlib.contextmanager
    def profile(self, profile_handler: ProfileKwargs | None = None) -> Iterator[torch.profiler.profile]:
        """Profile the block with ``torch.profiler`` (Accelerate's): yields the profiler (call ``prof.step()`` once per
        step when a schedule is set). `profile_handler` replaces the Accelerator's `ProfileKwargs`.

        With ``output_trace_dir`` every process writes its Chrome trace there after the block, as
        ``profile_<process_index>.json``, and the processes wait for each other.
        """
        handler = profile_handler or self.profile_handler or ProfileKwargs()
        if not isinstance(handler, ProfileKwargs):
            raise TypeError(f"profile_handler={handler!r} must be a ProfileKwargs")
        with handler.build() as profiler:
            yield profiler
        if handler.output_trace_dir is None:
            return
        os.makedirs(handler.output_trace_dir, exist_ok=True)
        profiler.export_chrome_trace(os.path.join(handler.output_trace_dir, f"profile_{self.process_index}.json"))
        self.wait_for_everyone()

    def unscale_gradients(self, optimizer: torch.optim.Optimizer | list[torch.optim.Optimizer] | None = None) -> None:
        """Divide the gradients by the fp16 loss scale (once per step); nothing to do without a scaler."""
        self.stepper.unscale(self._inner_optimizers(optimizer))

    def _inner_optimizers(self, optimizer: torch.optim.Optimizer | list[torch.optim.Optimizer] | None = None) -> list[torch.optim.Optimizer]:
        """The optimizers the strategy set up: of `optimizer` (one or a list), else of every prepared one."""
        targets = self.prepared.optimizers if optimizer is None else [optimizer] if not isinstance(optimizer, list) else optimizer
        return [opt.optimizer if isinstance(opt, PreparedOptimizer) else opt for opt in targets]

    def clip_grad_norm_(self, parameters: torch.Tensor | Iterable[torch.Tensor], max_norm: float, norm_type: float = 2) -> torch.Tensor:
        """Unscale (fp16), then clip the gradient norm; returns the total norm before clipping."""
        if isinstance(max_norm, bool) or not isinstance(max_norm, (numbers.Real, torch.Tensor)):
            raise TypeError(f"max_norm={max_norm!r} must be a number, e.g. clip_grad_norm_(model.parameters(), 1.0)")
        return self.stepper.clip_grad_norm_(parameters, max_norm, norm_type, self._inner_optimizers())

    def clip_grad_value_(self, parameters: torch.Tensor | Iterable[torch.Tensor], clip_value: float) -> None:
        """Unscale (fp16), then clamp every gradient to ``[-clip_value, clip_value]``."""
        self.stepper.clip_grad_value_(parameters, clip_value, self._inner_optimizers())

    def set_trigger(self) -> None:
        """Mark this process; the next `check_trigger` returns True on every process."""
        self.flag_tensor = torch.tensor(1, device=self.device)

    def check_trigger(self) -> bool:
        """True on every process when any process called `set_trigger` or got a signal of `trigger_on_signals` (a collective)."""
        marked = self.flag_tensor is not None or self.received_signal != 0
        flag = torch.tensor(1 if marked else 0, device=self.device)
        triggered = bool(self.reduce(flag, "sum").item() > 0)
        self.flag_tensor = None
        self.received_signal = 0
        return triggered

    def trigger_on_signals(self, *signals: int) -> None:
        """Preemption for your own loop: these signals (default SIGTERM and SIGUSR1) act as `set_trigger`.

        The handler only records the signal; check ``accelerator.check_trigger()`` once per step, and when it is
        True (on every process at the same step) call ``save_state()`` and exit, e.g. ``sys.exit(143)``.
        """
        self._signals.install(signals or SIGNALS, keep_user_handlers=False, first_wins=False)

    @property
    def received_signal(self) -> int:
        """The last signal of `trigger_on_signals` received since the last `check_trigger` (0: none)."""
        return self._signals.received

    @received_signal.setter
    def received_signal(self, value: int) -> None:
        self._signals.received = int(value)

    # Accelerate's private names for the prepared objects, read by some scripts: the same lists as `prepared`'s
    @property
    def _models(self) -> list[nn.Module]:
        return self.prepared.models

    @property
    def _optimizers(self) -> list[PreparedOptimizer]:
        return self.prepared.optimizers

    @property
    def _schedulers(self) -> list[PreparedScheduler]:
        return self.prepared.schedulers

    @property
    def _dataloaders(self) -> list[Any]:
        return self.prepared.dataloaders

    @property
    def _custom_objects(self) -> list[Any]:
        return self.prepared.custom_objects

    def free_memory(self, *objects: Any) -> list[None]:
        """Drop references to prepared objects and empty device caches."""
        self.prepared.clear()
        self.step = 0
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return [None for _ in objects]

    clear = free_memory

    # trackers -----------------------------------------------------------------------------------------
    def _tracker_hub(self) -> Any:
        if self._trackers is None:
            from callbacks.trackers import TrackerHub  # lazy: the tracker modules load only for log_with

            self._trackers = TrackerHub(self._log_with, project_dir=self.logging_dir, is_main_process=self.is_main_process)
        return self._trackers

    @property
    def trackers(self) -> list[GeneralTracker]:
        return [] if self._trackers is None else list(self._trackers.trackers)

    def init_trackers(self, project_name: str, config: dict[str, Any] | None = None, init_kwargs: dict[str, Any] | None = None) -> None:
        """Start the trackers named in ``log_with`` and store `config` as the run's hyperparameters."""
        self._tracker_hub().init(project_name, config=config, init_kwargs=init_kwargs)

    def log(self, values: dict[str, Any], step: int | None = None, log_kwargs: dict[str, Any] | None = None) -> None:
        """Log `values` to every tracker (main process only)."""
        if not isinstance(values, dict):
            raise TypeError(f"log() takes a dict of metric names to values, got {type(values).__name__}: accelerator.log({{'loss': loss}})")
        if self._trackers is not None:
            self._trackers.log(values, step=step, log_kwargs=log_kwargs)

    @overload
    def get_tracker(self, name: str, unwrap: Literal[False] = False) -> GeneralTracker | NoOpTracker: ...
    @overload
    def get_tracker(self, name: str, unwrap: bool) -> Any: ...
    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        return self._tracker_hub().get(name, unwrap=unwrap)

    def end_training(self) -> None:
        """Wait for a checkpoint being saved in the background, finish the trackers and wait for every process."""
        self.checkpoints.wait()
        if self._trackers is not None:
            self._trackers.finish()
        self.wait_for_everyone()

    def teardown(self) -> None:
        """Destroy the process group this accelerator created (after a save in flight finished)."""
        try:
            self.checkpoints.close()
        finally:
            self.strategy.teardown()

    def __repr__(self) -> str:
        return f"Accelerator(strategy={self.strategy!r}, gradient_accumulation_steps={self.gradient_accumulation_steps})"


def _fp8_backend(requested: Any, handlers: KwargsHandlers, cpu: bool) -> str | None:
    """``mixed_precision="fp8"`` or an FP8 recipe handler: the backend (``"AO"``), after checking the GPU (`check_fp8`)
    and the package; None without FP8. A recipe without ``mixed_precision="fp8"`` is refused, as in Accelerate."""
    recipes = handlers.fp8_recipes()
    fp8 = str(requested).strip().lower() == "fp8"
    if not fp8 and not recipes:
        return None
    what = "mixed_precision='fp8'" if not recipes else f"kwargs_handlers=[{type(recipes[0]).__name__}(...)] (an FP8 recipe)"
    cuda = not cpu and torch.cuda.is_available()
    check_fp8("cuda" if cuda else "cpu", torch.cuda.get_device_capability() if cuda else None, what)
    if not fp8:
        raise ValueError(f"{what} needs mixed_precision='fp8' (as in Accelerate); pass Accelerator(mixed_precision='fp8', ...)")
    backend = fp8_module.resolve_backend(recipes)
    fp8_module.require_backend(backend)
    return backend


def _precision_settings(base: PrecisionSettings, handlers: KwargsHandlers, *, float8: bool) -> PrecisionSettings:
    """The strategy's precision settings with what Accelerate's arguments add: FP8, `GradScalerKwargs`, `AutocastKwargs`
    (defaults change nothing). The strategy refuses what its precision cannot take (`Strategy.configure_precision`),
    except under full precision, where Accelerate ignores the handlers too: a warning says they change nothing."""
    scaler_kwargs, autocast = base.scaler_kwargs, base.autocast
    for handler in (handlers.scaler_handler, handlers.autocast_handler):
        if handler is None:
            continue
        settings = handler.to_kwargs()
        if base.mode == "no":
            if settings:
                warnings.warn(f"{type(handler).__name__}{settings} changes nothing with mixed_precision='no' (no autocast, no loss "
                              "scaling); set mixed_precision='fp16' or 'bf16' for it to apply", stacklevel=3)
        elif isinstance(handler, AutocastKwargs):
            autocast = handler.settings() if settings else autocast
        else:
            scaler_kwargs = settings or scaler_kwargs
    return dataclasses.replace(base, float8=float8, scaler_kwargs=scaler_kwargs, autocast=autocast)
