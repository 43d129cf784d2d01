"""EarlyStopping: the stopping rule, argument checks, and its behaviour in a real `fit`."""

from __future__ import annotations

import math

import pytest

from callbacks.early_stopping import EarlyStopping


def feed(callback: EarlyStopping, values: list[float]) -> list[bool]:
    return [callback.evaluate(v)[0] for v in values]


def test_patience_counts_checks_without_improvement() -> None:
    es = EarlyStopping("loss", patience=2)
    assert feed(es, [1.0, 0.9, 0.95, 0.91]) == [False, False, False, True]
    assert es.best_score == 0.9 and es.wait_count == 2


def test_min_delta_requires_a_large_enough_improvement() -> None:
    es = EarlyStopping("loss", patience=1, min_delta=0.1)
    assert feed(es, [1.0, 0.95]) == [False, True]
    es = EarlyStopping("acc", mode="max", patience=1, min_delta=0.1)
    assert feed(es, [0.5, 0.65]) == [False, False]
    assert es.best_score == 0.65


def test_max_mode_and_improvement_resets_the_counter() -> None:
    es = EarlyStopping("acc", mode="max", patience=2)
    assert feed(es, [0.1, 0.05, 0.2, 0.19, 0.18]) == [False, False, False, False, True]


def test_non_finite_stops_at_once_unless_disabled() -> None:
    es = EarlyStopping("loss")
    stop, reason = es.evaluate(math.nan)
    assert stop and "not finite" in reason
    es = EarlyStopping("loss", check_finite=False, patience=5)
    assert es.evaluate(math.nan)[0] is False


def test_thresholds() -> None:
    es = EarlyStopping("loss", stopping_threshold=0.1)
    assert feed(es, [0.5, 0.1, 0.09]) == [False, False, True]  # strictly past the threshold, as Lightning
    es = EarlyStopping("loss", divergence_threshold=10.0)
    assert feed(es, [5.0, 10.0, 10.5]) == [False, False, True]
    es = EarlyStopping("acc", mode="max", stopping_threshold=0.9, divergence_threshold=0.1)
    assert feed(es, [0.5, 0.95]) == [False, True]
    assert EarlyStopping("acc", mode="max", divergence_threshold=0.1).evaluate(0.05)[0] is True


@pytest.mark.parametrize(
    "kwargs, needle",
    [({"mode": "avg"}, "mode='avg'"), ({"patience": -1}, "patience=-1"), ({"min_delta": math.inf}, "min_delta=inf")],
)
def test_bad_arguments_are_rejected(kwargs: dict, needle: str) -> None:
    with pytest.raises(ValueError, match=needle.replace("(", r"\(")):
        EarlyStopping("loss", **kwargs)


def test_state_round_trip() -> None:
    es = EarlyStopping("loss", patience=4)
    feed(es, [1.0, 2.0, 3.0])
    other = EarlyStopping("loss", patience=4)
    other.load_state_dict(es.state_dict())
    assert (other.wait_count, other.best_score) == (2, 1.0)
    assert feed(other, [4.0, 5.0]) == [False, True]


# ------------------------------------------------------------------------------- with a real Trainer
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

from callbacks.base import Callback  # noqa: E402
from tests.unit.test_checkpoint_callback import ScriptedNet, fit  # noqa: E402


class EpochCounter(Callback):
    def __init__(self) -> None:
        self.epochs = 0

    def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
        self.epochs += 1


PLATEAU = (5.0, 4.0, 4.5, 4.6, 4.7, 1.0, 1.0, 1.0)


def test_stops_the_fit_after_patience_checks(tmp_path: Path) -> None:
    es, counter = EarlyStopping("val_loss", patience=2), EpochCounter()
    trainer = fit(tmp_path, [counter, es], module=ScriptedNet(PLATEAU), max_epochs=len(PLATEAU), enable_checkpointing=False)
    assert counter.epochs == 4 and es.stopped_epoch == 3 and es.best_score == 4.0
    assert trainer.global_step == 8 and "did not improve" in es.stopping_reason


def test_missing_monitor_lists_the_logged_metrics(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match=r"val_acc.*\['train_loss', 'val_loss'\]"):
        fit(tmp_path, [EarlyStopping("val_acc")], enable_checkpointing=False)


def test_missing_monitor_with_strict_false_warns(tmp_path: Path) -> None:
    counter = EpochCounter()
    with pytest.warns(UserWarning, match="val_acc"):
        fit(tmp_path, [counter, EarlyStopping("val_acc", strict=False)], max_epochs=2, enable_checkpointing=False)
    assert counter.epochs == 2


def test_state_is_restored_on_resume(tmp_path: Path) -> None:
    from callbacks.checkpoint import ModelCheckpoint

    def callbacks() -> list[Any]:
        return [EarlyStopping("val_loss", patience=3), ModelCheckpoint(dirpath=tmp_path / "ck", save_top_k=-1)]

    straight = fit(tmp_path / "straight", callbacks()[:1], module=ScriptedNet(PLATEAU), max_epochs=len(PLATEAU),
                   enable_checkpointing=False)
    fit(tmp_path, callbacks(), module=ScriptedNet(PLATEAU), max_epochs=3)  # best 4.0 at epoch 1, one check without improvement
    resumed_cbs = callbacks()
    resumed = fit(tmp_path, resumed_cbs, module=ScriptedNet(PLATEAU), max_epochs=len(PLATEAU), ckpt_path="last")
    es = resumed_cbs[0]
    assert (es.stopped_epoch, es.best_score) == (4, 4.0)
    assert resumed.global_step == straight.global_step == 10


def test_checks_after_each_validation_when_it_runs_within_the_epoch(tmp_path: Path) -> None:
    es, counter = EarlyStopping("val_loss", patience=2), EpochCounter()
    # validation after every batch (2 per epoch) sees 5, 5 | 3, 3 | 4: the second check without improvement
    # stops after the first batch of epoch 2 (checking only at epoch ends, 5 | 3 | 4 would not stop)
    trainer = fit(tmp_path, [counter, es], max_epochs=3, val_check_interval=1, enable_checkpointing=False)
    assert es.stopped_epoch == 2 and trainer.global_step == 5 and counter.epochs == 3


# ------------------------------------------------------------------------------- Lightning's signature
class _View:
    """Just what `EarlyStopping._log_info` reads from the trainer."""

    def __init__(self, world_size: int, global_rank: int) -> None:
        self.world_size, self.global_rank, self.is_global_zero = world_size, global_rank, global_rank == 0


def test_lightning_parameter_order_and_verbose() -> None:
    es = EarlyStopping("val_loss", 0.5, 7, True, "max", False, False, 1.0, -1.0, True, True)
    assert (es.monitor, es.min_delta, es.patience, es.verbose, es.mode, es.strict, es.check_finite) == (
        "val_loss", 0.5, 7, True, "max", False, False)
    assert (es.stopping_threshold, es.divergence_threshold, es.check_on_train_epoch_end, es.log_rank_zero_only) == (
        1.0, -1.0, True, True)
    assert EarlyStopping(monitor="val_loss", verbose=True).verbose is True
    with pytest.raises(TypeError, match="verbose='yes'"):
        EarlyStopping("val_loss", verbose="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize("world_size, rank, rank_zero_only, expected", [
    (1, 0, False, "msg\n"), (1, 0, True, "msg\n"), (2, 1, False, "[rank: 1] msg\n"), (2, 1, True, ""),
    (2, 0, True, "[rank: 0] msg\n"),
])
def test_verbose_output_per_rank(capsys: pytest.CaptureFixture[str], world_size: int, rank: int, rank_zero_only: bool,
                                 expected: str) -> None:
    EarlyStopping("loss", verbose=True, log_rank_zero_only=rank_zero_only)._log_info(_View(world_size, rank), "msg")  # type: ignore[arg-type]
    assert capsys.readouterr().out == expected


def test_verbose_reports_improvements_and_the_stop(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fit(tmp_path, [EarlyStopping("val_loss", patience=2, verbose=True)], module=ScriptedNet(PLATEAU),
        max_epochs=len(PLATEAU), enable_checkpointing=False)
    out = capsys.readouterr().out
    assert "Metric val_loss improved. New best score: 5.000" in out
    assert "Metric val_loss improved by 1.000 >= min_delta = 0.0. New best score: 4.000" in out
    assert "Monitored metric val_loss did not improve in the last 2 records. Best score: 4.000. Signaling Trainer to stop." in out


def test_quiet_by_default(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    es = EarlyStopping("val_loss", patience=2)
    fit(tmp_path, [es], module=ScriptedNet(PLATEAU), max_epochs=len(PLATEAU), enable_checkpointing=False)
    assert es.stopping_reason is not None and "improve" not in capsys.readouterr().out
