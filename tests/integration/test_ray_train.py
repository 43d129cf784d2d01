"""Ray Train with real Ray: one local cluster (127.0.0.1, no dashboard, a small object store) for every check here.

* the Trainer face under ``TorchTrainer`` (FSDP, 2 workers): Ray detected as its own environment, a checkpoint per
  epoch reported by `RayTrainReportCallback` from every process, a worker SIGKILLed, Ray restarting the group, and
  ``fit(ckpt_path=<ray.train.get_checkpoint()>)`` continuing exactly as an uninterrupted run (the reference runs on
  the tests' forked processes, same threads and kernels: losses compared bit for bit);
* the Accelerator face in the group Ray made: its checkpoint reported by both processes (`report_checkpoint`), then
  a process hung before a collective named within the run's timeout (Ray's own is 30 minutes).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.multiprocess import run_distributed
from tests.integration import ray_jobs

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed (pip install 'trainwright[ray]')"),
    pytest.mark.timeout(400),
]


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """One local Ray cluster for the module's tests, shut down after them."""
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")  # (2 s by default) a dead worker, a report seen sooner
    import ray
    from ray import cloudpickle

    cloudpickle.register_pickle_by_value(ray_jobs)  # the workers need not import the tests' package
    started = time.monotonic()
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=78 * 2**20, _node_ip_address="127.0.0.1",
             _temp_dir=str(tmp_path_factory.mktemp("ray")), log_to_driver=False, configure_logging=False)
    print(f"ray.init: {time.monotonic() - started:.1f} s", file=sys.stderr)
    yield tmp_path_factory
    ray.shutdown()


def _torch_trainer(job, config, name, storage, max_failures):
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    return TorchTrainer(job, train_loop_config=config, scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
                        run_config=RunConfig(name=name, storage_path=str(storage),
                                             failure_config=FailureConfig(max_failures=max_failures)))


def _losses(folder: Path, attempt: str, rank: int) -> dict[int, float]:
    """The last loss recorded at each global step (a restarted run records the steps after its checkpoint again)."""
    rows = [json.loads(line) for line in Path(folder, f"losses-{attempt}-{rank}.jsonl").read_text().splitlines()]
    return dict(rows)


def test_fsdp_run_reports_checkpoints_survives_a_killed_worker_and_resumes_exactly(ray_cluster):
    folder = ray_cluster.mktemp("fit")
    started = time.monotonic()
    storage = ray_cluster.mktemp("storage")
    config = {"folder": str(folder), "ray": True, "kill_at": (1, 2), "storage": str(storage), "name": "fit"}
    result = _torch_trainer(ray_jobs.fit_job, config, "fit", storage, max_failures=1).fit()
    print(f"TorchTrainer.fit with a restart: {time.monotonic() - started:.1f} s", file=sys.stderr)
    assert result.error is None
    killed_at = int(Path(folder, "killed").read_text())
    assert killed_at == 1 * 6 + 2  # process 1 died in epoch 1, before its third batch

    # what Ray gave back after the restart: the epoch-0 checkpoint, assembled from both processes' parts
    listing = json.loads(Path(folder, "resumed-0").read_text())
    assert "manifest.json" in listing and json.loads(Path(folder, "resumed-1").read_text()) == listing
    assert result.checkpoint is not None
    with result.checkpoint.as_directory() as final:  # the last report: epoch 2, both processes' shards
        from strategies.checkpoint_io import verify_checkpoint

        verify_checkpoint(final)  # every file the manifest lists is there, with its hash
        names = {p.relative_to(final).as_posix() for p in Path(final).rglob("*") if p.is_file()}
        assert any(name.endswith("__1_0.distcp") for name in names) and "random_states_1.safetensors" in names
    assert result.metrics["epoch"] == 2 and result.metrics["step"] == 18 and "train_loss_epoch" in result.metrics

    reference = ray_cluster.mktemp("reference")
    environments = run_distributed(ray_jobs.fit_job, {"folder": str(reference), "ray": False}, nprocs=2,
                                   env={"TRAINWRIGHT_PG_TIMEOUT": "60"})
    assert [e["source"] for e in environments] == ["torchrun", "torchrun"]
    for rank in (0, 1):
        ours, uninterrupted = _losses(folder, "ray", rank), _losses(reference, "reference", rank)
        assert sorted(ours) == sorted(uninterrupted) == list(range(1, 19))
        after_restart = [step for step in ours if step > 6]
        assert [ours[s] for s in after_restart] == [uninterrupted[s] for s in after_restart], rank  # exact
    for rank in (0, 1):  # Ray detected as its own environment: its NODE_RANK, the device it assigned
        environment = json.loads(Path(folder, f"environment-{rank}.json").read_text())
        assert environment == {"source": "ray", "node_rank": 0, "device": "cpu", "assigned": "cpu", "rank": rank, "world_size": 2}


def test_a_hung_process_is_named_within_the_runs_timeout_in_rays_process_group(ray_cluster):
    from ray.train import TrainingFailedError

    from strategies.checkpoint_io import verify_checkpoint

    folder, storage = ray_cluster.mktemp("hang"), ray_cluster.mktemp("storage")
    timeout = 5.0
    started = time.monotonic()
    with pytest.raises(TrainingFailedError):
        _torch_trainer(ray_jobs.hang_job, {"folder": str(folder), "timeout": timeout}, "hang", storage, max_failures=0).fit()
    print(f"TorchTrainer.fit of the hung run: {time.monotonic() - started:.1f} s", file=sys.stderr)
    report_path = Path(folder, "hung-0.json")
    report = json.loads(report_path.read_text())
    assert report["missing"] == [1] and report["alive"] == [1] and report["timeout"] == timeout and report["timed_out"]
    waited = report_path.stat().st_mtime - float(Path(folder, "entered").read_text())
    assert timeout <= waited < timeout + 15, waited  # the run's 5 s (and the report's few seconds), not Ray's 30 minutes

    # before the hang, the Accelerator's save_state, reported by both processes: whole in Ray's storage, and the local
    # copy removed
    (reported,) = [path for path in Path(storage, "hang").glob("checkpoint_*") if path.is_dir()]
    verify_checkpoint(reported)
    assert {"random_states_0.safetensors", "random_states_1.safetensors", "manifest.json"} <= {p.name for p in reported.iterdir()}
    assert not any(Path(folder, "scratch").iterdir())
