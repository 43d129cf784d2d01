"""DVCLive: params and metric series read back from its files; a Git repo is never turned into a DVC repo."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess

import pytest
import yaml
from tracker_scenario import CONFIG, STEPS, expected_acc, expected_loss


def _tsv(path):
    with open(path, newline="") as handle:
        return {int(row["step"]): float(row[path.stem]) for row in csv.DictReader(handle, delimiter="\t")}


def test_dvclive_round_trip(run_scenario, offline_env):
    pytest.importorskip("dvclive")  # after offline_env: some packages read the environment at import
    run_scenario("dvclive", project_name="dvclive-proj")
    live_dir = offline_env / "out" / "dvclive"

    assert yaml.safe_load((live_dir / "params.yaml").read_text()) == CONFIG
    loss = _tsv(live_dir / "plots" / "metrics" / "loss.tsv")
    acc = _tsv(live_dir / "plots" / "metrics" / "val" / "acc.tsv")
    assert sorted(loss) == sorted(acc) == list(STEPS)
    for step in STEPS:
        assert loss[step] == pytest.approx(expected_loss(step), rel=1e-6)
        assert acc[step] == pytest.approx(expected_acc(step))
    summary = json.loads((live_dir / "metrics.json").read_text())
    assert summary["step"] == STEPS[-1]
    assert summary["loss"] == pytest.approx(expected_loss(STEPS[-1]), rel=1e-6)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs the git command")
def test_dvclive_leaves_a_git_repository_alone(offline_env):
    pytest.importorskip("dvclive")  # after offline_env: some packages read the environment at import
    from callbacks.trackers import TrackerHub

    repo = offline_env / "project"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True, timeout=30)
    (repo / "train.py").write_text("print('hi')\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    subprocess.run([*git, "add", "train.py"], check=True, timeout=30)
    subprocess.run([*git, "commit", "-q", "-m", "init"], check=True, timeout=30)
    before = subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True, check=True).stdout

    import os

    os.chdir(repo)
    hub = TrackerHub("dvclive", project_dir=repo / "logs")
    hub.init("in-repo", config={"lr": 0.1})
    hub.log({"loss": 1.0}, step=0)
    hub.finish()

    assert not (repo / ".dvc").exists()
    assert (repo / "logs" / "dvclive" / "params.yaml").exists()
    staged = subprocess.run([*git, "diff", "--cached", "--name-only"], capture_output=True, text=True, check=True)
    assert staged.stdout == "" and before == ""
