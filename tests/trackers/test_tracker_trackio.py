"""Trackio: config and metrics, with their steps, read back from the project's SQLite database."""

from __future__ import annotations

import json
import sqlite3

import pytest
from tracker_scenario import CONFIG, STEPS, expected_acc, expected_loss


def test_trackio_round_trip_keeps_steps(run_scenario, offline_env):
    pytest.importorskip("trackio")  # after offline_env: some packages read the environment at import
    hub = run_scenario("trackio", project_name="trackio-proj")
    run_name = hub.trackers[0].tracker.name

    from trackio.sqlite_storage import SQLiteStorage

    database = SQLiteStorage.get_project_db_path("trackio-proj")
    assert database.parent == offline_env / "trackio", "trackio was imported before TRACKIO_DIR was set"
    with sqlite3.connect(database) as db:
        (config,) = db.execute("SELECT config FROM configs WHERE run_name = ?", (run_name,)).fetchone()
        rows = db.execute("SELECT step, metrics FROM metrics WHERE run_name = ? ORDER BY step", (run_name,)).fetchall()

    stored = json.loads(config)
    assert {key: stored[key] for key in CONFIG} == CONFIG
    assert [step for step, _ in rows] == list(STEPS)
    for step, metrics in rows:
        values = json.loads(metrics)
        assert values["loss"] == pytest.approx(expected_loss(step), rel=1e-6)
        assert values["val"]["acc"] == pytest.approx(expected_acc(step))  # nested, as Accelerate hands it over
