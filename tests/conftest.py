"""Shared test fixtures: every test runs in its own temporary working directory and HOME."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


def _cache_bytecode_once() -> None:
    """Where the environment forbids writing bytecode next to the sources (``PYTHONDONTWRITEBYTECODE``), every process
    of the suite (a few hundred start here) would compile again each module it imports that has no cached bytecode:
    with the README's ``pip install --no-compile``, all of torch's. The suite's processes keep their compiled modules in
    one folder of their own instead (``PYTHONPYCACHEPREFIX``, under the temporary directory): each module is compiled
    once, and nothing is written into the sources or the environment. Set here, at the suite's start, so the xdist
    workers and every process they start inherit it."""
    if not sys.dont_write_bytecode or os.environ.get("PYTHONPYCACHEPREFIX"):
        return
    prefix = str(Path(tempfile.gettempdir(), f"trainwright-test-bytecode-{os.getuid()}"))
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = prefix
    sys.pycache_prefix, sys.dont_write_bytecode = prefix, False


_cache_bytecode_once()


def _session_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder this test session's temporary files are under (shared by its xdist workers)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(autouse=True)
def _isolate_files(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Keep tests from writing outside their tmp dirs (cwd, HOME, config locations), and from leaving environment
    variables for the next test on the worker: a package run in the test's process may set its own (ClearML sets
    ``CLEARML_PROC_MASTER_ID``, and a ClearML started later by a subprocess of another test then took itself for
    that task's child and wrote no metrics)."""
    environ = dict(os.environ)
    work = tmp_path_factory.mktemp("cwd")
    home = tmp_path_factory.mktemp("home")
    monkeypatch.chdir(work)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / ".config"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
    # C++ extensions built at run time (none today: DeepSpeed's CPU communication op is skipped by the strategy) are
    # built once per test session and shared, not once per test's fresh HOME; torch's build lock serializes the workers
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(_session_root(tmp_path_factory) / "torch_extensions"))
    for name in list(os.environ):
        if name.startswith("TRAINWRIGHT_") or name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            monkeypatch.delenv(name, raising=False)
    yield
    os.environ.clear()
    os.environ.update(environ)


@pytest.fixture(autouse=True)
def _no_process_group_left() -> Iterator[None]:
    """A one-process group a test's strategy joined in this process (DeepSpeed needs one) ends with the test, as it
    would with the script: the next test on this worker starts without one, whatever ran before it."""
    yield
    from tests.helpers.multiprocess import end_process_group

    end_process_group()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--stress-runs", type=int, default=1, dest="stress_runs",
                     help="runs of each stress scenario (tests/stress; default 1: every check once; python -m tests.stress runs many)")


_PROCESS_DIRS = ("integration", "stress")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that start processes (multi-process jobs, launches, scripts) are slow: ``pytest -m "not slow"`` skips them."""
    for item in items:
        if item.get_closest_marker("distributed") or item.path.parent.name in _PROCESS_DIRS:
            item.add_marker(pytest.mark.slow)
