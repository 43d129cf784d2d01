"""Our signatures take every call Lightning 2.6's take (`tests/fixtures/lightning_signatures.json`).

For ``Trainer``, ``TrainModule`` (``LightningModule``), ``DataModule`` (``LightningDataModule``), ``Callback`` and each
callback we ship, every recorded method exists and every parameter Lightning has is ours too:

* by name; a Lightning ``*args``/``**kwargs`` is ours too;
* a parameter Lightning takes by position is ours at the same position (so positional calls mean the same);
* a parameter with a default in Lightning has one here, and a plain default (a bool, number or string) is the same;
* a parameter only we have has a default (so a Lightning call still binds).

The exceptions are the table "Signatures that differ from Lightning's" in ``docs/migrating-from-lightning.md``, each
with its reason there; this test reads them from that table and fails on an entry that no longer differs. A Lightning
callback we do not ship (absent, or a placeholder: see `tests/unit/test_lightning_api.py`) is not checked here.
"""

from __future__ import annotations

import fnmatch
import importlib
import inspect
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from trainer.lightning_api import is_not_offered

ROOT = Path(__file__).resolve().parents[2]
RECORD = json.loads((ROOT / "tests" / "fixtures" / "lightning_signatures.json").read_text())
GUIDE = ROOT / "docs" / "migrating-from-lightning.md"
HEADING = "### Signatures that differ from Lightning's"

OURS = {
    "lightning.pytorch.Trainer": ("trainer", "Trainer"),
    "lightning.pytorch.LightningModule": ("trainer", "TrainModule"),
    "lightning.pytorch.LightningDataModule": ("trainer", "DataModule"),
    "lightning.pytorch.Callback": ("callbacks", "Callback"),
}
HOOKS = set(RECORD["classes"]["lightning.pytorch.Callback"]) - {"__init__"}
VAR = ("VAR_POSITIONAL", "VAR_KEYWORD")
POSITIONAL = ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")


def documented_exceptions() -> dict[str, str]:
    """``{key: reason}`` from the guide's table: a key is ``Class.method`` (the method is missing),
    ``Class.method(param)`` (``Class(param)`` for ``__init__``; ``(+)``: ours requires a parameter Lightning lacks), with our
    class names; ``*`` matches any run of characters (``Callback.*(pl_module)``)."""
    text = GUIDE.read_text()
    assert HEADING in text, f"{GUIDE} lacks the section {HEADING!r}"
    section = text.split(HEADING, 1)[1].split("\n#", 1)[0]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        match = re.match(r"\|([^|]*`[^|]*)\|(.*)\|\s*$", line)
        if match:
            keys, reason = re.findall(r"`([^`]+)`", match.group(1)), match.group(2).strip()
            assert reason, f"{keys}: give the reason in {GUIDE.name}"
            for key in keys:
                assert key not in rows, f"{key} is listed twice"
                rows[key] = reason
    return rows


def our_class(lightning_name: str) -> Any:
    """Our class for `lightning_name`, or None where we do not ship it."""
    module, name = OURS.get(lightning_name, ("callbacks", lightning_name.rsplit(".", 1)[1]))
    value = getattr(importlib.import_module(module), name, None)
    return None if value is None or is_not_offered(value) else value


def _ours(function: Any) -> list[list[Any]]:
    sys.path.insert(0, str(ROOT / "tests" / "helpers"))
    try:
        from lightning_signatures import parameters  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    return parameters(function)


def differences(theirs: list[list[Any]], ours: list[list[Any]]) -> dict[str | None, str]:
    """``{parameter: what differs}`` (key None: a parameter only we have that a Lightning call cannot bind)."""
    found: dict[str | None, str] = {}
    by_name = {row[0]: (index, row) for index, row in enumerate(ours)}
    names = {row[0] for row in theirs}
    our_vars = {row[1] for row in ours if row[1] in VAR}
    for index, (name, kind, default) in enumerate(theirs):
        if kind in VAR:
            if kind not in our_vars:
                found[name] = f"Lightning takes {'*' if kind == 'VAR_POSITIONAL' else '**'}{name}; ours does not"
            continue
        if name not in by_name:
            renamed = ours[index][0] if index < len(ours) and ours[index][1] == kind and ours[index][0] not in names else None
            found[name] = f"named {renamed!r} here" if renamed and kind in POSITIONAL else "missing"
            continue
        our_index, (_, our_kind, our_default) = by_name[name]
        if kind in POSITIONAL and (our_kind not in POSITIONAL or our_index != index):
            found[name] = f"Lightning takes it by position (index {index}); ours is {our_kind} at index {our_index}"
        elif default != "<required>" and our_default == "<required>":
            found[name] = f"Lightning's default is {default!r}; ours is required"
        elif not isinstance(default, str | bool | int | float) or default in ("<object>", "<required>"):
            continue
        elif our_default != default or isinstance(our_default, bool) != isinstance(default, bool):
            found[name] = f"Lightning's default is {default!r}; ours is {our_default!r}"
    extra = [row[0] for index, row in enumerate(ours) if row[0] not in names and row[1] not in VAR and row[2] == "<required>"
             and not (index < len(theirs) and found.get(theirs[index][0]) == f"named {row[0]!r} here")]
    if extra:
        found[None] = f"ours also requires {extra}"
    return found


def _key(our_name: str, method: str, parameter: str | None = None) -> str:
    if parameter is None:
        return our_name if method == "" else f"{our_name}.{method}"
    return f"{our_name}({parameter})" if method == "__init__" else f"{our_name}.{method}({parameter})"


def signature_gaps() -> dict[str, str]:
    """Every difference from the record, keyed as in the guide's table."""
    gaps: dict[str, str] = {}
    for lightning_name, methods in RECORD["classes"].items():
        cls = our_class(lightning_name)
        if cls is None:
            continue
        our_name = cls.__name__
        for method, theirs in methods.items():
            if lightning_name.startswith("lightning.pytorch.callbacks.") and method in HOOKS:
                continue  # the Trainer calls a hook the same way on every callback: checked once, on Callback
            function = inspect.getattr_static(cls, method, None)
            if isinstance(function, (classmethod, staticmethod)):
                function = function.__func__
            if function is None or not callable(function):
                gaps[_key(our_name, method)] = "missing"
                continue
            for parameter, what in differences(theirs, _ours(function)).items():
                gaps[_key(our_name, method, parameter or "+")] = what
    return gaps


def _listed(key: str, listed: dict[str, str]) -> bool:
    return any(fnmatch.fnmatchcase(key, pattern) for pattern in listed)


def test_every_lightning_signature_is_ours_or_listed() -> None:
    gaps, listed = signature_gaps(), documented_exceptions()
    undocumented = {key: what for key, what in gaps.items() if not _listed(key, listed)}
    assert not undocumented, (
        "signatures that lack what Lightning 2.6's have: add the parameters, or list each with its reason in "
        f"{GUIDE.name} ({HEADING}):\n" + "\n".join(f"  {key}: {what}" for key, what in sorted(undocumented.items()))
    )


def test_every_listed_exception_still_differs() -> None:
    gaps, listed = signature_gaps(), documented_exceptions()
    stale = sorted(pattern for pattern in listed if not any(fnmatch.fnmatchcase(key, pattern) for key in gaps))
    assert not stale, f"these match Lightning now: remove them from {GUIDE.name} ({HEADING}): {stale}"


def test_the_comparison_catches_each_kind_of_difference() -> None:
    theirs = [["a", "POSITIONAL_OR_KEYWORD", "<required>"], ["b", "POSITIONAL_OR_KEYWORD", 1], ["c", "KEYWORD_ONLY", True],
              ["d", "KEYWORD_ONLY", None], ["kwargs", "VAR_KEYWORD", "<required>"]]
    assert differences(theirs, theirs) == {}
    assert differences(theirs, [["b", "POSITIONAL_OR_KEYWORD", 1], ["a", "POSITIONAL_OR_KEYWORD", "<required>"],
                                ["c", "KEYWORD_ONLY", 1], ["d", "KEYWORD_ONLY", "<required>"], ["e", "KEYWORD_ONLY", "<required>"]]) == {
        "a": "Lightning takes it by position (index 0); ours is POSITIONAL_OR_KEYWORD at index 1",
        "b": "Lightning takes it by position (index 1); ours is POSITIONAL_OR_KEYWORD at index 0",
        "c": "Lightning's default is True; ours is 1",
        "d": "Lightning's default is None; ours is required",
        "kwargs": "Lightning takes **kwargs; ours does not",
        None: "ours also requires ['e']",
    }
    assert differences(theirs[:1], []) == {"a": "missing"}
    assert differences(theirs[:1], [["x", "POSITIONAL_OR_KEYWORD", "<required>"]]) == {"a": "named 'x' here"}


def test_the_record_matches_lightning() -> None:
    """Where Lightning is importable (a side environment), the record is its own."""
    pytest.importorskip("lightning")
    sys.path.insert(0, str(ROOT / "tests" / "helpers"))
    try:
        from lightning_signatures import signatures  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    assert signatures() == RECORD["classes"]
