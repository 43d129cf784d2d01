"""``lightning.pytorch.strategies`` under the rename: the strategies of the top-level `strategies` package.

``FSDPStrategy`` is FSDP2 (``fully_shard``; with ``parallel_dims``, HSDP and tensor parallelism applied for you);
``ModelParallelStrategy`` is Lightning's (the module parallelizes itself in ``configure_model`` with
``self.device_mesh``). See docs/strategies.md for each strategy's arguments.
"""

from __future__ import annotations

from strategies import DDPStrategy, DeepSpeedStrategy, FSDPStrategy, ModelParallelStrategy, SingleDeviceStrategy, Strategy, XLAStrategy
from trainer.lightning_api import not_offered

ParallelStrategy = not_offered(
    "ParallelStrategy", "lightning.pytorch.strategies",
    "strategies share no parallel base class here; subclass strategies.Strategy (strategies/base.py) for a new strategy",
    module=__name__,
)

__all__ = ["DDPStrategy", "DeepSpeedStrategy", "FSDPStrategy", "ModelParallelStrategy", "ParallelStrategy", "SingleDeviceStrategy", "Strategy", "XLAStrategy"]
