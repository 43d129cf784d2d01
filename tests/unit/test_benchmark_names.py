"""A benchmark file named like a library shadows that library: running ``python benchmarks/x.py`` (or a script in
one of its script folders) puts that folder first on sys.path, so ``import deepspeed`` inside Accelerate found our
``benchmarks/deepspeed.py`` and the side-by-side rows failed."""

import importlib.metadata
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_no_benchmark_module_is_named_like_an_installed_or_standard_module():
    taken = set(sys.stdlib_module_names) | set(importlib.metadata.packages_distributions())
    folders = [BENCHMARKS, *(p for p in BENCHMARKS.iterdir() if p.is_dir() and p.name != "__pycache__")]
    names = {f.relative_to(BENCHMARKS.parent).as_posix(): f.stem for folder in folders for f in folder.glob("*.py")}
    assert len(names) > 10
    assert {path: stem for path, stem in names.items() if stem in taken} == {}
