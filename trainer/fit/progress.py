"""`LoopProgress`: where a fit is — the one object the loops advance, checkpoints save, and a resume restarts from.

It is the position part of the run's state (`trainer.fit.run_state.RunState.progress`); ``trainer.global_step``,
``current_epoch`` and ``should_stop`` read it. It is the one place that counts: optimizer steps (`count_step`, the
only increment of `global_step`), the accumulation window (`advance_window`: the position the step's
boundary rule, `Stepper.at_position`, is asked about) and the batches of an epoch (`end_batch`, `close_stepping_batch`,
`next_epoch`); the loops and the batch call these and write none of those counts themselves. Its `state_dict` is the
``loops.fit_loop`` entry of a checkpoint, and `load_state_dict` owns the rules for restarting from a checkpoint written
at any point of a batch (see there).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class LoopProgress:
    """The position of a fit.

    Attributes:
        epoch: the current epoch (0-based).
        global_step: optimizer steps taken.
        batches_that_stepped: batches that ended with an optimizer step, counted once the batch is over (the trackers'
            step, which Lightning also counts apart from ``global_step``).
        stepping_batch_open: a checkpoint written during a batch that stepped (its end hooks, or a validation inside
            it) before `batches_that_stepped` counted it.
        batches_done_in_epoch: training batches of this epoch already run.
        accumulation_position: batches of the current accumulation window already run (0: at a boundary).
        accumulated: batches whose gradients are accumulated but not yet stepped.
        should_stop: a stop asked for (early stopping, a callback); agreed across processes by the loop.
        validation_pending: the validation due after the last batch has not run yet.
        is_last_batch: the last batch run was the epoch's last (a stream's end is known only then).
    """

    epoch: int = 0
    global_step: int = 0
    batches_that_stepped: int = 0
    stepping_batch_open: bool = False
    batches_done_in_epoch: int = 0
    accumulation_position: int = 0
    accumulated: int = 0
    should_stop: bool = False
    validation_pending: bool = False
    is_last_batch: bool = False

    # counting: the only writers of the step, window and epoch fields ------------------------------------------
    @property
    def at_boundary(self) -> bool:
        """The next batch starts an accumulation window (the last one ended one): where gradients are zeroed, and
        where a preemption checkpoint may be written."""
        return self.accumulation_position == 0

    def advance_window(self, boundary: bool, backward: bool) -> None:
        """A batch of the window ran (automatic optimization). `backward`: its backward ran, and its gradients wait
        for the window's optimizer step; `boundary`: it ended the window (the step's rule, `Stepper.at_position`)."""
        self.accumulated += backward  # (a bool: 1 when the backward ran)
        self.accumulation_position = 0 if boundary else self.accumulation_position + 1

    def rewind_window(self, position: int) -> None:
        """The batch at `position` of the window runs again (an optimizer calling its closure again, LBFGS)."""
        self.accumulation_position = position

    def count_step(self) -> None:
        """One optimizer step was taken (automatic or manual optimization): the one place `global_step` grows."""
        self.global_step += 1
        self.accumulated = 0

    def end_batch(self, batch_idx: int, last: bool) -> bool:
        """Training batch `batch_idx` is over (`last`: the epoch's last); returns whether it ended a window (every
        batch in manual optimization), which then counts in `batches_that_stepped` once `close_stepping_batch` runs."""
        self.batches_done_in_epoch, self.is_last_batch = batch_idx + 1, last
        self.stepping_batch_open = boundary = self.accumulation_position == 0
        return boundary

    def close_stepping_batch(self) -> None:
        """A window's last batch counts once its step values and any validation after it were logged at its step."""
        if self.stepping_batch_open:
            self.batches_that_stepped += 1
            self.stepping_batch_open = False

    def next_epoch(self) -> None:
        """The epoch is over: the next one starts at its first batch."""
        self.epoch += 1
        self.batches_done_in_epoch = 0
        self.is_last_batch = False

    # saving and restoring ------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def assign(self, other: LoopProgress) -> None:
        """Take every field of `other` (a copy taken earlier), in place."""
        for field in dataclasses.fields(self):
            setattr(self, field.name, getattr(other, field.name))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restart from a saved position (what `state_dict` returned, in any earlier checkpoint format).

        A checkpoint written inside a batch that stepped (at its end hooks, or during the validation due after it)
        has `stepping_batch_open`: without a validation pending that batch is over, and counts now; with one, it
        closes after that validation, which the resumed loop runs first. Fields a checkpoint lacks take their
        defaults; unknown ones are refused.
        """
        known = {field.name for field in dataclasses.fields(self)}
        unknown = sorted(set(state) - known)
        if unknown:
            raise ValueError(f"the checkpoint's loop position has fields this version does not know: {unknown}; upgrade Trainwright to resume it")
        fresh = LoopProgress()
        for name in known:
            setattr(self, name, type(getattr(fresh, name))(state.get(name, getattr(fresh, name))))
        if "batches_that_stepped" not in state:  # written before the trackers had their own step
            self.batches_that_stepped = self.global_step
        if self.stepping_batch_open and not self.validation_pending:
            self.batches_that_stepped += 1
        self.stepping_batch_open = self.stepping_batch_open and self.validation_pending

    def reset(self) -> None:
        """The position of a fit that has not started."""
        self.load_state_dict({})
