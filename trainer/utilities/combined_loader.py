"""``lightning.pytorch.utilities.combined_loader`` under the rename: `CombinedLoader` (``trainer.fit.combined_loader``)."""

from __future__ import annotations

from trainer.fit.combined_loader import CombinedLoader

__all__ = ["CombinedLoader"]
