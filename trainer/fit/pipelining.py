"""Pipeline stages in a `TrainModule`: ``self.pipeline_step``, ``self.pipeline_eval``, ``self.pipeline_forward``.

With ``Trainer(strategy=FSDPStrategy(parallel_dims=ParallelDims(pp=2, ...), pipeline=PipelineConfig(...)))`` (or
``ModelParallelStrategy(pipeline_parallel_size=2)``) the module is split into stages by layer name
(`strategies.pipeline_split`) and each process holds its own; a step runs every microbatch through all of them::

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = self.pipeline_step(x, target=y, loss_fn=F.cross_entropy)   # forward and backward, every microbatch
        self.log("loss", loss)                                          # the batch's loss, on every process
        return loss

The Trainer then runs no backward of its own; it zeroes the gradients before the step on a window's first batch (not
after ``training_step``, Lightning's place, which would wipe what the step computed), steps the optimizer at the
window's end, and clips over the whole pipeline. ``on_before_backward`` does not fire (the backward runs inside the
schedule); ``on_after_backward`` fires after the step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from callbacks.view import ModuleTrainerView
    from strategies.pipeline import Pipeline


class PipelineSteps:
    """The pipeline methods of `TrainModule` (see the module docstring)."""

    _trainer: ModuleTrainerView | None

    def pipeline_step(self, *args: Any, target: Any, loss_fn: Callable[..., torch.Tensor]) -> torch.Tensor:
        """Forward and backward of the batch `args` through every pipeline stage, in microbatches; gradients
        accumulate in this process's stages. Returns the batch's loss (the mean of ``loss_fn(output, target)`` over
        the microbatches) on every process. Call it once per ``training_step`` and return what it returns."""
        pipeline = self._pipeline("pipeline_step")
        trainer = self._trainer
        assert trainer is not None  # _pipeline checked it
        steps = trainer.accelerator.stepper.accumulation_steps
        return pipeline.step(*args, target=target, loss_fn=loss_fn, accumulation_steps=steps)

    def pipeline_eval(self, *args: Any, target: Any, loss_fn: Callable[..., torch.Tensor]) -> torch.Tensor:
        """The loss of the batch `args` against `target` through every stage, forward only, on every process."""
        return self._pipeline("pipeline_eval").eval(*args, target=target, loss_fn=loss_fn)

    def pipeline_forward(self, *args: Any) -> Any:
        """The last stage's outputs for the batch `args`, forward only, on every process (for ``predict_step``)."""
        return self._pipeline("pipeline_forward").forward(*args)

    def _pipeline(self, method: str) -> Pipeline:
        trainer = self._trainer
        pipeline = trainer.accelerator.strategy.pipeline if trainer is not None else None
        if pipeline is None or not pipeline.stages:
            raise RuntimeError(
                f"self.{method}(...) runs the module's pipeline stages, and this module has none: it needs "
                "Trainer(strategy=FSDPStrategy(parallel_dims=ParallelDims(world_size, pp=2, ...), pipeline=PipelineConfig(...))) "
                "or ModelParallelStrategy(pipeline_parallel_size=2), inside fit/validate/test/predict; without pipeline "
                "stages call the model itself (self(x)) and return the loss"
            )
        return pipeline
