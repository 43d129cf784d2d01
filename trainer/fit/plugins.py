"""Lightning's ``Trainer(plugins=[...])``: the one plugin whose work is not an argument here.

``AsyncCheckpointIO()`` makes the Trainer's checkpoints asynchronous. It is not Lightning's thread around a
``torch.save`` of the live state (which can write tensors the next step is already changing): the step copies the
state into staging buffers, the copy is written in the background, and the checkpoint is committed only once every
process's write finished (`strategies.checkpoint_store`).
"""

from __future__ import annotations

from typing import Any


class AsyncCheckpointIO:
    """``Trainer(plugins=[AsyncCheckpointIO()])``: save checkpoints in the background (see the module docstring).

    Args:
        checkpoint_io: Lightning's inner ``CheckpointIO``; only None is accepted (checkpoints here have one format).
    """

    def __init__(self, checkpoint_io: Any = None) -> None:
        if checkpoint_io is not None:
            raise NotImplementedError(
                f"AsyncCheckpointIO(checkpoint_io={checkpoint_io!r}): checkpoints here are written by one store in one format "
                "(safetensors, tensor-only files, sharded DCP files; hashed, committed with a manifest), so there is no "
                "CheckpointIO to wrap. Use AsyncCheckpointIO() alone"
            )

    def __repr__(self) -> str:
        return "AsyncCheckpointIO()"


def check_plugins(plugins: Any) -> bool:
    """Check ``Trainer(plugins=...)``; return whether checkpoints are saved in the background."""
    if plugins is None:
        return False
    listed = list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]
    async_save = False
    for plugin in listed:
        if isinstance(plugin, AsyncCheckpointIO):
            async_save = True
        elif isinstance(plugin, str):
            raise ValueError(f"Trainer(plugins=[{plugin!r}]): plugins are given as objects here; use AsyncCheckpointIO()")
        else:
            raise ValueError(
                f"Trainer(plugins=[{type(plugin).__name__}(...)]) is not supported: AsyncCheckpointIO() is the one plugin here; "
                "precision is Trainer(precision=...), the cluster is detected (or set by `trainer launch`), and checkpoints "
                "have one format"
            )
    return async_save
