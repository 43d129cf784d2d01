"""`RunState`: what one run of the `Trainer` owns, as one object.

    state = trainer.run_state              # built with the Trainer; each fit/validate/test/predict begins it
    state.stage, state.training, state.sanity_checking   # what the run is doing
    state.progress                         # where the fit is (`LoopProgress`): epoch, steps, the accumulation window
    state.max_epochs, state.max_steps      # how long the fit trains
    state.optimizers, state.lr_scheduler_configs
    saved = state.snapshot(); ...; state.restore(saved)  # a search inside the run (trainer.fit.search)
    state.state_dict()                     # the ``loops`` entry of a checkpoint (trainer.fit.checkpointing)

The loops (`trainer.fit.loops`), the batch (`trainer.fit.batch`), the searches (`trainer.fit.search`,
`lr_finder`, `batch_size_scaling`) and checkpointing read and write it; the Trainer's Lightning attributes
(``trainer.current_epoch``, ``global_step``, ``should_stop``, ``stage``, ``training``, ``max_steps``, ...) are views
onto it (`RunStateField`), so what a user script reads or sets on the Trainer is this object's.

Optimizer steps and the accumulation window are counted in one place, the `LoopProgress` it holds
(``count_step``, ``advance_window``, ``end_batch``); the boundary rule itself is the step's
(`trainer.accelerator.stepper.Stepper.at_position`). Anchors: Composer's ``State`` (``composer/core/state.py``:
the run's state as one object the engine passes around, with its own ``state_dict``), Lightning's ``TrainerState``
(stage, training, sanity checking) with its loop progress objects (``loops/progress.py``: the saved position and its
restart rules), and torchtitan's ``TrainState``. Narrower than Composer's: the model, the loaders, the callbacks and
the metrics stay with their owners, so a snapshot is cheap and the checkpoint holds only the position (the tensors go
through the Accelerator's checkpoint parts). See docs/architecture.md, "The run state".
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, NoReturn, Self, TypeVar, overload

from trainer.fit.loss_health import LossHealth
from trainer.fit.progress import LoopProgress

if TYPE_CHECKING:
    from trainer.fit.module import LRSchedulerConfig
    from trainer.fit.trainer import Trainer

T = TypeVar("T")


@dataclass(slots=True)
class RunState:
    """The state of one run.

    Attributes:
        progress: where the fit is (saved in checkpoints: ``loops.fit_loop``); ``global_step``, ``should_stop`` and the
            accumulation window are its fields.
        max_epochs: the fit stops after this many epochs (None or -1: no limit).
        max_steps: the fit stops after this many optimizer steps (None: no limit); a search sets its own.
        stage: ``"fit"``, ``"validate"``, ``"test"``, ``"predict"``; None outside a run.
        training: between ``on_train_start`` and ``on_train_end`` (and not inside an evaluation).
        sanity_checking: during the validation batches ``fit`` runs before training.
        epoch_cut_short: 1 after a fit that ``max_steps`` ended mid-epoch: Lightning counts that epoch in
            ``current_epoch``, while the loop position keeps it open (a resume continues it).
        optimizers: the prepared optimizers of the fit.
        lr_scheduler_configs: their schedulers, with when each steps.
        eval_batches_seen: evaluation batches of this run per ``(stage, dataloader_idx)`` (a fit counts across its
            validations, not its sanity check): the step of the ``on_step`` values logged in ``validation_step``.
        num_val_batches: validation batches per epoch after limits (a list with several loaders, one count each;
            ``inf`` for a loader without a length); ``num_test_batches``, ``num_predict_batches`` the same.
        loss_health: what the fit knows of its losses (non-finite ones warned about once, skipped batches counted).
    """

    progress: LoopProgress = field(default_factory=LoopProgress)
    max_epochs: int | None = None
    max_steps: int | None = None
    stage: str | None = None
    training: bool = False
    sanity_checking: bool = False
    epoch_cut_short: int = 0
    optimizers: list[Any] = field(default_factory=list)
    lr_scheduler_configs: list[LRSchedulerConfig] = field(default_factory=list)
    eval_batches_seen: dict[tuple[str, int], int] = field(default_factory=dict)
    num_val_batches: int | float | list[int | float] = 0
    num_test_batches: int | float | list[int | float] = 0
    num_predict_batches: int | float | list[int | float] = 0
    loss_health: LossHealth = field(default_factory=LossHealth, compare=False)  # (holds a device tensor)

    # ------------------------------------------------------------------------------------ read by the Trainer's views
    @property
    def current_epoch(self) -> int:
        """The epoch as Lightning counts it: the loop's, plus one after a fit that ``max_steps`` ended mid-epoch."""
        return int(self.progress.epoch) + self.epoch_cut_short

    @property
    def global_step(self) -> int:
        """Optimizer steps taken so far."""
        return int(self.progress.global_step)

    @property
    def logging_step(self) -> int:
        """The step trackers receive: boundary batches done so far (Lightning's ``_batches_that_stepped``).

        It counts the batches that ended an accumulation window (every batch in manual optimization), and grows
        after the batch's step values and any validation it triggered were logged: the first row is step 0.
        """
        return int(self.progress.batches_that_stepped)

    @property
    def should_stop(self) -> bool:
        """A stop asked for (early stopping, a callback); agreed across processes by the loop."""
        return bool(self.progress.should_stop)

    @should_stop.setter
    def should_stop(self, value: bool) -> None:
        self.progress.should_stop = bool(value)

    def max_steps_reached(self) -> bool:
        """True once ``max_steps`` optimizer steps were taken."""
        return self.max_steps is not None and self.progress.global_step >= self.max_steps

    # ------------------------------------------------------------------------------------ the run's life
    def begin(self, stage: str) -> None:
        """A ``fit``/``validate``/``test``/``predict`` starts: its stage, and no evaluation batch counted yet."""
        self.stage, self.eval_batches_seen = stage, {}

    def begin_fit(self) -> None:
        """A fit starts from the beginning (a checkpoint restored next may move it), with no loss seen yet."""
        self.progress.reset()
        self.epoch_cut_short = 0
        self.loss_health.reset()

    def end_fit(self) -> None:
        """Training is over: an epoch that ``max_steps`` cut short counts in ``current_epoch`` (Lightning's count)."""
        self.training = False
        self.epoch_cut_short = int(self.progress.batches_done_in_epoch > 0)

    def end(self) -> None:
        """The run is over (teardown)."""
        self.stage, self.training, self.sanity_checking = None, False, False

    # ------------------------------------------------------------------------------------ one unit
    def snapshot(self) -> RunState:
        """A copy to `restore` later: a search inside the run (`trainer.fit.search`) puts the run back with it."""
        return dataclasses.replace(
            self, progress=dataclasses.replace(self.progress), optimizers=list(self.optimizers),
            lr_scheduler_configs=list(self.lr_scheduler_configs), eval_batches_seen=dict(self.eval_batches_seen),
            loss_health=self.loss_health.snapshot(),
        )

    def restore(self, saved: RunState) -> None:
        """Put every field back as it was in `saved` (what `snapshot` returned); the objects holding this state keep it."""
        for name in _FIELDS:
            if name == "progress":
                self.progress.assign(saved.progress)  # in place: a batch runner holding it sees the restored position
            elif name == "loss_health":
                self.loss_health.restore(saved.loss_health)  # in place too
            else:
                setattr(self, name, getattr(saved, name))

    def state_dict(self) -> dict[str, Any]:
        """The ``loops`` entry of a checkpoint: the fit's position (``{"fit_loop": ...}``, Lightning's key)."""
        return {"fit_loop": self.progress.state_dict()}

    def load_state_dict(self, loops: dict[str, Any]) -> None:
        """Restart from a checkpoint's ``loops`` entry (the restart rules are `LoopProgress.load_state_dict`'s)."""
        self.progress.load_state_dict(dict(loops.get("fit_loop", {})))


_FIELDS = tuple(f.name for f in dataclasses.fields(RunState))


class RunStateValue(Generic[T]):
    """A read-only `Trainer` attribute that is the property of the same name of ``trainer.run_state``
    (``trainer.global_step``: the loop counts it; setting it is an error, as in Lightning)."""

    name: str  # the attribute's, set when the class is made

    def __set_name__(self, owner: type, name: str) -> None:
        if getattr(self, "name", name) != name:  # `a = b = RunStateField()` would make both read b
            raise TypeError(f"one RunStateField cannot stand for both {owner.__name__}.{self.name} and .{name}; make one each")
        self.name = name

    @overload
    def __get__(self, trainer: None, owner: type) -> Self: ...

    @overload
    def __get__(self, trainer: Trainer, owner: type) -> T: ...

    def __get__(self, trainer: Trainer | None, owner: type) -> Any:
        if trainer is None:
            return self
        return getattr(trainer.run_state, self.name)

    def __set__(self, trainer: Trainer, value: NoReturn) -> None:
        raise AttributeError(f"trainer.{self.name} is read-only: it is the run state's (trainer.run_state.{self.name}), kept by the loop")


class RunStateField(RunStateValue[T]):
    """A `Trainer` attribute that is the field (or settable property) of the same name of ``trainer.run_state``:
    ``trainer.max_steps = 5`` and ``trainer.should_stop = True`` set the run state's."""

    def __set__(self, trainer: Trainer, value: T) -> None:
        setattr(trainer.run_state, self.name, value)
