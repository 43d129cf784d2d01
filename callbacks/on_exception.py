"""`OnExceptionCheckpoint`: save a checkpoint when training raises."""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING

from callbacks.base import Callback, in_fit
from callbacks.view import Preempted

if TYPE_CHECKING:
    from callbacks.view import TrainerView
    from trainer.fit.module import TrainModule


class OnExceptionCheckpoint(Callback):
    """Save a checkpoint to ``dirpath/filename`` when ``fit`` raises (including ``KeyboardInterrupt``).

    In a single-process run this writes a complete checkpoint through ``trainer.save_checkpoint``,
    which ``fit(..., ckpt_path=...)`` resumes from.

    In a multi-process run a failing rank cannot take part in collectives any more (its peers may
    already be gone), and ``trainer.save_checkpoint`` needs every rank. So each rank instead writes its
    own module weights, without any communication, to ``dirpath/filename/rank{N}.safetensors``. With
    DDP every rank holds the full model, so ``rank0.safetensors`` is a usable set of weights (load it
    with ``safetensors.torch.load_file`` and ``module.load_state_dict``); with sharded strategies each
    file holds that rank's shard only. Optimizer and data positions are not saved in that case.

    A failure while saving is reported as a warning so that the original exception still propagates.

    Args:
        dirpath: directory to write into (created if missing).
        filename: name of the checkpoint inside ``dirpath``; no path separators.

    Raises:
        ValueError: empty ``dirpath`` or a ``filename`` that is empty or contains a path separator.
        TypeError: ``dirpath`` is not a string or path.

    Example::

        trainer = Trainer(callbacks=[OnExceptionCheckpoint("checkpoints")])
        # after Ctrl-C:  trainer.fit(module, ckpt_path="checkpoints/on_exception")
    """

    def __init__(self, dirpath: str | os.PathLike[str], filename: str = "on_exception") -> None:
        if not isinstance(dirpath, (str, os.PathLike)):
            raise TypeError(
                f"OnExceptionCheckpoint(dirpath={dirpath!r}) has type {type(dirpath).__name__}; pass a directory path."
            )
        if not os.fspath(dirpath):
            raise ValueError("OnExceptionCheckpoint(dirpath='') is empty; pass the directory to save into, e.g. 'checkpoints'.")
        if not isinstance(filename, str) or not filename or "/" in filename or os.sep in filename:
            raise ValueError(
                f"OnExceptionCheckpoint(filename={filename!r}) is invalid; pass a plain non-empty name without "
                "path separators (put directories in dirpath)."
            )
        self.dirpath = os.fspath(dirpath)
        self.filename = filename
        self.saved_path: str | None = None

    @property
    def ckpt_path(self) -> str:
        """Where the checkpoint is written."""
        return os.path.join(self.dirpath, self.filename)

    def on_exception(self, trainer: TrainerView, module: TrainModule, exception: BaseException) -> None:
        if not in_fit(trainer, sanity_check=True):
            return  # nothing to resume after a failed validate/test/predict
        if isinstance(exception, Preempted):
            return  # the preemption checkpoint is already written
        try:
            if trainer.world_size > 1:
                self.saved_path = self._save_local_weights(trainer, module)
            else:
                trainer.save_checkpoint(self.ckpt_path)
                self.saved_path = self.ckpt_path
        except Exception as err:  # the training exception matters more than this one
            warnings.warn(
                f"OnExceptionCheckpoint could not save to {self.ckpt_path!r} after {type(exception).__name__}: "
                f"{type(err).__name__}: {err}",
                stacklevel=2,
            )
            return
        if trainer.is_global_zero:
            print(f"OnExceptionCheckpoint: saved a checkpoint to {self.saved_path} after {type(exception).__name__}.")

    def _save_local_weights(self, trainer: TrainerView, module: TrainModule) -> str:
        """Write this rank's module weights to ``ckpt_path/rank{N}.safetensors`` without collectives."""
        import torch
        from safetensors.torch import save_file

        tensors = {}
        for name, tensor in module.state_dict().items():
            if not isinstance(tensor, torch.Tensor):
                continue
            local = tensor.to_local() if hasattr(tensor, "to_local") else tensor  # DTensor shard
            tensors[name] = local.detach().cpu().contiguous().clone()
        os.makedirs(self.ckpt_path, exist_ok=True)
        path = os.path.join(self.ckpt_path, f"rank{trainer.global_rank}.safetensors")
        save_file(tensors, path)
        return path
