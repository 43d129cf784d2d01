"""What an `Accelerator`'s arguments build: its strategy and its gradient-accumulation settings.

A strategy comes from an instance, a name (``"auto"`` resolved by `strategies.resolve_auto`), a `DeepSpeedPlugin`
or a `FullyShardedDataParallelPlugin` (also from `trainer launch`'s accelerate config, through the environment),
with `DDPKwargs` applied when it runs DDP and `InitProcessGroupKwargs`' backend given to every process-group strategy.
"""

from __future__ import annotations

import json
import warnings
from typing import Any

from strategies import REGISTRY, Strategy, resolve_auto, resolve_strategy
from strategies.deepspeed import DeepSpeedStrategy
from strategies.environment import detect_environment, env_setting
from strategies.fsdp import FSDPStrategy
from strategies.xla import xla_device_present
from trainer.accelerator.config import DeepSpeedPlugin, FullyShardedDataParallelPlugin, GradientAccumulationPlugin
from trainer.accelerator.kwargs import DDPKwargs, KwargsHandlers
from trainer.accelerator.parallelism import ParallelismConfig


def build_strategy(
    strategy: str | Strategy | None, *, precision: str, cpu: bool, timeout: float | None, handlers: KwargsHandlers | None = None,
    deepspeed_plugin: DeepSpeedPlugin | None, fsdp_plugin: FullyShardedDataParallelPlugin | None,
    parallelism: ParallelismConfig | None = None,
) -> Strategy:
    """The strategy an Accelerator runs; a plugin and a strategy name that contradict each other are refused, and so are
    kwargs handlers that cannot reach it (`InitProcessGroupKwargs`/`DDPKwargs` for a strategy instance, `DDPKwargs`
    for a strategy that is not DDP)."""
    handlers = handlers or KwargsHandlers()
    ddp = handlers.ddp_handler
    backend = handlers.backend()
    if isinstance(strategy, Strategy):
        given = [type(h).__name__ for h in (handlers.init_handler, ddp) if h is not None and h.to_kwargs() | getattr(h, "extra", {})]
        if given or (ddp is not None and ddp.comm_hook_settings()):
            raise ValueError(
                f"kwargs_handlers {given or ['DistributedDataParallelKwargs']} cannot reach the {type(strategy).__name__} passed as "
                "strategy (built already); pass their settings to the strategy's constructor (timeout=, backend=, DDP options), "
                "or pass strategy by name"
            )
        return strategy
    named = _registry_name(strategy)
    if parallelism is not None:
        cluster = detect_environment()
        parallelism.resolved(cluster.world_size)
        if parallelism.shards:  # FSDP2 on the N-D mesh (HSDP, tensor parallel)
            if parallelism.pp_size != 1 and (deepspeed_plugin is not None or named == "deepspeed"):
                raise ValueError(
                    f"ParallelismConfig(pp_size={parallelism.pp_size}) cannot run with DeepSpeed: DeepSpeed's own pipeline engine "
                    "takes ZeRO stage 1 only, and its ZeRO-2/3 do not shard pipeline stages. Leave the DeepSpeed plugin out: "
                    "pipeline stages run with FSDP2 on the data-parallel sizes (dp_shard_size)"
                )
            if deepspeed_plugin is not None or (strategy is not None and named != "fsdp"):
                raise ValueError(
                    f"parallelism_config with dp_shard_size, tp_size or pp_size > 1 runs FSDP2 on its mesh; it cannot run with "
                    f"strategy={strategy!r}{' and a deepspeed_plugin' if deepspeed_plugin is not None else ''}. Leave strategy out "
                    "(or pass strategy='fsdp' / an fsdp_plugin for FSDP's other settings)"
                )
            settings = fsdp_plugin.strategy_kwargs() if fsdp_plugin is not None else {}
            return FSDPStrategy(cluster=cluster, cpu=cpu, precision=precision, timeout=timeout, backend=backend,
                                parallel_dims=parallelism.parallel_dims(cluster.world_size), tp_plan=parallelism.tp_plan,
                                pipeline=parallelism.pp_handler, **settings)
        if strategy is None and deepspeed_plugin is None and fsdp_plugin is None and cluster.world_size > 1:
            strategy, named = "ddp", "ddp"  # dp_replicate_size alone: data parallel replicas
    if deepspeed_plugin is None and named == "deepspeed" and env_setting("DEEPSPEED_PLUGIN"):
        deepspeed_plugin = DeepSpeedPlugin(**json.loads(str(env_setting("DEEPSPEED_PLUGIN"))))  # from `trainer launch`'s config
    if deepspeed_plugin is not None:
        if strategy is not None and named != "deepspeed":
            raise ValueError(f"deepspeed_plugin was passed with strategy={strategy!r}; pass one of them (the plugin means strategy='deepspeed')")
        strategy = DeepSpeedStrategy(cluster=detect_environment(), cpu=cpu, precision=precision, timeout=timeout, backend=backend,
                                     **deepspeed_plugin.strategy_kwargs())
    if fsdp_plugin is None and named == "fsdp" and env_setting("FSDP_PLUGIN"):
        fsdp_plugin = FullyShardedDataParallelPlugin(**json.loads(str(env_setting("FSDP_PLUGIN"))))  # `trainer launch`'s config
    if fsdp_plugin is not None:
        if deepspeed_plugin is not None or (strategy is not None and named != "fsdp"):
            raise ValueError(f"fsdp_plugin was passed with strategy={strategy!r}; pass one of them (the plugin means strategy='fsdp')")
        strategy = FSDPStrategy(cluster=detect_environment(), cpu=cpu, precision=precision, timeout=timeout, backend=backend,
                                **fsdp_plugin.strategy_kwargs())
    if isinstance(strategy, Strategy):
        _refuse_ddp_settings(ddp, strategy.name)
        return strategy
    return strategy_from_name(strategy, cpu=cpu, precision=precision, timeout=timeout, ddp=ddp, backend=backend)


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


def strategy_from_name(
    strategy: str | Strategy | None, *, cpu: bool, precision: str, timeout: float | None, ddp: DDPKwargs | None, backend: str | None = None,
) -> Strategy:
    """A strategy by name (``TRAINWRIGHT_STRATEGY`` without one), DDP's settings from `DDPKwargs` when it runs DDP
    (every field, and the communication hook); `backend` for the strategies that create a process group."""
    if isinstance(strategy, Strategy):
        return strategy
    name = strategy or env_setting("STRATEGY", "auto")
    cluster = detect_environment()
    kwargs: dict[str, Any] = {"cluster": cluster, "cpu": cpu, "precision": precision, "timeout": timeout}
    resolved = resolve_auto(_registry_name(name) or str(name), distributed=cluster.is_distributed, xla=not cpu and xla_device_present())
    if backend is not None:
        if resolved not in ("ddp", "fsdp", "deepspeed"):
            raise ValueError(f"InitProcessGroupKwargs(backend={backend!r}) needs a multi-process strategy, but this run uses {resolved!r}; "
                             "drop backend, or launch several processes")
        kwargs["backend"] = backend
    if resolved == "ddp" and ddp is not None:
        options = ddp.ddp_kwargs()
        kwargs.update(find_unused_parameters=options.pop("find_unused_parameters"), static_graph=options.pop("static_graph"),
                      bucket_cap_mb=options.pop("bucket_cap_mb"), gradient_as_bucket_view=options.pop("gradient_as_bucket_view"),
                      ddp_options=options, **{f"comm_{k}": v for k, v in ddp.comm_hook_settings().items()})
    elif ddp is not None:
        _refuse_ddp_settings(ddp, resolved)
    return resolve_strategy(name, **kwargs)


def _refuse_ddp_settings(ddp: DDPKwargs | None, strategy: str) -> None:
    """`DDPKwargs` for a run without DDP: with one process they have nothing to act on (a warning, as they are set);
    with a sharded strategy they would be dropped, which is an error."""
    if ddp is None or ddp.is_default():
        return
    if strategy in ("single", "xla"):
        warnings.warn(f"DistributedDataParallelKwargs {ddp.to_kwargs() | ddp.comm_hook_settings()} have no effect: this run "
                      f"(strategy={strategy!r}) has no DistributedDataParallel model; they apply when it runs on several processes",
                      stacklevel=4)
        return
    raise ValueError(
        f"DistributedDataParallelKwargs {ddp.to_kwargs() | ddp.comm_hook_settings()} configure DistributedDataParallel, but this run "
        f"uses strategy={strategy!r}, which does not wrap the model in it; drop the handler, or use strategy='ddp'"
    )


def _registry_name(strategy: str | Strategy | None) -> str | None:
    """The registry's name for a strategy name (an alias such as ``"fsdp2"`` gives ``"fsdp"``); None for an instance or
    an unknown name (`resolve_strategy` refuses that one)."""
    name = strategy if strategy is not None else env_setting("STRATEGY", "auto")
    entry = REGISTRY.get(str(name).lower()) if isinstance(name, str) else None
    return entry.name if entry is not None else None
