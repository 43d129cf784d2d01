"""Every public name of Accelerate 1.15's script-facing modules is provided under ``trainer.*``, or documented.

The names were recorded from Accelerate 1.15 by ``tests/fixtures/accelerate_names/record_names.py`` (run it with a
Python that has Accelerate to refresh ``accelerate_names.json``). A name missing here without a reason in
`trainer.unsupported` fails; so does a reason for a name that is provided after all (stale), or for a name
Accelerate does not have.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest

from trainer import unsupported

RECORD = json.loads((Path(__file__).parents[1] / "fixtures" / "accelerate_names" / "accelerate_names.json").read_text())
DOC = (Path(__file__).parents[2] / "docs" / "migrating-from-accelerate.md").read_text()


def _ours(module: str) -> str:
    return "trainer" + module[len("accelerate"):]


def _pairs() -> list[tuple[str, str]]:
    return [(module, name) for module, names in sorted(RECORD["modules"].items()) for name in names]


def test_the_record_is_accelerate_1_15() -> None:
    assert RECORD["accelerate_version"] == "1.15.0"
    assert len(_pairs()) > 300


@pytest.mark.parametrize("module", sorted(RECORD["modules"]))
def test_every_accelerate_name_is_provided_or_documented(module: str) -> None:
    ours = importlib.import_module(_ours(module))
    missing, stale = [], []
    for name in RECORD["modules"][module]:
        reason = unsupported.reason_for(ours.__name__, name)
        try:
            value = getattr(ours, name)
        except AttributeError:
            missing.append(name)
            continue
        if reason is None and hasattr(value, "unsupported_reason"):
            missing.append(name)
        elif reason is not None and not hasattr(value, "unsupported_reason"):
            stale.append(name)
    assert not missing, f"{ours.__name__} lacks Accelerate's {missing}: provide them, or list them with the reason in trainer/unsupported.py"
    assert not stale, f"{ours.__name__} provides {stale} now: remove them from trainer/unsupported.py"


def test_every_listed_name_is_an_accelerate_name() -> None:
    known = {(_ours(m), n) for m, n in _pairs()}
    listed = {(m, n) for m, reasons in unsupported.UNSUPPORTED.items() for names in reasons.values() for n in names}
    assert not listed - known, f"trainer/unsupported.py lists names Accelerate 1.15 does not have: {sorted(listed - known)}"


@pytest.mark.parametrize("package", sorted(RECORD["submodules"]))
def test_every_accelerate_submodule_imports_or_is_documented(package: str) -> None:
    missing = []
    for name in RECORD["submodules"][package]:
        ours = f"{_ours(package)}.{name}"
        if ours in unsupported.UNSUPPORTED_MODULES or (package == "accelerate.utils" and "trainer.utils.*" in unsupported.UNSUPPORTED_MODULES):
            continue
        try:
            importlib.import_module(ours)
        except ImportError:
            missing.append(ours)
    assert not missing, f"no module {missing}: add it, or give the reason in trainer.unsupported.UNSUPPORTED_MODULES"


def test_an_unsupported_name_imports_and_says_why_when_used() -> None:
    from trainer.utils import MegatronLMPlugin, load_fsdp_model

    with pytest.raises(NotImplementedError, match="Megatron-LM is not supported"):
        MegatronLMPlugin(tp_degree=2)
    with pytest.raises(NotImplementedError, match=r"trainer\.utils\.load_fsdp_model .*FSDP2"):
        load_fsdp_model(None, None, None, None)
    import trainer

    with pytest.raises(NotImplementedError, match="big-model inference"):
        trainer.dispatch_model(None)
    assert not hasattr(trainer.utils, "no_such_name")


def test_the_migration_guide_lists_every_unsupported_name() -> None:
    absent = [f"{m}.{n}" for m, reasons in unsupported.UNSUPPORTED.items() for names in reasons.values() for n in names
              if f"`{n}`" not in DOC]
    assert not absent, f"docs/migrating-from-accelerate.md does not name {absent} (section 'Names not provided')"


def test_availability_checks_are_real() -> None:
    import importlib.util

    import torch

    from trainer import utils

    assert utils.is_xpu_available() == (hasattr(torch, "xpu") and torch.xpu.is_available())
    assert utils.is_cuda_available() == torch.cuda.is_available()
    for name, module in (("is_schedulefree_available", "schedulefree"), ("is_deepspeed_available", "deepspeed"),
                         ("is_transformers_available", "transformers"), ("is_wandb_available", "wandb")):
        assert getattr(utils, name)() == (importlib.util.find_spec(module) is not None), name
    assert utils.is_npu_available() is (importlib.util.find_spec("torch_npu") is not None and torch.npu.is_available())
    assert utils.is_bf16_available() is True or torch.cuda.is_available()
    assert utils.is_fp8_available() is False or torch.cuda.is_available()
