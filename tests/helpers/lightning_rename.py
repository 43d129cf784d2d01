"""The rename that ports a Lightning 2.x script to Trainwright: import paths and class names only.

It is the table in ``docs/migrating-from-lightning.md`` ("The rename") as a function, applied to a script's source:

=====================================================  =========================
Lightning                                              Trainwright
=====================================================  =========================
``lightning.pytorch.callbacks`` (``pytorch_lightning.callbacks``)  ``callbacks``
``lightning.pytorch.loggers`` (``pytorch_lightning.loggers``)      ``callbacks.trackers``
``lightning.pytorch``, ``pytorch_lightning``, ``lightning``        ``trainer``
``LightningModule``                                    ``TrainModule``
``LightningDataModule``                                ``DataModule``
=====================================================  =========================

Everything else (``Trainer``, ``seed_everything``, ``Callback``, callback and logger class names, arguments) keeps
its Lightning name.
"""

from __future__ import annotations

import re

_MODULES = [  # longest first, so a package is renamed before its parent
    (r"(?:lightning\.pytorch|pytorch_lightning)\.callbacks", "callbacks"),
    (r"(?:lightning\.pytorch|pytorch_lightning)\.loggers", "callbacks.trackers"),
    (r"lightning\.pytorch|pytorch_lightning|lightning", "trainer"),
]
_CLASSES = [("LightningDataModule", "DataModule"), ("LightningModule", "TrainModule")]


def lightning_to_trainwright(source: str) -> str:
    """`source` with Lightning's import paths and class names replaced by Trainwright's (see the table above)."""
    for pattern, name in _MODULES:
        source = re.sub(rf"(?m)^(\s*(?:from|import)\s+)(?:{pattern})\b", rf"\g<1>{name}", source)
    for old, new in _CLASSES:
        source = re.sub(rf"\b{old}\b", new, source)
    return source
