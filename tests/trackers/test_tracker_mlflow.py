"""MLflow (local file store): params and metric histories read back with ``MlflowClient``."""

from __future__ import annotations

import pytest
from tracker_scenario import FLAT_CONFIG, STEPS, expected_acc, expected_loss


def test_mlflow_file_store_round_trip(run_scenario, offline_env):
    pytest.importorskip("mlflow")  # after offline_env: some packages read the environment at import
    from mlflow.tracking import MlflowClient

    hub = run_scenario("mlflow", project_name="mlflow-proj")
    from callbacks.trackers import TrackerHub

    text_hub = TrackerHub("mlflow", project_dir=offline_env / "out")
    text_hub.init("mlflow-proj")
    text_hub.log({"note": "hello", "loss": 2.0}, step=1)
    text_hub.finish()

    client = MlflowClient((offline_env / "out" / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("mlflow-proj")
    assert experiment is not None
    runs = {run.info.run_id: run for run in client.search_runs([experiment.experiment_id])}
    run = runs[hub.trackers[0].tracker.info.run_id]
    assert run.info.status == "FINISHED"
    assert run.data.params == {key: str(value) for key, value in FLAT_CONFIG.items()}

    loss = {metric.step: metric.value for metric in client.get_metric_history(run.info.run_id, "loss")}
    acc = {metric.step: metric.value for metric in client.get_metric_history(run.info.run_id, "val/acc")}
    assert sorted(loss) == sorted(acc) == list(STEPS)
    for step in STEPS:
        assert loss[step] == pytest.approx(expected_loss(step), rel=1e-6)
        assert acc[step] == pytest.approx(expected_acc(step))

    text_run = runs[text_hub.trackers[0].tracker.info.run_id]
    assert text_run.data.tags["note"] == "hello"
    assert text_run.data.metrics == {"loss": 2.0}


def test_mlflow_tracker_takes_accelerates_arguments_and_its_environment_wins(offline_env, monkeypatch):
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from trainer.tracking import MLflowTracker

    monkeypatch.setenv("MLFLOW_RUN_NAME", "from-env")
    tracker = MLflowTracker("acc-exp", str(offline_env / "out"), tags={"team": "x"}, run_name="from-code", description="d")
    tracker.set_main_process(True)
    tracker.begin()
    tracker.log({"loss": 1.0}, step=0)
    run_id = tracker.tracker.info.run_id
    tracker.end()
    run = MlflowClient((offline_env / "out" / "mlruns").as_uri()).get_run(run_id)
    assert run.info.run_name == "from-env" and run.data.tags["team"] == "x"
    assert MlflowClient((offline_env / "out" / "mlruns").as_uri()).get_experiment(run.info.experiment_id).name == "acc-exp"
