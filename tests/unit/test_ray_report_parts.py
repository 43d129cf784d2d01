"""Which files of a checkpoint each process reports to Ray (`callbacks.ray_train.files_of_process`): no Ray needed.
The whole path, with real Ray, is tests/integration/test_ray_train.py."""

from __future__ import annotations

import json

import pytest

from callbacks.ray_train import files_of_process
from strategies.checkpoint_io import FORMAT_NAME, FORMAT_VERSION


def test_each_process_reports_its_own_shards_and_rng_states_and_process_0_the_rest(tmp_path):
    files = ["model.safetensors", "extra_state.json", "random_states_0.safetensors", "random_states_1.safetensors",
             "random_states_12.safetensors", "sharded/.metadata", "sharded/__0_0.distcp", "sharded/__1_0.distcp",
             "sharded/__12_0.distcp", "sharded/__1_1.distcp"]
    manifest = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "hash": "xxh3_128",
                "files": {name: {"size": 1, "digest": "0"} for name in files}}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    parts = {rank: files_of_process(tmp_path, rank) for rank in (0, 1, 2, 12)}
    assert sorted(parts[0]) == ["extra_state.json", "manifest.json", "model.safetensors", "random_states_0.safetensors",
                                "sharded/.metadata", "sharded/__0_0.distcp"]
    assert sorted(parts[1]) == ["random_states_1.safetensors", "sharded/__1_0.distcp", "sharded/__1_1.distcp"]
    assert parts[2] == [] and sorted(parts[12]) == ["random_states_12.safetensors", "sharded/__12_0.distcp"]
    assert sorted(name for part in parts.values() for name in part) == sorted([*files, "manifest.json"])  # all, once


def test_a_directory_without_a_manifest_is_refused(tmp_path):
    with pytest.raises(ValueError, match="not a complete checkpoint"):
        files_of_process(tmp_path, 0)


def test_the_callback_outside_a_ray_train_worker_says_where_it_runs(monkeypatch):
    import importlib.util

    from callbacks import RayTrainReportCallback

    monkeypatch.delenv("RAY_RAYLET_PID", raising=False)
    if importlib.util.find_spec("ray") is None:
        with pytest.raises(ModuleNotFoundError, match=r"trainwright\[ray\]"):
            RayTrainReportCallback().on_fit_start(None, None)
        return
    with pytest.raises(RuntimeError, match=r"inside the worker function of a ray\.train\.torch\.TorchTrainer"):
        RayTrainReportCallback().on_fit_start(None, None)
