"""``accelerate.parallelism_config`` under the rename: `ParallelismConfig` (trainer/accelerator/parallelism.py)."""

from __future__ import annotations

from trainer.accelerator.parallelism import ParallelismConfig, TorchTensorParallelConfig

__all__ = ["ParallelismConfig", "TorchTensorParallelConfig"]
