"""No file of the tests, examples or benchmarks is named like a package a script imports.

A script run as ``python some/folder/script.py`` has its folder first on ``sys.path``, so a ``some/folder/tensorboard.py``
is what ``import tensorboard`` finds there: torch's ``SummaryWriter`` then failed in every Accelerate example run
through ``tests/helpers`` ("TensorBoard logging requires TensorBoard version 1.15 or above").
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OWN = tuple(ROOT / top for top in ("tests", "examples", "benchmarks", "trainer", "callbacks", "strategies"))


def _installed(name: str) -> str | None:
    """Where an importable top-level module `name` lives outside the project's own folders, or None."""
    saved = sys.path[:]
    sys.path[:] = [p for p in sys.path if p not in ("", ".") and Path(p).resolve() != ROOT]
    try:
        spec = importlib.util.find_spec(name) if name not in sys.modules else sys.modules[name].__spec__
    except (ImportError, ValueError):
        spec = None
    finally:
        sys.path[:] = saved
    origin = spec.origin if spec is not None else None
    if origin is None or any(Path(origin).resolve().is_relative_to(own) for own in OWN):
        return None
    return origin


def test_no_file_in_a_script_folder_shadows_an_installed_module() -> None:
    shadowing = []
    for top in ("tests", "examples", "benchmarks"):
        for path in (ROOT / top).rglob("*.py"):
            if path.stem.startswith("__") or path.stem.startswith("test_") or path.stem == "conftest":
                continue
            origin = _installed(path.stem)
            if origin is not None:
                shadowing.append(f"{path.relative_to(ROOT)} shadows {origin}")
    assert not shadowing, "rename these files (a script in their folder imports them instead of the package):\n" + "\n".join(shadowing)


def test_the_check_sees_a_shadowing_name() -> None:
    assert _installed("tensorboard") is not None and _installed("tests_helpers_no_such_module") is None
