"""Aim: hparams and tracked metrics read back from the Aim repository with Aim's own ``Repo``."""

from __future__ import annotations

import pytest
from tracker_scenario import CONFIG, STEPS, expected_acc, expected_loss


def _index_run(repo, run_hash: str) -> None:
    """Do what ``aim up``'s indexer does for a finished run, so the repository lists it."""
    index = repo._get_index_tree("meta", 0).view(())
    meta = repo.request_tree("meta", run_hash, read_only=True, skip_read_optimization=True).subtree("meta")
    meta.subtree("chunks").subtree(run_hash).finalize(index=index)


def test_aim_round_trip(run_scenario, offline_env, empty_aim_repo):
    pytest.importorskip("aim")  # after offline_env: some packages read the environment at import
    from aim import Repo

    empty_aim_repo(offline_env / "out")  # as after `aim init`
    hub = run_scenario("aim", project_name="aim-proj")
    run_hash = hub.trackers[0].tracker.hash

    repo = Repo(str(offline_env / "out"))
    _index_run(repo, run_hash)
    run = repo.get_run(run_hash)
    assert run is not None
    assert run.experiment == "aim-proj"
    assert run["hparams"] == CONFIG

    series = {metric.name: metric for metric in run.metrics()}
    assert set(series) >= {"loss", "val/acc"}
    loss = {step: point[0] for step, point in series["loss"].data.items()}  # point: (value, epoch, time)
    acc = {step: point[0] for step, point in series["val/acc"].data.items()}
    assert sorted(loss) == sorted(acc) == list(STEPS)
    assert [loss[step] for step in STEPS] == pytest.approx([expected_loss(step) for step in STEPS], rel=1e-6)
    assert [acc[step] for step in STEPS] == pytest.approx([expected_acc(step) for step in STEPS])
