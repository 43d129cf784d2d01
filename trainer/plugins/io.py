"""``lightning.pytorch.plugins.io`` under the rename: ``AsyncCheckpointIO`` (asynchronous checkpoints,
`trainer.fit.plugins`). The file-writing plugins are not offered: checkpoints are directories in one format, written
and verified by the checkpoint store (`strategies.checkpoint_store`, docs/checkpoints.md)."""

from __future__ import annotations

from trainer.fit.plugins import AsyncCheckpointIO
from trainer.lightning_api import not_offered

_ONE_FORMAT = (
    "checkpoints are directories in one format (safetensors, tensor-only files, sharded DCP), written and verified by the "
    "checkpoint store: there is no file-writing plugin to swap (docs/checkpoints.md)"
)
CheckpointIO = not_offered("CheckpointIO", "lightning.pytorch.plugins.io", _ONE_FORMAT, module=__name__)
TorchCheckpointIO = not_offered("TorchCheckpointIO", "lightning.pytorch.plugins.io", _ONE_FORMAT, module=__name__)
XLACheckpointIO = not_offered("XLACheckpointIO", "lightning.pytorch.plugins.io", _ONE_FORMAT, module=__name__)

__all__ = ["AsyncCheckpointIO", "CheckpointIO", "TorchCheckpointIO", "XLACheckpointIO"]
