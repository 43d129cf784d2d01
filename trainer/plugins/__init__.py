"""``lightning.pytorch.plugins`` under the rename: the precision objects (`trainer.plugins.precision`) and the
environment names (`trainer.plugins.environments`, none offered).

``AsyncCheckpointIO`` (`trainer.plugins.io`) makes the Trainer's checkpoints asynchronous; the file-writing plugins
(``CheckpointIO``, ``TorchCheckpointIO``, ``XLACheckpointIO``) are not offered: one checkpoint store writes every
checkpoint (docs/checkpoints.md).
"""

from __future__ import annotations

from trainer.lightning_api import not_offered
from trainer.plugins.io import AsyncCheckpointIO, CheckpointIO, TorchCheckpointIO, XLACheckpointIO
from trainer.plugins.precision import (
    BitsandbytesPrecision,
    DeepSpeedPrecision,
    DoublePrecision,
    FSDPPrecision,
    HalfPrecision,
    MixedPrecision,
    Precision,
    TransformerEnginePrecision,
    XLAPrecision,
)

_SYNC_BATCHNORM = "pass Trainer(sync_batchnorm=True): BatchNorm layers become torch's SyncBatchNorm before the module is wrapped"
LayerSync = not_offered("LayerSync", "lightning.pytorch.plugins", _SYNC_BATCHNORM, module=__name__)
TorchSyncBatchNorm = not_offered("TorchSyncBatchNorm", "lightning.pytorch.plugins", _SYNC_BATCHNORM, module=__name__)

__all__ = [
    "AsyncCheckpointIO",
    "BitsandbytesPrecision",
    "CheckpointIO",
    "DeepSpeedPrecision",
    "DoublePrecision",
    "FSDPPrecision",
    "HalfPrecision",
    "LayerSync",
    "MixedPrecision",
    "Precision",
    "TorchCheckpointIO",
    "TorchSyncBatchNorm",
    "TransformerEnginePrecision",
    "XLACheckpointIO",
    "XLAPrecision",
]
