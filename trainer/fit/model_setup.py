"""The module of a `Trainer`'s runs as the strategy sets it up (``trainer.model_setup``): Lightning's
``configure_model`` in the strategy's init context, ``sync_batchnorm``, the strategy's wrapper (``trainer.model``), a
``torch.compile`` applied after it, and the optimizers and schedulers ``configure_optimizers`` returns, prepared
after the module (a sharding strategy replaces the parameters they step).
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import torch

from callbacks.base import overrides
from strategies.abilities import Engine
from strategies.compile import recompile_with, unwrap_compiled
from trainer.fit.combined_loader import CombinedLoader
from trainer.fit.module import TrainModule, parse_optimizers

if TYPE_CHECKING:
    from trainer.fit.trainer import Trainer


class ModelSetup:
    """How `trainer` set its module up (``trainer.model_setup``)."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.model: Any = None  # the module as the strategy wrapped it (DDP, FSDP, an engine), for the last module set up
        self.prepared_for: int | None = None  # id() of that module
        self.compile_ctx: Any = None  # the dynamo context of a torch.compile(module) passed to fit/validate/...

    def release_previous_fit(self) -> None:
        """A later ``fit`` of this Trainer (after ``Tuner.lr_find``, or to train on) starts clean: the optimizers, schedulers
        and train loader the previous one prepared leave the accelerator, so checkpoints hold this fit's alone."""
        old, state = self.trainer.loaders.train, self.trainer.run_state
        schedulers = [config.scheduler for config in state.lr_scheduler_configs]
        parts = list(old.flattened) if isinstance(old, CombinedLoader) else [old] if old is not None else []
        self.trainer.accelerator.prepared.forget(*state.optimizers, *schedulers, *parts)
        state.optimizers, state.lr_scheduler_configs, self.trainer.loaders.train = [], [], None

    def configure_optimizers(self, module: TrainModule) -> None:
        """Prepare `module` first, then build its optimizers: a sharding strategy replaces the parameters they step."""
        strategy = self.trainer.accelerator.strategy
        joint = isinstance(strategy, Engine)  # an engine (DeepSpeed) takes the module and its optimizer in one setup
        if joint and self.prepared_for == id(module):
            raise RuntimeError(
                f"strategy={strategy.name!r} set this module up in an earlier fit; its engine cannot take new optimizers. "
                "Use a new Trainer and a fresh module (or TrainModule.load_from_checkpoint) for another fit"
            )
        if not joint and self.prepared_for != id(module):
            self.sync_batchnorm(module)
            self.model, self.prepared_for = self.prepare(module), id(module)
        optimizers, configs = parse_optimizers(module.configure_optimizers())
        if module.automatic_optimization and len(optimizers) != 1:
            raise ValueError(
                f"automatic optimization needs exactly one optimizer, configure_optimizers returned {len(optimizers)}; "
                "set self.automatic_optimization = False and step them in training_step (see docs/trainer.md)"
            )
        if joint:
            self.sync_batchnorm(module)
            strategy.agree_clipping(self.trainer.gradient_clip_val, self.trainer.gradient_clip_algorithm)
            prepared = self.prepare(module, *optimizers)
            self.model, self.prepared_for = prepared[0], id(module)
            self.trainer.run_state.optimizers = list(prepared[1:])
        else:
            self.trainer.run_state.optimizers = [self.trainer.accelerator.prepare_optimizer(o) for o in optimizers]
        for config in configs:  # prepared so that checkpoints hold their state; stepped by the loop itself
            self.trainer.accelerator.prepare_scheduler(config.scheduler)
        self.trainer.run_state.lr_scheduler_configs = configs

    def prepare(self, module: TrainModule, *optimizers: Any) -> Any:
        """`Accelerator.prepare` of the module (and, for an engine, its optimizers), compiled after it when asked."""
        prepared = self.trainer.accelerator.prepare(module, *optimizers)
        if self.compile_ctx is not None:  # fit(torch.compile(module)): the same compile, applied after sharding
            recompile_with(module, self.compile_ctx)
        return prepared

    def unwrap_compiled(self, module: TrainModule) -> Any:
        """``torch.compile(module)`` is accepted as Lightning does: the `TrainModule` runs, its forward compiled after setup."""
        module, ctx = unwrap_compiled(module)
        if ctx is not None and self.trainer.args.compile is not None:
            raise ValueError(
                "the module passed is compiled (torch.compile) and this Trainer was built with compile=...: pick one; pass the "
                "plain module to compile it as the Trainer's compile= says, after the strategy set it up"
            )
        if ctx is not None:
            self.compile_ctx = ctx
        return module

    def configure_model(self, module: TrainModule) -> None:
        """Lightning's ``configure_model`` hook, once per run before the module is set up, in the strategy's init context."""
        legacy = overrides(module, "configure_sharded_model", TrainModule)
        if legacy and overrides(module, "configure_model", TrainModule):
            raise RuntimeError(f"{type(module).__name__} defines both configure_model and configure_sharded_model (its old, "
                               "deprecated name); keep configure_model only")
        if legacy:
            warnings.warn(f"{type(module).__name__}.configure_sharded_model is deprecated (as in Lightning); rename it to "
                          "configure_model", DeprecationWarning, stacklevel=2)
        elif not overrides(module, "configure_model", TrainModule):
            return
        with self.trainer.accelerator.strategy.module_init_context():
            if legacy:
                module.configure_sharded_model()
            else:
                module.configure_model()

    def sync_batchnorm(self, module: TrainModule) -> None:
        """``sync_batchnorm``: BatchNorm layers become SyncBatchNorm (in place) before the module is wrapped; one process: nothing."""
        if self.trainer.args.sync_batchnorm and self.trainer.world_size > 1:
            torch.nn.SyncBatchNorm.convert_sync_batchnorm(module)
