"""Strategies: everything distributed for both faces (device, processes, precision, collectives, data)."""

from __future__ import annotations

from strategies.base import Strategy
from strategies.ddp import DDPStrategy
from strategies.deepspeed import DeepSpeedStrategy
from strategies.environment import ClusterEnvironment, detect_environment
from strategies.fault_tolerance import FaultTolerance
from strategies.fsdp import FSDPStrategy, apply_fsdp
from strategies.mesh import ParallelDims
from strategies.model_parallel import ModelParallelStrategy
from strategies.pipeline import PipelineConfig, PipelineStageError
from strategies.precision import PRECISION_NAMES, normalize_precision
from strategies.registry import REGISTRY, STRATEGIES, StrategyEntry, register_strategy, resolve_auto, resolve_strategy
from strategies.single_device import SingleDeviceStrategy
from strategies.xla import XLAStrategy

__all__ = [
    "PRECISION_NAMES",
    "REGISTRY",
    "STRATEGIES",
    "ClusterEnvironment",
    "DDPStrategy",
    "DeepSpeedStrategy",
    "FSDPStrategy",
    "FaultTolerance",
    "ModelParallelStrategy",
    "ParallelDims",
    "PipelineConfig",
    "PipelineStageError",
    "SingleDeviceStrategy",
    "Strategy",
    "StrategyEntry",
    "XLAStrategy",
    "apply_fsdp",
    "detect_environment",
    "normalize_precision",
    "register_strategy",
    "resolve_auto",
    "resolve_strategy",
]
