"""Local SGD (Accelerate's ``accelerate.local_sgd``): each process takes optimizer steps on its own, and every
``local_sgd_steps`` steps the processes average their parameters.

    with LocalSGD(accelerator=accelerator, model=model, local_sgd_steps=8, enabled=True) as local_sgd:
        for batch in loader:
            with accelerator.accumulate(model):
                accelerator.backward(model(batch).loss)
                optimizer.step()
                optimizer.zero_grad()
                local_sgd.step()

Inside the block DDP does not reduce gradients (``no_sync``); `step` counts optimizer steps and averages the
parameters (a mean all-reduce) every ``local_sgd_steps``, and leaving the block averages them once more. With one
process, or ``enabled=False``, it does nothing. Data parallel only (DDP or several CPU processes); sharded
strategies (FSDP, DeepSpeed) are refused, as in Accelerate.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any

import torch
from torch import nn

from trainer.accelerator.accelerator import Accelerator
from trainer.accelerator.config import DistributedType

_DATA_PARALLEL = (DistributedType.NO, DistributedType.MULTI_CPU, DistributedType.MULTI_GPU, DistributedType.MULTI_XPU)


class LocalSGD:
    """Run `local_sgd_steps` optimizer steps per process between parameter averages (see the module docstring).

    Args:
        accelerator: the `Accelerator` that prepared `model`.
        model: the prepared model whose parameters are averaged.
        local_sgd_steps: optimizer steps between two averages (an int >= 1).
        enabled: ``False`` turns Local SGD off (plain data parallel training).
    """

    def __init__(self, accelerator: Accelerator, model: nn.Module, local_sgd_steps: int, enabled: bool = True) -> None:
        if accelerator.distributed_type not in _DATA_PARALLEL:
            raise NotImplementedError(
                f"LocalSGD is supported only for data parallel runs (several CPU or GPU processes, DDP), not "
                f"{accelerator.distributed_type.value}: sharded strategies (FSDP, DeepSpeed) hold no full copy to average"
            )
        if isinstance(local_sgd_steps, bool) or not isinstance(local_sgd_steps, int) or local_sgd_steps < 1:
            raise ValueError(f"local_sgd_steps={local_sgd_steps!r} must be an int >= 1")
        self.enabled = bool(enabled) and accelerator.distributed_type != DistributedType.NO
        self.num_steps = 0
        self.accelerator = accelerator
        self.model = model
        self.local_sgd_steps = local_sgd_steps
        self.model_sync_obj: AbstractContextManager[Any] | None = None

    def __enter__(self) -> LocalSGD:
        if self.enabled:
            self.model_sync_obj = self.accelerator.no_sync(self.model)
            self.model_sync_obj.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        if self.enabled and self.model_sync_obj is not None:
            self._sync_and_avg_model_params()  # average all models on exit
            self.model_sync_obj.__exit__(kind, value, tb)
            self.model_sync_obj = None

    def step(self) -> None:
        """Count an optimizer step; every `local_sgd_steps` of them, average the parameters across processes."""
        self.num_steps += 1
        if self.enabled and self.num_steps % self.local_sgd_steps == 0:
            self._sync_and_avg_model_params()

    def _sync_and_avg_model_params(self) -> None:
        """Replace every parameter by its mean over the processes (Accelerate's: under autocast, ``reduce(mean)``)."""
        self.accelerator.wait_for_everyone()
        with self.accelerator.autocast(), torch.no_grad():
            for param in self.model.parameters():
                param.data = self.accelerator.reduce(param.data, reduction="mean")


__all__ = ["LocalSGD"]
