"""What an `Accelerator`'s arguments build: its strategy and its gradient-accumulation settings.

A strategy comes from an instance, a name (``"auto"`` resolved by `strategies.resolve_auto`), a `DeepSpeedPlugin`
or a `FullyShardedDataParallelPlugin` (also from `trainer launch`'s accelerate config, through the environment),
with `DDPKwargs` applied when it runs DDP.
"""

from __future__ import annotations

import json
from typing import Any

from strategies import REGISTRY, Strategy, resolve_auto, resolve_strategy
from strategies.deepspeed import DeepSpeedStrategy
from strategies.environment import detect_environment, env_setting
from strategies.fsdp import FSDPStrategy
from strategies.xla import xla_device_present
from trainer.accelerator.config import DDPKwargs, DeepSpeedPlugin, FullyShardedDataParallelPlugin, GradientAccumulationPlugin


def build_strategy(
    strategy: str | Strategy | None, *, precision: str, cpu: bool, timeout: float | None, kwargs_handlers: list[Any] | None,
    deepspeed_plugin: DeepSpeedPlugin | None, fsdp_plugin: FullyShardedDataParallelPlugin | None,
) -> Strategy:
    """The strategy an Accelerator runs; a plugin and a strategy name that contradict each other are refused."""
    named = _registry_name(strategy)
    if deepspeed_plugin is None and named == "deepspeed" and env_setting("DEEPSPEED_PLUGIN"):
        deepspeed_plugin = DeepSpeedPlugin(**json.loads(str(env_setting("DEEPSPEED_PLUGIN"))))  # from `trainer launch`'s config
    if deepspeed_plugin is not None:
        if strategy is not None and named != "deepspeed":
            raise ValueError(f"deepspeed_plugin was passed with strategy={strategy!r}; pass one of them (the plugin means strategy='deepspeed')")
        strategy = DeepSpeedStrategy(cluster=detect_environment(), cpu=cpu, precision=precision, timeout=timeout,
                                     **deepspeed_plugin.strategy_kwargs())
    if fsdp_plugin is None and named == "fsdp" and env_setting("FSDP_PLUGIN"):
        fsdp_plugin = FullyShardedDataParallelPlugin(**json.loads(str(env_setting("FSDP_PLUGIN"))))  # `trainer launch`'s config
    if fsdp_plugin is not None:
        if deepspeed_plugin is not None or (strategy is not None and named != "fsdp"):
            raise ValueError(f"fsdp_plugin was passed with strategy={strategy!r}; pass one of them (the plugin means strategy='fsdp')")
        strategy = FSDPStrategy(cluster=detect_environment(), cpu=cpu, precision=precision, timeout=timeout,
                                **fsdp_plugin.strategy_kwargs())
    ddp = next((h for h in kwargs_handlers or [] if isinstance(h, DDPKwargs)), None)
    return strategy_from_name(strategy, cpu=cpu, precision=precision, timeout=timeout, ddp=ddp)


def accumulation_plugin(steps: int | None, plugin: GradientAccumulationPlugin | None) -> GradientAccumulationPlugin:
    """The accumulation settings from ``gradient_accumulation_steps`` or a plugin (not both), else the launcher's variable."""
    if plugin is not None and steps not in (None, 1):
        raise ValueError("pass either gradient_accumulation_steps or gradient_accumulation_plugin, not both")
    if plugin is not None:
        return plugin
    if steps is None:
        raw = env_setting("GRADIENT_ACCUMULATION_STEPS", "1")
        try:
            steps = int(raw)  # type: ignore[arg-type]
        except ValueError:
            raise ValueError(f"TRAINWRIGHT_GRADIENT_ACCUMULATION_STEPS={raw!r} is not an int; set it to e.g. 4") from None
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"gradient_accumulation_steps={steps!r} must be an int >= 1")
    return GradientAccumulationPlugin(num_steps=steps)


def strategy_from_name(strategy: str | Strategy | None, *, cpu: bool, precision: str, timeout: float | None, ddp: DDPKwargs | None) -> Strategy:
    """A strategy by name (``TRAINWRIGHT_STRATEGY`` without one), DDP's settings from `DDPKwargs` when it runs DDP."""
    if isinstance(strategy, Strategy):
        return strategy
    name = strategy or env_setting("STRATEGY", "auto")
    cluster = detect_environment()
    kwargs: dict[str, Any] = {"cluster": cluster, "cpu": cpu, "precision": precision, "timeout": timeout}
    resolved = resolve_auto(_registry_name(name) or str(name), distributed=cluster.is_distributed, xla=not cpu and xla_device_present())
    if ddp is not None and resolved == "ddp":
        kwargs.update(find_unused_parameters=ddp.find_unused_parameters, static_graph=ddp.static_graph,
                      bucket_cap_mb=ddp.bucket_cap_mb, gradient_as_bucket_view=ddp.gradient_as_bucket_view)
    return resolve_strategy(name, **kwargs)


def _registry_name(strategy: Any) -> str | None:
    """The registry's name for a strategy name (an alias such as ``"fsdp2"`` gives ``"fsdp"``); None for an instance or
    an unknown name (`resolve_strategy` refuses that one)."""
    name = strategy if strategy is not None else env_setting("STRATEGY", "auto")
    entry = REGISTRY.get(str(name).lower()) if isinstance(name, str) else None
    return entry.name if entry is not None else None
