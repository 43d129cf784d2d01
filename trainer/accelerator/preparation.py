"""The Accelerator's preparation: ``prepare`` and its parts (``prepare_model``, ``prepare_optimizer``,
``prepare_scheduler``, ``prepare_data_loader``), the joint setup an engine (DeepSpeed) does of a model and its
optimizer, FP8 conversion and compilation of a prepared model, and the checks of what ``prepare`` is given.

What a preparation produces is recorded in ``accelerator.prepared`` (`trainer.accelerator.registry.Prepared`), which
checkpoints read; the strategy does the work (placement, wrapping, sharding, the sharded data loader).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

from strategies import Strategy
from strategies import fp8 as fp8_module
from strategies.abilities import Engine, Float8AllGather
from strategies.compile import apply_compile, recompile_with, unwrap_compiled
from trainer.accelerator import layout
from trainer.accelerator.config import DataLoaderConfiguration, TorchDynamoPlugin
from trainer.accelerator.dummies import DummyOptim, DummyScheduler, EngineScheduler, auto_values, check_placeholders
from trainer.accelerator.kwargs import AORecipeKwargs
from trainer.accelerator.layout import ProcessLayout
from trainer.accelerator.registry import Prepared
from trainer.accelerator.wrappers import PreparedOptimizer, PreparedScheduler

if TYPE_CHECKING:
    from strategies.data import DataLoaderShard
    from trainer.accelerator.accelerator import Accelerator


class Preparation(ProcessLayout):
    """The preparation part of the `Accelerator`: what ``prepare`` does to each kind of object."""

    __slots__ = ()
    prepared: Prepared
    dataloader_config: DataLoaderConfiguration
    device_placement: bool
    dynamo_plugin: TorchDynamoPlugin
    rng_types: list[str]
    ao_recipe_handler: AORecipeKwargs | None
    _resets: int

    @property
    def fp8_enabled(self) -> bool:
        """Whether this run trains in FP8 (``mixed_precision="fp8"``): Linear layers converted at `prepare`."""
        return self.strategy.precision.float8

    @property
    def split_batches(self) -> bool:
        return self.dataloader_config.split_batches

    @property
    def even_batches(self) -> bool:
        return self.dataloader_config.even_batches

    def _to_float8(self, model: nn.Module, evaluation_mode: bool = False) -> nn.Module:
        """With FP8: swap the model's eligible linear layers for torchao's Float8Linear, before any wrapping."""
        if not self.fp8_enabled or evaluation_mode:
            return model
        return fp8_module.convert_to_float8(model, self.ao_recipe_handler)

    def init_module(self, empty_init: bool | None = None) -> AbstractContextManager[None]:
        """Build the model inside this block, where the strategy wants it (Lightning's ``init_module``).

        Single device and DDP: on the device, in the dtype of a ``-true`` precision. FSDP2: on the meta device, so
        `prepare` shards the empty model and each process initializes only its shards. DeepSpeed ZeRO-3: partitioned
        as it is built. ``empty_init=False`` asks for a full real copy on every process; ``True`` for an empty one.
        """
        return self.strategy.module_init_context(empty_init)

    def prepare(self, *args: Any, device_placement: list[bool] | None = None) -> Any:
        """Prepare models, optimizers, schedulers and data loaders, in any order; returned in the same order."""
        if device_placement is not None and len(device_placement) != len(args):
            raise ValueError(f"device_placement has {len(device_placement)} entries but prepare got {len(args)} objects; give one per object")
        placements = device_placement or [self.device_placement] * len(args)
        if self._resets != layout.resets[0]:
            raise AttributeError(
                "`AcceleratorState` object has no attribute `distributed_type` for this Accelerator: it was made before "
                "the last AcceleratorState._reset_state(). This happens if `AcceleratorState._reset_state()` was called "
                "and an `Accelerator` or `PartialState` was not reinitialized; make a new Accelerator"
            )
        _check_placeholders(self.strategy, args)
        for obj in args:
            if not isinstance(obj, (nn.Module, torch.optim.Optimizer, torch.utils.data.DataLoader, DummyOptim, DummyScheduler)) and not _is_scheduler(obj):
                # Accelerate returns what it does not know unchanged, silently; data that is not a DataLoader is the costly case
                data = isinstance(obj, torch.utils.data.Dataset) or (hasattr(obj, "__iter__") and not isinstance(obj, (str, bytes, Mapping)))
                fix = (
                    ", so every process reads all of it (nothing is sharded). Wrap the data in a torch.utils.data.DataLoader (for "
                    "a generator or stream: over an IterableDataset whose __iter__ yields the samples) and prepare that loader"
                    if data else "; prepare() takes models, optimizers, LR schedulers and torch.utils.data.DataLoader objects: "
                    "leave this one out of prepare() and use it as it is"
                )
                name = type(obj).__name__
                warnings.warn(
                    f"prepare() got {'an' if name[:1] in 'aeiouAEIOU' else 'a'} {name} ({obj!r:.60}), which it does not prepare; "
                    f"it is returned unchanged{fix}",
                    stacklevel=2,
                )
        # Models first: optimizers must see the parameters after they moved to the device.
        out: list[Any] = list(args)
        done = self._prepare_jointly(args, out, placements) if isinstance(self.strategy, Engine) else set()
        for i, obj in enumerate(args):
            if isinstance(obj, nn.Module) and i not in done:
                out[i] = self.prepare_model(obj, device_placement=placements[i])
        for i, obj in enumerate(args):
            if isinstance(obj, torch.optim.Optimizer) and i not in done:
                out[i] = self.prepare_optimizer(obj)
        models = [o for o in out if isinstance(o, nn.Module)]
        optimizers = [o.optimizer for o in out if isinstance(o, PreparedOptimizer)]
        if self.fp8_enabled and isinstance(self.strategy, Float8AllGather) and models and optimizers \
                and fp8_module.uses_fsdp_float8_all_gather(self.ao_recipe_handler):
            # FSDP2 with float8 all-gather: refresh the float8 weight scales after each step (Accelerate, torchao)
            self.strategy.precompute_float8_scales_after_step(optimizers[0], models[0])
        for i, obj in enumerate(args):
            if i in done:
                continue
            if _is_scheduler(obj):
                out[i] = self.prepare_scheduler(obj)
            elif isinstance(obj, torch.utils.data.DataLoader):
                out[i] = self.prepare_data_loader(obj, device_placement=placements[i])
        return out[0] if len(out) == 1 else tuple(out)

    def _prepare_jointly(self, args: tuple[Any, ...], out: list[Any], placements: list[bool]) -> set[int]:
        """Set up the model and its optimizer in one strategy call (DeepSpeed's engine builds both at once);
        returns the positions in `args` it prepared."""
        models = [i for i, obj in enumerate(args) if isinstance(obj, nn.Module)]
        optimizers = [i for i, obj in enumerate(args) if isinstance(obj, torch.optim.Optimizer) and not isinstance(obj, PreparedOptimizer)]
        if not models:
            if optimizers:
                self.strategy.setup_optimizer(args[optimizers[0]])  # raises: the optimizer needs its model in this call
            return set()
        if len(models) > 1:
            raise ValueError(
                f"strategy={self.strategy.name!r} drives one model per Accelerator, but prepare() got {len(models)}; "
                "combine them into one nn.Module, or prepare the others with accelerator.prepare_model(m, evaluation_mode=True)"
            )
        loaders = [obj for obj in args if isinstance(obj, torch.utils.data.DataLoader) and obj.batch_size]
        batch_size = None
        if loaders:
            batch_size = int(loaders[0].batch_size or 1) // (self.num_processes if self.split_batches else 1) or 1
        i = models[0]
        model, compiled = unwrap_compiled(args[i])
        model = self._to_float8(model)
        # DummyOptim / DummyScheduler: the engine builds the optimizer and schedule its config describes
        dummy = next((j for j, obj in enumerate(args) if isinstance(obj, DummyOptim)), None)
        schedule = next((j for j, obj in enumerate(args) if isinstance(obj, DummyScheduler)), None)
        engine = self.strategy
        assert isinstance(engine, Engine)
        engine.fill_auto(auto_values(None if dummy is None else args[dummy], None if schedule is None else args[schedule],
                                            self.num_processes, self.split_batches))
        wrapped, prepared = engine.setup_module_and_optimizers(
            model, [args[j] for j in optimizers], move=placements[i] is not False, batch_size=batch_size,
            model_parameters=None if dummy is None else args[dummy].params,
            lr_scheduler=None if schedule is None else args[schedule].lr_scheduler_callable,
        )
        if dummy is not None:
            optimizers = [dummy]
        self.strategy.precision.convert_module(self.strategy.unwrap_module(wrapped))
        self._compile(wrapped, compiled)
        self.prepared.models.append(wrapped)
        out[i] = wrapped
        for j, optimizer in zip(optimizers, prepared):
            out[j] = PreparedOptimizer(optimizer, cast("Accelerator", self), original=args[j])
            self.prepared.optimizers.append(out[j])
        if schedule is not None:
            out[schedule] = self.prepare_scheduler(EngineScheduler(wrapped.lr_scheduler))
            return {i, *optimizers, schedule}
        return {i, *optimizers}

    def prepare_model(self, model: nn.Module, device_placement: bool | None = None, evaluation_mode: bool = False) -> nn.Module:
        """Place `model` on the device and wrap it for the strategy (DDP, FSDP); ``evaluation_mode`` skips the wrapping.

        ``device_placement=False`` leaves the model where the user put it.
        """
        move = device_placement is not False
        model, compiled = unwrap_compiled(model)  # torch.compile(model): set the model up, then compile it the same way
        model = self._to_float8(model, evaluation_mode)
        model = self.strategy.setup_module(model, move=move, wrap=not evaluation_mode)
        self.strategy.precision.convert_module(self.strategy.unwrap_module(model))
        self._compile(model, compiled)
        self.prepared.models.append(model)
        return model

    def _compile(self, model: nn.Module, dynamo_ctx: Any) -> None:
        """Compile the set-up model: as the ``torch.compile`` wrapper it came in asked, or as `dynamo_plugin` says."""
        inner = self.strategy.unwrap_module(model)
        if dynamo_ctx is not None:
            recompile_with(inner, dynamo_ctx)
        elif self.dynamo_plugin.enabled:
            apply_compile(inner, self.dynamo_plugin.config())

    def prepare_optimizer(self, optimizer: torch.optim.Optimizer) -> PreparedOptimizer:
        if isinstance(optimizer, PreparedOptimizer):
            return optimizer
        prepared = PreparedOptimizer(self.strategy.setup_optimizer(optimizer), cast("Accelerator", self))
        self.prepared.optimizers.append(prepared)
        return prepared

    def prepare_scheduler(
        self, scheduler: torch.optim.lr_scheduler.LRScheduler | torch.optim.lr_scheduler.ReduceLROnPlateau | EngineScheduler,
    ) -> PreparedScheduler:
        if isinstance(scheduler, PreparedScheduler):
            return scheduler
        prepared = PreparedScheduler(scheduler, cast("Accelerator", self), [o for o in self.prepared.optimizers if o.steps(scheduler.optimizer)])
        self.prepared.schedulers.append(prepared)
        return prepared

    def prepare_data_loader(
        self, data_loader: torch.utils.data.DataLoader, device_placement: bool | None = None, *, even_batches: bool | None = None,
        register: bool = True, shard: bool = True,
    ) -> DataLoaderShard:
        """Shard `data_loader` across the processes.

        Args:
            data_loader: a ``torch.utils.data.DataLoader`` (a loader prepared before is returned as is).
            device_placement: move batches to ``self.device`` (default: the Accelerator's setting).
            even_batches: pad the tail so every process gets as many batches (default: the Accelerator's setting);
                ``False`` leaves it short, so each sample is seen exactly once (evaluation).
            register: track the loader for ``save_state``/``load_state`` and for syncing gradients at its end;
                ``False`` for loaders outside the training loop (evaluation).
            shard: ``False`` gives every process the whole loader (the Trainer's ``use_distributed_sampler=False``);
                batches are still moved to the device and a shuffling loader shuffles alike on every process.
        """
        from strategies.data import DataLoaderShard, prepare_data_loader  # lazy: `import trainer.accelerator` does not load strategies.data

        if isinstance(data_loader, DataLoaderShard):
            return data_loader
        if self.use_distributed:
            _check_same_length(self.strategy, data_loader)
        config = self.dataloader_config
        seed = None
        if config.use_seedable_sampler:
            # Accelerate's seed: data_seed, else the one set_seed set. Taken from process 0, so that processes seeded
            # differently (set_seed(device_specific=True)) still share one order: every sample once per epoch.
            seed = config.data_seed if config.data_seed is not None else torch.random.initial_seed()
            seed = self.prepared.data_seed = int(self.strategy.broadcast_object(seed, 0))
        several = shard and self.strategy.data_parallel_size > 1
        prepared = prepare_data_loader(
            data_loader,
            device=self.device,
            num_processes=self.strategy.data_parallel_size if shard else 1,  # (a tensor-parallel group shares a batch)
            process_index=self.strategy.data_parallel_rank if shard else 0,
            split_batches=self.split_batches and shard,
            even_batches=self.even_batches if even_batches is None else bool(even_batches),
            put_on_device=self.device_placement if device_placement is None else device_placement,
            non_blocking=config.non_blocking,
            seed=seed,
            dispatch_batches=config.dispatch_batches,
            synchronize=rng_synchronizer(self.rng_types) if several and self.rng_types else None,
        )
        if register:
            self.prepared.dataloaders.append(prepared)
        return prepared


def _check_placeholders(strategy: Strategy, args: tuple[Any, ...]) -> None:
    """`DummyOptim`/`DummyScheduler` go with an engine whose config describes them (Accelerate's rules)."""
    optimizer = next((o for o in args if isinstance(o, (torch.optim.Optimizer, DummyOptim))), None)
    scheduler = next((o for o in args if _is_scheduler(o) or isinstance(o, DummyScheduler)), None)
    config = strategy.config if isinstance(strategy, Engine) else None
    if config is not None or isinstance(optimizer, DummyOptim) or isinstance(scheduler, DummyScheduler):
        check_placeholders(config, optimizer, scheduler, strategy.name)


_RNG_TYPES = ("generator", "torch", "cuda")


def checked_rng_types(rng_types: Any) -> list[str]:
    """Accelerate's ``rng_types`` as names (default ``["generator"]``); a type this machine cannot synchronize is refused."""
    if rng_types is None:
        return ["generator"]
    if isinstance(rng_types, str) or not all(isinstance(getattr(kind, "value", kind), str) for kind in rng_types):
        raise TypeError(f"rng_types={rng_types!r} must be a list of names, e.g. ['generator'] or ['torch', 'generator']")
    names = [str(getattr(kind, "value", kind)) for kind in rng_types]
    bad = [name for name in names if name not in _RNG_TYPES or (name == "cuda" and not torch.cuda.is_available())]
    if bad:
        raise ValueError(
            f"rng_types={names!r}: {bad[0]!r} cannot be synchronized here; choose from {list(_RNG_TYPES)} "
            "('cuda' needs a CUDA device), or leave rng_types out (['generator'])"
        )
    return names


def rng_synchronizer(rng_types: list[str]) -> Any:
    """What a prepared loader calls as each pass starts: set the ``rng_types`` RNGs to process 0's, the sampler's
    generator only where it has one (as Accelerate's loader calls ``synchronize_rng_states``)."""
    from trainer.accelerator.operations import synchronize_rng_states  # lazy: it loads strategies.data

    def synchronize(generator: torch.Generator | None) -> None:
        synchronize_rng_states([kind for kind in rng_types if kind != "generator" or generator is not None], generator)

    return synchronize


def _check_same_length(strategy: Strategy, data_loader: Any) -> None:
    """Every process must pass the same data set (it is sharded here); lengths that differ would hang the job."""
    try:
        length: int | None = len(data_loader.dataset)
    except (TypeError, AttributeError):
        length = None  # an iterable data set of unknown length
    lengths = strategy.all_gather_object(length)
    if len(set(lengths)) > 1:
        raise ValueError(
            f"the data set passed to prepare() has {lengths} samples on processes 0..{len(lengths) - 1}: every process must pass "
            "the same data set, which prepare() shards (each process gets its own part); pass the whole data set on every process"
        )


def _is_scheduler(obj: Any) -> bool:
    return isinstance(obj, (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau))


