"""Lightning's ``lightning.pytorch.tuner`` under the rename: ``from trainer.tuner import Tuner``.

The tuners live in `trainer.fit.tuner` (`Tuner`), `trainer.fit.lr_finder` and `trainer.fit.batch_size_scaling`
(the run plumbing they share in `trainer.fit.search`);
their callbacks are `callbacks.LearningRateFinder` and `callbacks.BatchSizeFinder`.
"""

from __future__ import annotations

from trainer.fit.tuner import Tuner

__all__ = ["Tuner"]
