"""Pipeline stages in the Accelerator face: ``accelerator.pipeline_step``, ``pipeline_eval``, ``pipeline_forward``.

With ``Accelerator(parallelism_config=ParallelismConfig(pp_size=2, dp_shard_size=2, pp_handler=PipelineConfig(...)))``
``prepare`` splits the model into stages by layer name (`strategies.pipeline`), keeps this process's, and re-points an
optimizer built on the whole model at this process's stages' parameters. The loop keeps its shape::

    for x, y in loader:
        with accelerator.accumulate(model):
            loss = accelerator.pipeline_step(model, x, target=y, loss_fn=F.cross_entropy)  # forward and backward
            accelerator.backward(loss)          # a no-op for a pipeline loss: its backward ran in the schedule
            optimizer.step()
            optimizer.zero_grad()

The loss is the batch's (the mean over its microbatches), on every process of the pipeline; each microbatch's loss was
divided by microbatches × `gradient_accumulation_steps` for its backward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from strategies.base import Strategy
    from strategies.pipeline import Pipeline
    from trainer.accelerator.stepper import Stepper

PIPELINE_LOSS = "_trainwright_pipeline_loss"  # set on a loss pipeline_step returned: backward() leaves it alone


def is_pipeline_loss(loss: torch.Tensor) -> bool:
    return getattr(loss, PIPELINE_LOSS, False) is True


class PipelineSteps:
    """The pipeline methods of the `Accelerator` (see the module docstring)."""

    strategy: Strategy
    stepper: Stepper

    def pipeline_step(self, model: nn.Module, *args: Any, target: Any, loss_fn: Callable[..., torch.Tensor]) -> torch.Tensor:
        """Forward and backward of the batch `args` through every pipeline stage of the prepared `model`, in
        microbatches; returns the batch's loss on every process (``accelerator.backward`` of it does nothing)."""
        pipeline = self._pipeline_of(model, "pipeline_step")
        loss = pipeline.step(*args, target=target, loss_fn=loss_fn, accumulation_steps=self.stepper.accumulation_steps)
        setattr(loss, PIPELINE_LOSS, True)
        return loss

    def pipeline_eval(self, model: nn.Module, *args: Any, target: Any, loss_fn: Callable[..., torch.Tensor]) -> torch.Tensor:
        """The loss of the batch `args` against `target` through every stage, forward only, on every process."""
        return self._pipeline_of(model, "pipeline_eval").eval(*args, target=target, loss_fn=loss_fn)

    def pipeline_forward(self, model: nn.Module, *args: Any) -> Any:
        """The last stage's outputs for the batch `args`, forward only, on every process."""
        return self._pipeline_of(model, "pipeline_forward").forward(*args)

    def prepare_pippy(self, model: nn.Module, *args: Any, **kwargs: Any) -> nn.Module:
        """Accelerate's traced inference pipeline is not built: refused with the way that is."""
        raise NotImplementedError(
            "prepare_pippy (Accelerate's traced GPipe inference) is not available; split the model by layer name instead: "
            "Accelerator(parallelism_config=ParallelismConfig(pp_size=N, pp_handler=PipelineConfig(schedule='GPipe'))), "
            "model = accelerator.prepare(model), then accelerator.pipeline_forward(model, x)"
        )

    def _pipeline_of(self, model: nn.Module, method: str) -> Pipeline:
        pipeline = self.strategy.pipeline
        if pipeline is None or not pipeline.stages:
            raise RuntimeError(
                f"accelerator.{method}(model, ...) runs the model's pipeline stages, and there are none: pass "
                "Accelerator(parallelism_config=ParallelismConfig(pp_size=2, ...)) and prepare the model first"
            )
        if model is not pipeline.model:
            raise ValueError(
                f"accelerator.{method}: this {type(model).__name__} is not the model prepare() split into pipeline stages; pass "
                "the model prepare() returned"
            )
        return pipeline
