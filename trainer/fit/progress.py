"""`LoopProgress`: where a fit is — the one object the loops advance, checkpoints save, and a resume restarts from.

The loops (`trainer.fit.loops`, `trainer.fit.batch`) write its fields; ``trainer.global_step``, ``current_epoch`` and
``should_stop`` read them. Its `state_dict` is the ``loops.fit_loop`` entry of a checkpoint, and `load_state_dict` owns
the rules for restarting from a checkpoint written at any point of a batch (see there).
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

    def state_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

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
