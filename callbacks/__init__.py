"""Callbacks for the `Trainer`: the `Callback` base, the built-ins, and trackers (`callbacks.trackers`).

Built-ins are imported on first use so that importing this package stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

from callbacks.base import Callback

_EXPORTS = {
    "ModelCheckpoint": "callbacks.checkpoint",
    "EarlyStopping": "callbacks.early_stopping",
    "ProgressBar": "callbacks.progress",
    "TQDMProgressBar": "callbacks.progress",
    "LearningRateMonitor": "callbacks.lr_monitor",
    "ModelSummary": "callbacks.summary",
    "Timer": "callbacks.timer",
    "ThroughputMonitor": "callbacks.throughput",
    "OnExceptionCheckpoint": "callbacks.on_exception",
    "LambdaCallback": "callbacks.lambda_function",
    "WeightAveraging": "callbacks.weight_averaging",
    "EMAWeightAveraging": "callbacks.weight_averaging",
    "StochasticWeightAveraging": "callbacks.stochastic_weight_avg",
    "BaseFinetuning": "callbacks.finetuning",
    "BackboneFinetuning": "callbacks.finetuning",
    "BasePredictionWriter": "callbacks.prediction_writer",
    "DeviceStatsMonitor": "callbacks.device_stats_monitor",
    "RichProgressBar": "callbacks.rich_progress",
    "GradientAccumulationScheduler": "callbacks.gradient_accumulation_scheduler",
    "LearningRateFinder": "callbacks.lr_finder",
    "BatchSizeFinder": "callbacks.batch_size_finder",
    "RayTrainReportCallback": "callbacks.ray_train",
}

__all__ = ["Callback", *sorted(_EXPORTS)]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'callbacks' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
