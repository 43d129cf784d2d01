"""`BasePredictionWriter`: write predictions from a callback during ``predict`` (Lightning 2.6's base class).

Override `write_on_batch_end` (``write_interval="batch"``), `write_on_epoch_end` (``"epoch"``) or both
(``"batch_and_epoch"``), and run ``trainer.predict(module, loader, return_predictions=False)`` so that nothing is
kept in memory by the Trainer. Each process writes its own share of the data set (name the files by
``trainer.global_rank``). At the epoch's end the writer gets this process's predictions in the order it made them
(a list per dataloader with several loaders), which it kept itself.

``batch_indices`` (the sample indices of each batch, which Lightning records from the sampler) are not tracked by
this Trainer: a batch's are None and the epoch's are an empty list per dataloader, what Lightning passes when it cannot
infer them (predictions are in dataset order per process: with ``use_distributed_sampler``, process ``r`` of ``n`` has
the batches ``r, r + n, ...``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from callbacks.base import Callback

if TYPE_CHECKING:
    from callbacks.view import TrainerView
    from trainer.fit.module import TrainModule

WRITE_INTERVALS = ("batch", "epoch", "batch_and_epoch")


class BasePredictionWriter(Callback):
    """Base class of the callbacks that write predictions.

    Args:
        write_interval: ``"batch"``, ``"epoch"`` or ``"batch_and_epoch"``: when the write methods are called.

    Example::

        class TorchWriter(BasePredictionWriter):
            def __init__(self, output_dir):
                super().__init__(write_interval="epoch")
                self.output_dir = output_dir

            def write_on_epoch_end(self, trainer, pl_module, predictions, batch_indices):
                torch.save(predictions, os.path.join(self.output_dir, f"predictions_{trainer.global_rank}.pt"))

        trainer.predict(module, loader, return_predictions=False)
    """

    def __init__(self, write_interval: str = "batch") -> None:
        if write_interval not in WRITE_INTERVALS:
            raise ValueError(f"{type(self).__name__}(write_interval={write_interval!r}): `write_interval` should be one of {list(WRITE_INTERVALS)}")
        self.interval = write_interval
        self._predictions: list[list[Any]] = []
        self._batch_indices: list[list[Any]] = []

    @property
    def on_batch(self) -> bool:
        return self.interval in ("batch", "batch_and_epoch")

    @property
    def on_epoch(self) -> bool:
        return self.interval in ("epoch", "batch_and_epoch")

    def write_on_batch_end(self, trainer: TrainerView, pl_module: TrainModule, prediction: Any, batch_indices: Sequence[int] | None,
                           batch: Any, batch_idx: int, dataloader_idx: int) -> None:
        """Override to write one batch's prediction."""
        raise NotImplementedError(f"{type(self).__name__}(write_interval={self.interval!r}) must override write_on_batch_end")

    def write_on_epoch_end(self, trainer: TrainerView, pl_module: TrainModule, predictions: Sequence[Any], batch_indices: Sequence[Any]) -> None:
        """Override to write all of this process's predictions at the epoch's end."""
        raise NotImplementedError(f"{type(self).__name__}(write_interval={self.interval!r}) must override write_on_epoch_end")

    def on_predict_epoch_start(self, trainer: TrainerView, module: TrainModule) -> None:
        self._predictions, self._batch_indices = [], []

    def on_predict_batch_end(self, trainer: TrainerView, module: TrainModule, outputs: Any, batch: Any, batch_idx: int,
                             dataloader_idx: int = 0) -> None:
        if self.on_epoch:
            while len(self._predictions) <= dataloader_idx:
                self._predictions.append([])
                self._batch_indices.append([])
            self._predictions[dataloader_idx].append(outputs)
        if self.on_batch:
            self.write_on_batch_end(trainer, module, outputs, None, batch, batch_idx, dataloader_idx)

    def on_predict_epoch_end(self, trainer: TrainerView, module: TrainModule) -> None:
        if not self.on_epoch:
            return
        several = len(self._predictions) > 1
        predictions = self._predictions if several else (self._predictions[0] if self._predictions else [])
        indices = self._batch_indices or [[]]  # a list per dataloader, as Lightning's
        try:
            self.write_on_epoch_end(trainer, module, predictions, indices)
        finally:
            self._predictions, self._batch_indices = [], []


__all__ = ["BasePredictionWriter"]
