"""Comet ML (offline): parameters and metrics read back from the offline archive's ``messages.json``."""

from __future__ import annotations

import json
import zipfile

import pytest
from tracker_scenario import FLAT_CONFIG, STEPS, expected_acc, expected_loss


def test_comet_offline_round_trip(run_scenario, offline_env):
    pytest.importorskip("comet_ml")  # after offline_env: some packages read the environment at import
    run_scenario("comet_ml", project_name="comet-proj", init_kwargs={"comet_ml": {"online": False}})
    (archive,) = (offline_env / "out").glob("*.zip")
    with zipfile.ZipFile(archive) as handle:
        experiment = json.loads(handle.read("experiment.json"))
        messages = [json.loads(line) for line in handle.read("messages.json").splitlines() if line.strip()]

    assert experiment["project_name"] == "comet-proj"
    params = {
        message["payload"]["param"]["paramName"]: message["payload"]["param"]["paramValue"]
        for message in messages
        if message["type"] == "parameter_msg"
    }
    assert {key: params[key] for key in FLAT_CONFIG} == FLAT_CONFIG
    metrics: dict[str, dict[int, float]] = {}
    for message in messages:
        if message["type"] == "metric_msg":
            metric = message["payload"]["metric"]
            metrics.setdefault(metric["metricName"], {})[metric["step"]] = metric["metricValue"]
    assert sorted(metrics["loss"]) == list(STEPS)
    # a dict value ({"val": {"acc": ...}}) as Accelerate's tracker logs it: log_metrics(value), the entries under their
    # own names, without the dict's key
    assert sorted(metrics["acc"]) == list(STEPS) and "val/acc" not in metrics
    for step in STEPS:
        assert float(metrics["loss"][step]) == pytest.approx(expected_loss(step), rel=1e-6)
        assert float(metrics["acc"][step]) == pytest.approx(expected_acc(step))
