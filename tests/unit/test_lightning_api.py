"""Lightning 2.6's public import paths resolve under the rename (`tests/fixtures/lightning_api.json`).

Every name of every recorded module is offered (the renamed module has it, and it is no placeholder), or listed as not
offered with a reason (absent, or a placeholder that raises on use), or pending (built elsewhere now).
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.helpers.lightning_rename import lightning_to_trainwright
from trainer.lightning_api import is_not_offered

ROOT = Path(__file__).resolve().parents[2]
API = json.loads((ROOT / "tests" / "fixtures" / "lightning_api.json").read_text())


def _renamed_module(path: str) -> str:
    return lightning_to_trainwright(f"import {path}\n").split()[1]


def _renamed_name(name: str) -> str:
    return lightning_to_trainwright(name)


def _import(path: str) -> ModuleType:
    """The renamed module, by import or, for ``trainer.callbacks``/``trainer.loggers``, as `trainer`'s attribute."""
    try:
        return importlib.import_module(path)
    except ModuleNotFoundError:
        parent, _, child = path.rpartition(".")
        value = getattr(importlib.import_module(parent), child)
        assert isinstance(value, ModuleType), path
        return value


def _lookup(module: ModuleType, name: str) -> Any:
    try:
        return getattr(module, name)
    except AttributeError:
        return None


@pytest.mark.parametrize("lightning_path", sorted(API["modules"]))
def test_each_public_name_is_offered_or_listed(lightning_path: str) -> None:
    path = _renamed_module(lightning_path)
    try:
        module = _import(path)
    except (ImportError, AttributeError):
        assert lightning_path in API["modules_not_offered"], f"{lightning_path} -> {path} does not import"
        return
    missing, placeholders, listed_but_offered = [], [], []
    for name in API["modules"][lightning_path]:
        key, value = f"{lightning_path}.{name}", _lookup(module, _renamed_name(name))
        if key in API["pending"]:
            continue
        if key in API["not_offered"]:
            assert API["not_offered"][key], f"{key}: give the reason"
            if value is not None and not is_not_offered(value):
                listed_but_offered.append(key)
        elif value is None:
            missing.append(name)
        elif is_not_offered(value):
            placeholders.append(name)
    assert not missing, f"{path} lacks {missing} (Lightning's {lightning_path}): re-export them or list them as not_offered"
    assert not placeholders, f"{path}.{placeholders} are placeholders: list them as not_offered with the reason"
    assert not listed_but_offered, f"{listed_but_offered} are offered now: remove them from not_offered"


def test_a_placeholder_says_why_on_use_and_imports_fine() -> None:
    from trainer.accelerators import CUDAAccelerator
    from trainer.strategies import ParallelStrategy

    with pytest.raises(NotImplementedError, match=r"lightning.pytorch.strategies.ParallelStrategy is not offered.*subclass strategies.Strategy"):
        ParallelStrategy()
    with pytest.raises(NotImplementedError, match="ParallelStrategy"):
        type("Mine", (ParallelStrategy,), {})
    with pytest.raises(AttributeError, match=r"CUDAAccelerator.is_available: .*accelerator='cuda'"):
        CUDAAccelerator.is_available()
    assert not isinstance(object(), CUDAAccelerator)


def test_lightning_attribute_paths_resolve() -> None:
    """``import lightning.pytorch as pl; pl.callbacks.ModelCheckpoint``: Lightning's subpackages are attributes."""
    import callbacks
    import callbacks.trackers
    import trainer as pl

    assert pl.callbacks is callbacks and pl.loggers is callbacks.trackers
    assert pl.strategies.DDPStrategy is importlib.import_module("strategies").DDPStrategy
    assert pl.utilities.rank_zero_only is importlib.import_module("trainer.utilities.rank_zero").rank_zero_only
    assert pl.core.TrainModule is pl.TrainModule and pl.trainer.Trainer is pl.Trainer


def test_the_package_strategies_is_not_shadowed_inside_trainer() -> None:
    """With ``trainer.strategies`` loaded first, the project's own ``import strategies`` is still the package."""
    code = textwrap.dedent("""
        import trainer.strategies, trainer.utilities, trainer.plugins
        import strategies, trainer.fit.args, trainer.accelerator.builder
        assert strategies.__file__.endswith("strategies/__init__.py"), strategies.__file__
        assert trainer.fit.args.REGISTRY is strategies.REGISTRY
        assert trainer.strategies.FSDPStrategy is strategies.FSDPStrategy
    """)
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=120)


def test_rank_zero_only_reads_the_launchers_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainer.utilities import rank_zero

    monkeypatch.setattr(rank_zero.rank_zero_only, "rank", 1, raising=False)
    assert rank_zero.rank_zero_only(lambda: "ran", default="skipped")() == "skipped"
    monkeypatch.setattr(rank_zero.rank_zero_only, "rank", 0, raising=False)
    assert rank_zero.rank_zero_only(lambda: "ran")() == "ran"
    monkeypatch.setenv("RANK", "3")
    assert rank_zero._rank_from_environment() == 3


def test_utilities_match_lightning() -> None:
    """Values Lightning 2.6.6 gives for the same calls (run in a side environment)."""
    import torch

    from trainer.utilities import GradClipAlgorithmType, find_shared_parameters, grad_norm, is_picklable
    from trainer.utilities.seed import isolate_rng

    net = torch.nn.Linear(2, 1)
    net.weight.grad, net.bias.grad = torch.tensor([[3.0, 4.0]]), torch.tensor([12.0])
    norms = grad_norm(net, 2)
    assert sorted(norms) == ["grad_2.0_norm/bias", "grad_2.0_norm/weight", "grad_2.0_norm_total"]
    assert float(norms["grad_2.0_norm_total"]) == pytest.approx(13.0)
    tied = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    tied[1].weight = tied[0].weight
    assert find_shared_parameters(tied) == [["0.weight", "1.weight"]]
    assert GradClipAlgorithmType.NORM == "NORM" and GradClipAlgorithmType.from_str("value") is GradClipAlgorithmType.VALUE
    assert is_picklable(1) and not is_picklable(lambda: 1)
    with isolate_rng():
        first = torch.rand(1)
    assert torch.equal(torch.rand(1), first)


def test_the_record_matches_lightning() -> None:
    """Where Lightning is importable (a side environment), the recorded names are its own."""
    pytest.importorskip("lightning")
    sys.path.insert(0, str(ROOT / "tests" / "helpers"))
    try:
        from lightning_api import public_names  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    assert public_names() == API["modules"]
