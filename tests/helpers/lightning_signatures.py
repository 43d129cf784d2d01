"""Lightning 2.6's constructor and method signatures, as recorded in ``tests/fixtures/lightning_signatures.json``.

Run it where Lightning is installed (a side virtual environment; never in the project's) to refresh the record::

    /path/to/venv-with-lightning/bin/python tests/helpers/lightning_signatures.py > tests/fixtures/lightning_signatures.json

Recorded per class (``Trainer``, ``LightningModule``, ``LightningDataModule``, ``Callback`` and every class of
``lightning.pytorch.callbacks``): ``__init__`` and each public method (functions, class and static methods) that a
Lightning class of its MRO defines; a callback subclass leaves out the hooks it inherits from ``Callback`` (recorded
once, on ``Callback``), and ``nn.Module``'s methods are left out. Each parameter: name, kind, and its default where
it is a plain value (None, a bool, a number, a string), else ``"<object>"``; ``"<required>"`` when there is none.
`tests/unit/test_lightning_signatures.py` checks ours against the record, and the record against Lightning when
Lightning is importable.
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
from typing import Any

REQUIRED = "<required>"
OBJECT = "<object>"


def _default(value: Any) -> Any:
    if value is inspect.Parameter.empty:
        return REQUIRED
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return OBJECT


def parameters(function: Any) -> list[list[Any]]:
    """``[name, kind, default]`` for each parameter of `function`, ``self``/``cls`` left out."""
    rows = []
    for index, parameter in enumerate(inspect.signature(function).parameters.values()):
        if index == 0 and parameter.name in ("self", "cls"):
            continue
        rows.append([parameter.name, parameter.kind.name, _default(parameter.default)])
    return rows


def _methods(cls: type, skip: tuple[type, ...]) -> dict[str, list[list[Any]]]:
    methods: dict[str, list[list[Any]]] = {}
    for owner in reversed(cls.__mro__):
        if not owner.__module__.startswith("lightning") or owner in skip:
            continue
        for name, member in vars(owner).items():
            if name != "__init__" and name.startswith("_"):
                continue
            if isinstance(member, (classmethod, staticmethod)):
                rows = parameters(member.__func__)
            elif inspect.isfunction(member):
                rows = parameters(member)
            else:
                continue
            methods[name] = rows
    return methods


def signatures() -> dict[str, dict[str, list[list[Any]]]]:
    """The record: ``{"lightning.pytorch.Class": {"method": [[name, kind, default], ...]}}``."""
    import lightning.pytorch as pl
    import lightning.pytorch.callbacks as callbacks

    record: dict[str, dict[str, list[list[Any]]]] = {}
    for cls in (pl.Trainer, pl.LightningModule, pl.LightningDataModule, pl.Callback):
        record[f"lightning.pytorch.{cls.__name__}"] = _methods(cls, ())
    for name in sorted(callbacks.__all__):
        cls = getattr(callbacks, name)
        if cls is not pl.Callback:
            record[f"lightning.pytorch.callbacks.{name}"] = _methods(cls, (pl.Callback,))
    return record


def dumps(record: dict[str, dict[str, list[list[Any]]]]) -> str:
    """The fixture's text: one line per method, so a refresh diffs method by method."""
    classes = ",\n".join(
        f" {json.dumps(cls)}: {{\n" + ",\n".join(f"  {json.dumps(m)}: {json.dumps(rows)}" for m, rows in methods.items()) + "\n }"
        for cls, methods in record.items()
    )
    version = importlib.import_module("lightning").__version__
    return f'{{\n"lightning_version": {json.dumps(version)},\n"classes": {{\n{classes}\n}}\n}}\n'


if __name__ == "__main__":
    sys.stdout.write(dumps(signatures()))
