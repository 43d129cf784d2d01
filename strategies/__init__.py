"""Strategies: everything distributed for both faces (device, processes, precision, collectives, data)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from strategies.base import Strategy
from strategies.ddp import DDPStrategy
from strategies.deepspeed import DeepSpeedStrategy
from strategies.environment import ClusterEnvironment, detect_environment
from strategies.fsdp import FSDPStrategy, apply_fsdp
from strategies.precision import PRECISION_NAMES, normalize_precision
from strategies.single_device import SingleDeviceStrategy
from strategies.xla import XLAStrategy, xla_device_present


def _auto(**kwargs: Any) -> Strategy:
    """An XLA device when one is announced (and torch_xla installed), else DDP under a multi-process launch, else one device."""
    if not kwargs.get("cpu") and xla_device_present():
        return XLAStrategy(**{**kwargs, "cluster": None})
    cluster = kwargs.get("cluster") or detect_environment()
    kwargs["cluster"] = cluster
    return DDPStrategy(**kwargs) if cluster.is_distributed else SingleDeviceStrategy(**kwargs)


def _not_available(name: str, why: str) -> Callable[..., Strategy]:
    def build(**kwargs: Any) -> Strategy:
        raise NotImplementedError(f"strategy={name!r} is not available in this release: {why}; use strategy='fsdp', 'ddp' or 'single'")

    return build


def _deepspeed(stage: int, offload: bool = False) -> Callable[..., Strategy]:
    """Lightning's preset names: ``"deepspeed_stage_2"``, ``"deepspeed_stage_3_offload"``, ..."""

    def build(**kwargs: Any) -> Strategy:
        if offload:
            kwargs.setdefault("offload_optimizer", True)
            kwargs.setdefault("offload_parameters", stage == 3)
        return DeepSpeedStrategy(zero_stage=stage, **kwargs)

    return build


STRATEGIES: dict[str, Callable[..., Strategy]] = {
    "auto": _auto,
    "single": SingleDeviceStrategy,
    "single_device": SingleDeviceStrategy,
    "ddp": DDPStrategy,
    "fsdp": FSDPStrategy,
    "fsdp2": FSDPStrategy,
    "fsdp1": _not_available("fsdp1", "FSDP1 (FullyShardedDataParallel) is not supported; strategy='fsdp' shards with FSDP2 (fully_shard)"),
    "deepspeed": DeepSpeedStrategy,
    "deepspeed_stage_1": _deepspeed(1),
    "deepspeed_stage_2": _deepspeed(2),
    "deepspeed_stage_2_offload": _deepspeed(2, offload=True),
    "deepspeed_stage_3": _deepspeed(3),
    "deepspeed_stage_3_offload": _deepspeed(3, offload=True),
    "xla": XLAStrategy,
    "tpu": XLAStrategy,
}


def resolve_strategy(strategy: str | Strategy | None = "auto", **kwargs: Any) -> Strategy:
    """Turn a strategy name (or instance) into a `Strategy`.

    Keyword arguments (``cpu``, ``precision``, ``timeout``, ``cluster``) go to the strategy's constructor.
    """
    if isinstance(strategy, Strategy):
        return strategy
    name = "auto" if strategy is None else str(strategy).lower()
    if name not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r} is not known; choose one of {', '.join(sorted(STRATEGIES))}")
    return STRATEGIES[name](**kwargs)


__all__ = [
    "PRECISION_NAMES",
    "STRATEGIES",
    "ClusterEnvironment",
    "DDPStrategy",
    "DeepSpeedStrategy",
    "FSDPStrategy",
    "SingleDeviceStrategy",
    "Strategy",
    "XLAStrategy",
    "apply_fsdp",
    "detect_environment",
    "normalize_precision",
    "resolve_strategy",
]
