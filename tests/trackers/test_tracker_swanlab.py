"""SwanLab (offline): config from ``files/config.yaml``, scalars from the run's ``.swanlab`` record file."""

from __future__ import annotations

import pytest
import yaml
from record_log import read_chunks
from tracker_scenario import CONFIG, STEPS, expected_acc, expected_loss


def test_swanlab_offline_round_trip(run_scenario, offline_env):
    pytest.importorskip("swanlab")  # after offline_env: some packages read the environment at import
    from swanlab.proto.swanlab.record.v1 import record_pb2

    run_scenario("swanlab", project_name="swanlab-proj", init_kwargs={"swanlab": {"mode": "offline"}})
    (run_dir,) = (offline_env / "out" / "swanlog").glob("run-*")

    config = yaml.safe_load((run_dir / "files" / "config.yaml").read_text())
    assert {key: entry["value"] for key, entry in config.items()} == CONFIG

    scalars: dict[str, dict[int, float]] = {}
    project = None
    for payload in read_chunks(next(run_dir.glob("run-*.swanlab"))):
        record = record_pb2.Record.FromString(payload)
        if record.HasField("start"):
            project = record.start.project
        if record.HasField("scalar"):
            scalars.setdefault(record.scalar.key, {})[record.scalar.step] = record.scalar.value.number
    assert project == "swanlab-proj"
    loss, acc = scalars["loss"], scalars["val/acc"]
    assert sorted(loss) == sorted(acc) == list(STEPS)
    for step in STEPS:
        assert loss[step] == pytest.approx(expected_loss(step), rel=1e-6)
        assert acc[step] == pytest.approx(expected_acc(step))
