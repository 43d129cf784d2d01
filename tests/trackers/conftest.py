"""Fixtures for tracker tests: an offline, isolated environment and one standard logging scenario."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tracker_scenario import CONFIG, STEPS, step_values


def _child_pids() -> set[int]:
    me = str(os.getpid())
    children = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me and fields[0] != "Z":
            children.add(int(entry.name))
    return children


@pytest.fixture
def offline_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Every backend offline, writing under ``tmp_path``; fails if a child process is left behind."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    clearml_config = tmp_path / "clearml.conf"
    clearml_config.write_text("sdk { development { report_use_subprocess: false } }\n")
    env = {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_DIR": str(tmp_path),
        "COMET_DISABLE_AUTO_LOGGING": "1",
        "COMET_ERROR_TRACKING_ENABLE": "false",
        "COMET_LOGGING_CONSOLE": "error",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "MLFLOW_ALLOW_FILE_STORE": "true",
        "CLEARML_CACHE_DIR": str(tmp_path / "clearml-cache"),
        "CLEARML_CONFIG_FILE": str(clearml_config),
        "TRACKIO_DIR": str(tmp_path / "trackio"),
        "DVC_NO_ANALYTICS": "1",
        "DO_NOT_TRACK": "1",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    before = _child_pids() if Path("/proc").is_dir() else set()
    yield tmp_path
    if Path("/proc").is_dir():
        deadline = time.monotonic() + 10
        while (left := _child_pids() - before) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not left, f"the tracker left child processes running: {sorted(left)}"


@pytest.fixture
def run_scenario(offline_env: Path) -> Callable[..., Any]:
    """Accelerate's tracker guide with only the import renamed: init with CONFIG, log STEPS, end training.

    Every backend's round-trip test reads what these calls wrote back from disk; returns the tracker hub.
    """

    def run(log_with: Any, project_name: str = "proj", init_kwargs: dict[str, Any] | None = None) -> Any:
        from trainer import Accelerator

        accelerator = Accelerator(log_with=log_with, project_dir=offline_env / "out", cpu=True)
        accelerator.init_trackers(project_name, config=CONFIG, init_kwargs=init_kwargs)
        for step in STEPS:
            accelerator.log(step_values(step), step=step)
        accelerator.end_training()
        return accelerator._tracker_hub()

    return run


@pytest.fixture(scope="session")
def _aim_repo_template(tmp_path_factory: pytest.TempPathFactory) -> Path | None:
    """An empty Aim repository, made once: creating one runs a database migration that takes seconds."""
    from importlib.util import find_spec

    if find_spec("aim") is None:
        return None
    from aim import Repo

    path = tmp_path_factory.mktemp("aim-template")
    Repo.from_path(str(path), init=True).close()
    return path / ".aim"


@pytest.fixture
def empty_aim_repo(_aim_repo_template: Path | None) -> Callable[[Path], None]:
    """Copy the empty Aim repository into a directory (what ``aim init`` would leave there)."""

    def copy_to(directory: Path) -> None:
        if _aim_repo_template is not None:
            shutil.copytree(_aim_repo_template, directory / ".aim")

    return copy_to
