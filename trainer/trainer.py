"""``lightning.pytorch.trainer`` under the rename: the `Trainer` and ``seed_everything``."""

from __future__ import annotations

from trainer.fit.trainer import Trainer
from trainer.utils import seed_everything

__all__ = ["Trainer", "seed_everything"]
