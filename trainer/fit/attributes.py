"""The Trainer's attributes, as Lightning names them: what the run is made of and where it runs.

``trainer.accelerator``, ``strategy``, ``world_size``, ``global_rank``, ``is_global_zero``, ``model`` (as the strategy
wrapped it), ``train_dataloader``, ``num_training_batches``, ``accumulate_grad_batches``, ``estimated_stepping_batches``,
``checkpoint_callback``, ``checkpoints``, ``fit_progress``, ... Each reads the part of the Trainer that owns it (the
`Accelerator`, ``run_state``, ``model_setup``, ``loaders``, ``validation_schedule``); none holds state of its own. The
run's position and flags (``current_epoch``, ``global_step``, ``should_stop``, ``max_steps``, ...) are views onto
``run_state`` declared on the `Trainer` itself (`trainer.fit.run_state.RunStateField`); what is logged, and the
trackers, are `trainer.fit.metrics`'.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from callbacks.view import ValidationSchedule
from trainer.fit.dispatch import HookDispatcher

if TYPE_CHECKING:
    from callbacks.base import Callback
    from callbacks.checkpoint import ModelCheckpoint
    from strategies.base import Strategy
    from strategies.checkpoint_store import CheckpointStore
    from trainer.accelerator.accelerator import Accelerator
    from trainer.fit.args import TrainerArgs
    from trainer.fit.combined_loader import CombinedLoader
    from trainer.fit.loaders import RunLoaders
    from trainer.fit.model_setup import ModelSetup
    from trainer.fit.module import TrainModule
    from trainer.fit.progress import LoopProgress
    from trainer.fit.run_state import RunState


class TrainerAttributes:
    """Lightning's attributes of the `Trainer` (the part of the class that reads, and sets, what its parts own)."""

    _args: TrainerArgs
    _accelerator: Accelerator | None
    _dispatch: HookDispatcher
    run_state: RunState
    lightning_module: TrainModule | None
    model_setup: ModelSetup
    loaders: RunLoaders
    validation_schedule: ValidationSchedule
    callbacks: list[Callback]

    @property
    def fit_progress(self) -> LoopProgress:
        """Where the fit is (`run_state.progress`): epoch, global step, the accumulation window, batches done."""
        return self.run_state.progress

    @property
    def args(self) -> TrainerArgs:
        """The checked constructor arguments (`trainer.fit.args.TrainerArgs`), read-only."""
        return self._args

    @property
    def module(self) -> TrainModule | None:
        """The user's module (unwrapped)."""
        return self.lightning_module

    @property
    def dispatch(self) -> HookDispatcher:
        """The run's hook dispatcher: every hook of the module and the callbacks, in Lightning's order."""
        return self._dispatch

    @dispatch.setter
    def dispatch(self, dispatcher: HookDispatcher) -> None:
        # a search inside the run (trainer.fit.search) trains with its own callback's dispatcher, then puts this one back
        if not isinstance(dispatcher, HookDispatcher):
            raise TypeError(f"trainer.dispatch must be a trainer.fit.dispatch.HookDispatcher, got {type(dispatcher).__name__}")
        self._dispatch = dispatcher

    @property
    def attached_module(self) -> TrainModule:
        """The module of the running ``fit``/``validate``/``test``/``predict``; raises outside one."""
        if self.lightning_module is None:
            raise RuntimeError("no module is attached to this Trainer; call fit/validate/test/predict with a TrainModule first")
        return self.lightning_module

    @property
    def model(self) -> torch.nn.Module | None:
        """The module as the strategy wrapped it (DDP, FSDP, DeepSpeed's engine) in the running or last run, else None; Lightning's."""
        model: torch.nn.Module | None = self.model_setup.model
        return model

    @property
    def accelerator(self) -> Accelerator:
        """The `Accelerator` this Trainer drives (device, strategy, collectives, checkpoint I/O)."""
        if self._accelerator is None:
            raise RuntimeError(
                f"this Trainer asks for {self._args.devices} processes, which start at trainer.fit(): it has no Accelerator "
                "before that. Start the script with `trainer launch` or torchrun to have one from the start"
            )
        return self._accelerator

    @property
    def strategy(self) -> Strategy:
        """The `Strategy` of the run: its collectives (``broadcast_object``, ...) work on every process."""
        return self.accelerator.strategy

    @property
    def world_size(self) -> int:
        return self._accelerator.num_processes if self._accelerator is not None else 1

    @property
    def global_rank(self) -> int:
        return self._accelerator.process_index if self._accelerator is not None else 0

    @property
    def local_rank(self) -> int:
        return self._accelerator.local_process_index if self._accelerator is not None else 0

    @property
    def val_check_interval(self) -> int | float | None:
        return self.validation_schedule.val_check_interval

    @property
    def check_val_every_n_epoch(self) -> int:
        return self.validation_schedule.check_val_every_n_epoch

    @property
    def num_training_batches(self) -> int | float:
        """Training batches per epoch on this process, after limits; ``float("inf")`` for a loader without a length (a stream)."""
        return self.validation_schedule.num_training_batches

    @num_training_batches.setter
    def num_training_batches(self, value: int | float) -> None:
        self.validation_schedule = dataclasses.replace(self.validation_schedule, num_training_batches=value)

    @property
    def accumulate_grad_batches(self) -> int:
        """Batches per optimizer step: the accelerator's, which its `Stepper` counts (settable, as Lightning's)."""
        acc = self._accelerator
        return acc.gradient_accumulation_steps if acc is not None else self._args.accumulate_grad_batches

    @accumulate_grad_batches.setter
    def accumulate_grad_batches(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"accumulate_grad_batches={value!r} must be an int >= 1")
        if self._accelerator is None:
            raise RuntimeError("accumulate_grad_batches can be set once the processes run (in fit, or under `trainer launch`)")
        self._accelerator.gradient_accumulation_steps = value

    @property
    def is_global_zero(self) -> bool:
        return self.global_rank == 0

    @property
    def checkpoint_callback(self) -> ModelCheckpoint | None:
        """The first `ModelCheckpoint` callback (or subclass), or None."""
        from callbacks.checkpoint import ModelCheckpoint  # lazy: `from trainer import Trainer` loads no built-in callback

        return next((cb for cb in self.callbacks if isinstance(cb, ModelCheckpoint)), None)

    @property
    def train_dataloader(self) -> torch.utils.data.DataLoader | CombinedLoader | None:
        """The training loader of the running ``fit`` (prepared: sharded, on the device), None outside one; Lightning's."""
        loader: torch.utils.data.DataLoader | CombinedLoader | None = self.loaders.train
        return loader

    def train_step_batches(self) -> Iterator[Any]:
        """One pass over the training loader of the running ``fit``, each batch as ``training_step`` gets it."""
        return self.loaders.train_step_batches()

    @property
    def estimated_stepping_batches(self) -> int | float:
        """Optimizer steps the whole ``fit`` will take (from the train loader length, epochs and max_steps).

        A train loader without a length (a stream) gives ``max_steps``, or ``float("inf")`` without it: the number is unknown.
        """
        if math.isinf(self.num_training_batches):
            return self.run_state.max_steps if self.run_state.max_steps is not None else math.inf
        per_epoch = math.ceil(self.num_training_batches / self.accumulate_grad_batches)
        epochs = self.run_state.max_epochs if self.run_state.max_epochs not in (None, -1) else None
        total = per_epoch * epochs if epochs is not None else math.inf
        if self.run_state.max_steps is not None:
            total = min(total, self.run_state.max_steps)
        return int(total) if total != math.inf else math.inf

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on the global main process only."""
        if self.is_global_zero:
            print(*args, **kwargs)

    @property
    def checkpoints(self) -> CheckpointStore:
        """The checkpoint store of this run (the accelerator's): the layout on disk and the save in flight."""
        return self.accelerator.checkpoints
