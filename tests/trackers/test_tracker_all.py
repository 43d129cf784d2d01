"""``log_with="all"`` without a project directory: every installed backend runs offline, in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    import torch
    from callbacks.trackers import TrackerHub

    hub = TrackerHub("all")  # no project_dir: file-based trackers write under the current directory
    hub.init(
        "all-proj",
        config={"lr": 0.1, "model": {"depth": 2}},
        init_kwargs={"comet_ml": {"online": False}, "clearml": {"offline": True}, "swanlab": {"mode": "offline"}},
    )
    for step in range(3):
        hub.log({"loss": torch.tensor(1.0 / (step + 1)), "note": "text"}, step=step)
    hub.finish()

    def children():
        me = str(os.getpid())
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                if fields[1] == me and fields[0] != "Z":
                    found.append(int(entry.name))
        return found

    deadline = time.monotonic() + 10
    while children() and time.monotonic() < deadline:
        time.sleep(0.2)
    print(json.dumps({"names": [t.name for t in hub.trackers], "children": children()}))
    """
)


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_all_without_project_dir_runs_every_installed_backend(tmp_path: Path, empty_aim_repo) -> None:
    work = tmp_path / "work"
    work.mkdir()
    empty_aim_repo(work)  # as after `aim init`
    (tmp_path / "clearml.conf").write_text("sdk { development { report_use_subprocess: false } }\n")
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("WANDB_", "COMET_", "MLFLOW_", "CLEARML_", "TRAINS_", "TRACKIO_", "SWANLAB_", "RANK"))
    }
    env.update(
        HOME=str(tmp_path / "home"),
        PYTHONPATH=str(REPO),
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        COMET_LOGGING_CONSOLE="error",
        CLEARML_CACHE_DIR=str(tmp_path / "clearml-cache"),
        CLEARML_CONFIG_FILE=str(tmp_path / "clearml.conf"),
        TRACKIO_DIR=str(tmp_path / "trackio"),
    )
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=work, env=env, capture_output=True, text=True, timeout=360
    )
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["children"] == [], "a tracker left a process running"

    expected_files = {
        "csv": "logs/all-proj/version_0/metrics.csv",
        "tensorboard": "all-proj/events.out.tfevents.*",
        "wandb": "wandb/offline-run-*/run-*.wandb",
        "comet_ml": ".cometml-runs/*.zip",  # Comet's own default offline folder
        "aim": ".aim/meta/chunks/*",
        "mlflow": "mlruns/*/*/metrics/loss",
        "dvclive": "dvclive/plots/metrics/loss.tsv",
        "swanlab": "swanlog/run-*/run-*.swanlab",
    }
    for name in report["names"]:
        if name in expected_files:
            assert list(work.glob(expected_files[name])), f"{name} wrote nothing to {work / expected_files[name]}"
    if "trackio" in report["names"]:
        assert (tmp_path / "trackio" / "all-proj.db").exists()
    if "clearml" in report["names"]:
        assert list((tmp_path / "clearml-cache" / "offline").glob("*/metrics.jsonl"))
    assert "csv" in report["names"]
