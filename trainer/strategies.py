"""``lightning.pytorch.strategies`` under the rename: the strategies of the top-level `strategies` package.

``FSDPStrategy`` is FSDP2 (``fully_shard``), what Lightning calls ``ModelParallelStrategy`` without tensor
parallelism; see docs/strategies.md for each strategy's arguments.
"""

from __future__ import annotations

from strategies import DDPStrategy, DeepSpeedStrategy, FSDPStrategy, SingleDeviceStrategy, Strategy, XLAStrategy
from trainer.lightning_api import not_offered

ParallelStrategy = not_offered(
    "ParallelStrategy", "lightning.pytorch.strategies",
    "strategies share no parallel base class here; subclass strategies.Strategy (strategies/base.py) for a new strategy",
    module=__name__,
)

__all__ = ["DDPStrategy", "DeepSpeedStrategy", "FSDPStrategy", "ParallelStrategy", "SingleDeviceStrategy", "Strategy", "XLAStrategy"]
