"""Weights & Biases (offline): config and history read back from the run's ``.wandb`` record file."""

from __future__ import annotations

import json

import pytest
from record_log import read_chunks
from tracker_scenario import CONFIG, STEPS, expected_acc, expected_loss


def _records(run_file):
    from wandb.proto import wandb_internal_pb2

    for payload in read_chunks(run_file):
        record = wandb_internal_pb2.Record.FromString(payload)
        yield record.WhichOneof("record_type"), record


def test_wandb_offline_round_trip(run_scenario, offline_env):
    pytest.importorskip("wandb")  # after offline_env: some packages read the environment at import
    hub = run_scenario("wandb", project_name="wb-proj")
    (run_file,) = (offline_env / "out" / "wandb").glob("offline-run-*/run-*.wandb")

    config: dict = {}
    history: dict[int, dict] = {}
    project = None
    for kind, record in _records(run_file):
        if kind == "config":
            config.update({item.key: json.loads(item.value_json) for item in record.config.update})
        elif kind == "history":
            row = {tuple(item.nested_key) or (item.key,): json.loads(item.value_json) for item in record.history.item}
            history[row[("_step",)]] = row
        elif kind == "run":
            project = record.run.project
    assert project == "wb-proj"
    assert {key: config[key] for key in CONFIG} == CONFIG
    assert sorted(history) == list(STEPS)
    for step, row in history.items():
        assert row[("loss",)] == pytest.approx(expected_loss(step), rel=1e-6)
        # a dict value handed to wandb nested, as Accelerate hands it: W&B keeps the nesting (shown as val.acc)
        assert row[("val", "acc")] == pytest.approx(expected_acc(step)) and ("val/acc",) not in row
    assert hub.get("wandb", unwrap=True) is hub.trackers[0].tracker
