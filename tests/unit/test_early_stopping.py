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
    assert feed(es, [0.5, 0.1]) == [False, True]
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
