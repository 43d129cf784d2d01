"""``lightning.pytorch.profilers`` under the rename: the profilers of ``Trainer(profiler=...)``."""

from __future__ import annotations

from trainer.fit.profiler import AdvancedProfiler, PassThroughProfiler, Profiler, SimpleProfiler
from trainer.fit.torch_profiler import PyTorchProfiler
from trainer.lightning_api import not_offered

XLAProfiler = not_offered("XLAProfiler", "lightning.pytorch.profilers", "TPU profiling is not offered; PyTorchProfiler profiles "
                          "CPU and CUDA", module=__name__)

__all__ = ["AdvancedProfiler", "PassThroughProfiler", "Profiler", "PyTorchProfiler", "SimpleProfiler", "XLAProfiler"]
