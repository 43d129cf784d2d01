"""ClearML (offline): configuration and scalars read back from the offline session folder."""

from __future__ import annotations

import json

import pytest
from tracker_scenario import CONFIG, STEPS, expected_acc, expected_loss

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # from the package's own HOCON parser


def test_clearml_offline_round_trip(run_scenario, offline_env):
    pytest.importorskip("clearml")  # after offline_env: some packages read the environment at import
    from clearml.utilities.pyhocon import ConfigFactory

    run_scenario("clearml", project_name="clearml-proj", init_kwargs={"clearml": {"offline": True}})
    (session,) = [path for path in (offline_env / "clearml-cache" / "offline").iterdir() if path.is_dir()]

    task = json.loads((session / "task.json").read_text())
    assert task["project_name"] == "clearml-proj"
    assert task["name"] == "clearml-proj"
    config = ConfigFactory.parse_string(task["configuration"]["General"]["value"])
    assert config["lr"] == CONFIG["lr"]
    assert config["batch_size"] == CONFIG["batch_size"]
    assert config["optimizer"]["name"] == "adamw"
    assert config["tag"] == "baseline"

    scalars: dict[tuple[str, str], dict[int, float]] = {}
    for line in (session / "metrics.jsonl").read_text().splitlines():
        for event in json.loads(line) if line.strip() else []:
            if event["type"] == "training_stats_scalar":
                scalars.setdefault((event["metric"], event["variant"]), {})[event["iter"]] = event["value"]
    loss, acc = scalars[("loss", "loss")], scalars[("val", "acc")]
    assert sorted(loss) == sorted(acc) == list(STEPS)
    for step in STEPS:
        assert loss[step] == pytest.approx(expected_loss(step), rel=1e-6)
        assert acc[step] == pytest.approx(expected_acc(step))
