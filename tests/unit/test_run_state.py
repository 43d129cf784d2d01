"""`RunState`: the state of one Trainer run as one object — counted in one place, snapshotted and restored whole,
saved in the checkpoint format that was there before it, and read and set through the Trainer's Lightning attributes."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from callbacks.base import Callback
from trainer.fit.module import TrainModule
from trainer.fit.progress import LoopProgress
from trainer.fit.run_state import RunState
from trainer.fit.trainer import Trainer

QUIET: dict[str, Any] = dict(log_with=None, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)


class Net(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _data(n: int = 10) -> DataLoader:
    torch.manual_seed(1)
    return DataLoader(TensorDataset(torch.randn(n, 2), torch.randn(n, 1)), batch_size=2)


def test_the_window_and_the_steps_are_counted_by_the_progress_alone() -> None:
    progress = LoopProgress()
    boundaries = []
    for batch_idx in range(5):  # accumulation over 2 batches; the epoch's last batch (4) ends its window too
        last = batch_idx == 4
        boundary = progress.accumulation_position + 1 >= 2 or last  # the step's rule (Stepper.at_position)
        progress.advance_window(boundary, backward=True)
        if boundary:
            progress.count_step()
        boundaries.append(progress.end_batch(batch_idx, last))
        progress.close_stepping_batch()
    assert boundaries == [False, True, False, True, True]
    assert (progress.global_step, progress.batches_that_stepped, progress.accumulated) == (3, 3, 0)
    assert (progress.batches_done_in_epoch, progress.is_last_batch, progress.at_boundary) == (5, True, True)
    progress.next_epoch()
    assert (progress.epoch, progress.batches_done_in_epoch, progress.is_last_batch) == (1, 0, False)


def test_a_snapshot_restores_the_whole_run_in_place() -> None:
    state = RunState(max_epochs=3, max_steps=10)
    state.begin("fit")
    state.training, state.optimizers = True, ["opt"]
    state.progress.global_step, state.progress.epoch = 4, 1
    state.eval_batches_seen[("validation", 0)] = 7
    state.loss_health.skipped = 2
    progress, health = state.progress, state.loss_health
    saved = state.snapshot()
    state.max_steps, state.training, state.optimizers, state.lr_scheduler_configs = 99, False, [], []
    state.progress.reset()
    state.progress.should_stop = True
    state.eval_batches_seen[("validation", 0)] = 100
    state.loss_health.reset()
    state.end()
    state.restore(saved)
    assert state == saved and state.progress is progress  # in place: a batch runner holding the progress sees it
    assert state.loss_health is health and health.skipped == 2
    assert (state.stage, state.max_steps, state.training, state.global_step, state.current_epoch) == ("fit", 10, True, 4, 1)
    assert state.eval_batches_seen == {("validation", 0): 7} and not state.should_stop


def test_the_checkpoint_entry_is_the_loop_position_under_fit_loop() -> None:
    state = RunState()
    state.progress.global_step, state.progress.batches_done_in_epoch = 6, 3
    entry = state.state_dict()
    assert list(entry) == ["fit_loop"] and entry["fit_loop"] == state.progress.state_dict()
    older = {"fit_loop": {"epoch": 2, "global_step": 40, "batches_done_in_epoch": 0}}  # written before batches_that_stepped
    state.load_state_dict(older)
    assert (state.current_epoch, state.global_step, state.logging_step) == (2, 40, 40)
    with pytest.raises(ValueError, match="fields this version does not know"):
        state.load_state_dict({"fit_loop": {"epoch": 1, "from_the_future": 1}})


def test_the_trainers_lightning_attributes_are_views_onto_the_run_state(tmp_path: Any) -> None:
    trainer = Trainer(project_dir=tmp_path, max_epochs=2, **QUIET)
    state = trainer.run_state
    assert (trainer.max_epochs, trainer.max_steps, trainer.stage, trainer.training) == (2, None, None, False)
    trainer.max_steps, trainer.should_stop = 3, True
    assert (state.max_steps, state.progress.should_stop) == (3, True)
    trainer.should_stop = False
    with pytest.raises(AttributeError, match=r"trainer\.global_step is read-only: it is the run state's"):
        trainer.global_step = 5  # type: ignore[assignment]  # read-only, as Lightning's
    assert trainer.fit_progress is state.progress
    seen: list[tuple[Any, ...]] = []

    class Record(Callback):
        def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            run = trainer.run_state
            seen.append((trainer.stage, trainer.training, trainer.global_step == run.global_step, trainer.current_epoch))

    trainer.callbacks.append(Record())
    trainer.fit(Net(), _data(), _data(4))
    assert seen == [("fit", True, True, 0)] * 3  # the max_steps set on the trainer ended the fit
    # the epoch max_steps cut short counts in current_epoch, as Lightning's; the loop position keeps it open
    assert (trainer.global_step, trainer.current_epoch, state.progress.epoch, state.stage, state.training) == (3, 1, 0, None, False)


def test_a_checkpoint_stores_the_same_loops_entry_and_resumes(tmp_path: Any) -> None:
    trainer = Trainer(project_dir=tmp_path / "a", max_steps=3, **QUIET)
    trainer.fit(Net(), _data())
    trainer.save_checkpoint(tmp_path / "ckpt")
    extra = json.loads((tmp_path / "ckpt" / "extra_state.json").read_text())
    assert extra["loops"] == {"fit_loop": trainer.fit_progress.state_dict()}
    assert (extra["global_step"], extra["loops"]["fit_loop"]["batches_done_in_epoch"]) == (3, 3)
    resumed = Trainer(project_dir=tmp_path / "b", max_steps=5, **QUIET)
    resumed.fit(Net(), _data(), ckpt_path=tmp_path / "ckpt")
    assert (resumed.global_step, resumed.current_epoch, resumed.fit_progress.batches_done_in_epoch) == (5, 1, 0)


_COUNTS = {"global_step", "accumulation_position", "accumulated", "batches_that_stepped", "batches_done_in_epoch", "stepping_batch_open"}


def _count_writes(path: Path) -> list[str]:
    """``x.<count> = ...`` / ``x.<count> += ...`` in `path` (tuple targets included)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign):
            targets = [node.target]
        else:
            continue
        flat = [leaf for target in targets for leaf in (target.elts if isinstance(target, ast.Tuple) else [target])]
        found += [f"{path.name}:{node.lineno} .{leaf.attr}" for leaf in flat if isinstance(leaf, ast.Attribute) and leaf.attr in _COUNTS]
    return found


def test_steps_and_the_accumulation_window_are_written_by_the_progress_alone() -> None:
    root = Path(__file__).resolve().parents[2]
    files = sorted((root / "trainer" / "fit").glob("*.py")) + sorted((root / "callbacks").rglob("*.py"))
    writes = [write for path in files for write in _count_writes(path)]
    assert writes and all(write.startswith("progress.py:") for write in writes), [w for w in writes if not w.startswith("progress.py:")]
