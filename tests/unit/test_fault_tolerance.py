"""Replica groups' settings, their checks against the launch, and the deal of a step's global batch to the live groups."""

from __future__ import annotations

import itertools
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from strategies import DDPStrategy, FaultTolerance
from strategies.fault_tolerance import (
    check_global_batch,
    check_replica_groups,
    import_torchft,
    replica_groups_from_environment,
    replica_shard,
)
from strategies.sharding import shard_spans


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"min_replica_groups": 0}, "min_replica_groups=0"),
        ({"min_replica_groups": 1.5}, "min_replica_groups=1.5"),
        ({"min_replica_groups": True}, "min_replica_groups=True"),
        ({"timeout": 0}, "timeout=0"),
        ({"quorum_timeout": float("nan")}, "quorum_timeout=nan"),
        ({"lighthouse": "localhost"}, "'HOST:PORT'"),
        ({"lighthouse": "localhost:99999"}, "'localhost:99999'"),
    ],
)
def test_bad_settings_are_refused_with_the_value_and_the_fix(kwargs, says):
    with pytest.raises(ValueError, match="FaultTolerance") as error:
        FaultTolerance(**kwargs)
    assert says in str(error.value)


def test_min_replica_groups_above_the_groups_launched_is_refused():
    check_replica_groups(FaultTolerance(min_replica_groups=2), 2)
    with pytest.raises(ValueError, match=r"min_replica_groups=3\) but the job has 2 replica group\(s\).*--replica_groups"):
        check_replica_groups(FaultTolerance(min_replica_groups=3), 2)


def test_the_launch_is_read_from_torchfts_variables():
    assert replica_groups_from_environment({}) is None
    assert replica_groups_from_environment({"REPLICA_GROUP_ID": "1", "NUM_REPLICA_GROUPS": "3"}) == (1, 3)
    for bad in ({"REPLICA_GROUP_ID": "1"}, {"REPLICA_GROUP_ID": "3", "NUM_REPLICA_GROUPS": "3"}, {"REPLICA_GROUP_ID": "-1", "NUM_REPLICA_GROUPS": "2"}):
        with pytest.raises(ValueError, match="REPLICA_GROUP_ID"):
            replica_groups_from_environment(bad)


def test_a_global_batch_every_quorum_cannot_deal_evenly_is_refused():
    check_global_batch(12, FaultTolerance(min_replica_groups=1), groups=2, processes_per_group=2)  # 2 and 4 processes
    with pytest.raises(ValueError, match=r"global batch of 12 samples cannot be dealt evenly to 8 processes.*multiple of 24"):
        check_global_batch(12, FaultTolerance(min_replica_groups=1), groups=4, processes_per_group=2)
    check_global_batch(16, FaultTolerance(min_replica_groups=4), groups=4, processes_per_group=2)  # only 8 processes
    with pytest.raises(ValueError, match="min_replica_groups=3"):
        check_global_batch(12, FaultTolerance(min_replica_groups=3), groups=2, processes_per_group=1)


def test_the_docstrings_deal():
    assert [replica_shard([0, 1], g, 2, p) for g in (0, 1) for p in (0, 1)] == [(0, 4), (1, 4), (2, 4), (3, 4)]
    assert [replica_shard([0], 0, 2, p) for p in (0, 1)] == [(0, 2), (1, 2)]
    assert replica_shard([2, 0], 2, 1, 0) == (1, 2)  # by group id, not by the order the quorum listed them
    with pytest.raises(ValueError, match="replica group 1 is not among the live groups"):
        replica_shard([0, 2], 1, 1, 0)
    with pytest.raises(ValueError, match="process 2 of a group of 2"):
        replica_shard([0], 0, 2, 2)


@settings(max_examples=60, deadline=None)
@given(groups=st.integers(1, 4), per_group=st.integers(1, 3), data=st.data())
def test_every_quorum_trains_a_step_on_exactly_the_uninterrupted_runs_samples(groups, per_group, data):
    live = data.draw(st.lists(st.integers(0, groups - 1), min_size=1, max_size=groups, unique=True))
    total = len(live) * per_group * data.draw(st.integers(1, 3))  # a global batch the live processes share evenly
    step = data.draw(st.integers(0, 5))
    length = total * 8
    spans = {}
    for group, process in itertools.product(sorted(live), range(per_group)):
        index, processes = replica_shard(live, group, per_group, process)
        spans[index] = next(shard_spans(length, total, processes, index, split_batches=True, start=step))
    dealt = [i for _, (begin, end) in sorted(spans.items()) for i in range(begin, end)]
    assert dealt == list(range(step * total, (step + 1) * total))  # each sample once, in the global order


def test_missing_torchft_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchft", None)  # what Python does for a package that is not installed
    with pytest.raises(ImportError, match=r"pip install 'trainwright\[fault-tolerance\]'"):
        import_torchft()
    with pytest.raises(ImportError, match="fault-tolerance"):
        DDPStrategy(cpu=True, fault_tolerance=FaultTolerance())


def test_ddp_checks_its_inputs_first(monkeypatch):
    with pytest.raises(TypeError, match=r"fault_tolerance=2\): give a strategies.FaultTolerance"):
        DDPStrategy(cpu=True, fault_tolerance=2)  # type: ignore[arg-type]
    monkeypatch.setenv("REPLICA_GROUP_ID", "0")
    monkeypatch.setenv("NUM_REPLICA_GROUPS", "1")
    with pytest.raises(ValueError, match="min_replica_groups=2"):
        DDPStrategy(cpu=True, fault_tolerance=FaultTolerance(min_replica_groups=2))


def test_ddp_says_replica_groups_are_not_built_yet():
    pytest.importorskip("torchft")  # without it, the ImportError above comes first
    with pytest.raises(NotImplementedError, match=r"not built yet.*trainer launch --max_restarts"):
        DDPStrategy(cpu=True, fault_tolerance=FaultTolerance())


def test_strategies_that_cannot_take_it_refuse_it():
    from strategies import DeepSpeedStrategy, XLAStrategy

    for strategy in (DeepSpeedStrategy, XLAStrategy):
        with pytest.raises(TypeError, match="fault_tolerance"):
            strategy(fault_tolerance=FaultTolerance())  # type: ignore[call-arg]


def test_the_accelerator_checks_the_same_inputs_first(monkeypatch):
    from trainer import Accelerator

    with pytest.raises(TypeError, match=r"Accelerator\(fault_tolerance='yes'\)"):
        Accelerator(cpu=True, fault_tolerance="yes")  # type: ignore[arg-type]
    monkeypatch.setenv("REPLICA_GROUP_ID", "0")
    monkeypatch.setenv("NUM_REPLICA_GROUPS", "2")
    with pytest.raises(ValueError, match=r"min_replica_groups=3\) but the job has 2"):
        Accelerator(cpu=True, fault_tolerance=FaultTolerance(min_replica_groups=3))
    monkeypatch.setitem(sys.modules, "torchft", None)
    with pytest.raises(ImportError, match="fault-tolerance"):
        Accelerator(cpu=True, fault_tolerance=FaultTolerance(min_replica_groups=2))
