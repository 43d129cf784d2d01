"""Shared test fixtures: every test runs in its own temporary working directory and HOME."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(autouse=True)
def _isolate_files(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep tests from writing outside their tmp dirs (cwd, HOME, config locations)."""
    work = tmp_path_factory.mktemp("cwd")
    home = tmp_path_factory.mktemp("home")
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    for name in list(os.environ):
        if name.startswith("TRAINWRIGHT_") or name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            monkeypatch.delenv(name, raising=False)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--stress-runs", type=int, default=1, dest="stress_runs",
                     help="runs of each stress scenario (tests/stress; default 1: every check once; python -m tests.stress runs many)")
