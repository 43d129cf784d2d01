"""Read an Accelerate ``default_config.yaml`` (as written by ``accelerate config``) into `LaunchSettings`.

Accelerate's ``num_processes`` is the total over all machines, as ours is. Keys that only matter to
hardware or services we do not drive (TPU, SageMaker, IPEX, ...) are accepted when they hold their
"off" value and rejected with a clear message otherwise; unknown keys are rejected.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from trainer.cli.settings import LaunchSettings

# distributed_type -> (strategy, cpu)
_DISTRIBUTED_TYPES = {
    "NO": ("auto", None),
    "MULTI_CPU": ("ddp", True),
    "MULTI_GPU": ("ddp", None),
    "MULTI_NPU": ("ddp", None),
    "MULTI_XPU": ("ddp", None),
    "MULTI_MLU": ("ddp", None),
    "MULTI_MUSA": ("ddp", None),
    "MULTI_HPU": ("ddp", None),
    "FSDP": ("fsdp", None),
    "DEEPSPEED": ("deepspeed", None),
}
# keys copied as they are
_DIRECT = ("num_processes", "num_machines", "machine_rank", "main_process_ip", "main_process_port", "rdzv_backend")
# keys accepted and not used: they describe the machine, not the job, or are Accelerate's own switches
_IGNORED = frozenset(
    {
        "compute_environment",
        "same_network",
        "main_training_function",
        "debug",
        "enable_cpu_affinity",
        "tpu_env",
        "tpu_use_cluster",
        "tpu_use_sudo",
        "tpu_name",
        "tpu_zone",
        "commands",
        "command_file",
        "ipex_config",
        "mpirun_config",
        "fsdp_config",
        "megatron_lm_config",
        "fp8_config",
        "parallelism_config",
        "use_ipex",
        "use_mps_device",
    }
)
_ACCELERATE_ONLY = frozenset({"distributed_type", "use_cpu", "downcast_bf16", "deepspeed_config", "dynamo_config"}) | _IGNORED


def is_accelerate_config(data: Mapping[str, Any]) -> bool:
    """Whether ``data`` looks like an Accelerate config (it has a key only Accelerate writes)."""
    return any(key in _ACCELERATE_ONLY for key in data)


def settings_from_accelerate(data: Mapping[str, Any], *, source: str = "<config>") -> LaunchSettings:
    """Map an Accelerate config mapping to `LaunchSettings`.

    Raises:
        ValueError: an unknown key, or a setting we cannot honour (SageMaker, TPU, fp8, ...).
    """
    known = set(_DIRECT) | _ACCELERATE_ONLY | {"mixed_precision", "gpu_ids", "gradient_accumulation_steps"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(
            f"Accelerate config {source!r} has key(s) {unknown} that Trainwright does not know; remove them "
            f"(known Accelerate keys: {sorted(known)})"
        )
    environment = data.get("compute_environment", "LOCAL_MACHINE")
    if environment != "LOCAL_MACHINE":
        raise ValueError(
            f"compute_environment={environment!r} in {source!r} is not supported; only LOCAL_MACHINE is "
            "(start the job on each machine with `trainer launch`)"
        )
    kind = str(data.get("distributed_type", "NO")).upper()
    if kind not in _DISTRIBUTED_TYPES:
        raise ValueError(
            f"distributed_type={kind!r} in {source!r} is not supported; use one of {sorted(_DISTRIBUTED_TYPES)}"
        )
    strategy, cpu = _DISTRIBUTED_TYPES[kind]
    values: dict[str, Any] = {key: data[key] for key in _DIRECT if data.get(key) is not None}
    values["strategy"] = strategy
    values["cpu"] = bool(data.get("use_cpu", False)) or bool(cpu)
    if data.get("gradient_accumulation_steps") is not None:
        values["gradient_accumulation_steps"] = data["gradient_accumulation_steps"]
    mixed = str(data.get("mixed_precision", "no")).lower()
    if mixed == "fp8":
        raise ValueError(f"mixed_precision='fp8' in {source!r} is not supported; use 'no', 'fp16' or 'bf16'")
    values["mixed_precision"] = mixed
    gpu_ids = data.get("gpu_ids")
    if gpu_ids not in (None, "", "all"):
        values["gpu_ids"] = str(gpu_ids)
    if str(data.get("downcast_bf16", "no")).lower() not in ("no", "false"):
        warnings.warn(f"downcast_bf16 in {source!r} is a TPU setting and has no effect here", stacklevel=2)
    if kind == "FSDP" and data.get("fsdp_config"):
        values["fsdp_plugin"] = _fsdp_section(data["fsdp_config"], source)
    if data.get("dynamo_config"):
        values["dynamo_plugin"] = _dynamo_section(data["dynamo_config"], source)
    if kind == "DEEPSPEED" and data.get("deepspeed_config"):
        values["deepspeed_plugin"] = _deepspeed_section(data["deepspeed_config"], source)
    return LaunchSettings(**values)


# fsdp_config keys of `accelerate config` -> FullyShardedDataParallelPlugin fields (the rest: the key without "fsdp_")
_FSDP_KEYS = {"fsdp_transformer_layer_cls_to_wrap": "transformer_cls_names_to_wrap", "fsdp_offload_params": "cpu_offload",
              "fsdp_version": "fsdp_version"}


def _fsdp_section(section: Mapping[str, Any], source: str) -> dict[str, Any]:
    """Accelerate's ``fsdp_config`` section as `FullyShardedDataParallelPlugin` arguments (each checked by the plugin)."""
    from dataclasses import fields

    from trainer.accelerator.config import FullyShardedDataParallelPlugin  # lazy: the CLI imports no torch (trainer.accelerator does)

    known = {f.name for f in fields(FullyShardedDataParallelPlugin)}
    plugin: dict[str, Any] = {}
    for key, value in section.items():
        name = _FSDP_KEYS.get(key, key.removeprefix("fsdp_"))
        if name not in known:
            spelled = sorted({f"fsdp_{k}" for k in known - set(_FSDP_KEYS.values())} | set(_FSDP_KEYS))
            raise ValueError(f"fsdp_config key {key!r} in {source!r} is not known; known: {spelled}")
        plugin[name] = value
    try:
        FullyShardedDataParallelPlugin(**plugin).strategy_kwargs()
    except (TypeError, ValueError) as err:
        raise ValueError(f"fsdp_config in {source!r}: {err}") from None
    return plugin


_DYNAMO_KEYS = {"dynamo_backend": "backend", "dynamo_mode": "mode", "dynamo_use_fullgraph": "fullgraph", "dynamo_use_dynamic": "dynamic",
                "dynamo_use_regional_compilation": "use_regional_compilation"}


def _dynamo_section(section: Mapping[str, Any], source: str) -> dict[str, Any]:
    """Accelerate's ``dynamo_config`` section as `TorchDynamoPlugin` arguments (each checked by the plugin)."""
    from trainer.accelerator.config import TorchDynamoPlugin  # lazy: the CLI imports no torch (trainer.accelerator does)

    unknown = sorted(set(section) - set(_DYNAMO_KEYS))
    if unknown:
        raise ValueError(f"dynamo_config key(s) {unknown} in {source!r} are not known; known: {sorted(_DYNAMO_KEYS)}")
    plugin = {_DYNAMO_KEYS[key]: value for key, value in section.items()}
    try:
        TorchDynamoPlugin(**plugin)
    except (TypeError, ValueError) as err:
        raise ValueError(f"dynamo_config in {source!r}: {err}") from None
    return plugin


# deepspeed_config keys of `accelerate config` that choose DeepSpeed's own multi-node launcher: we launch with torchrun
_DEEPSPEED_LAUNCHER_KEYS = {"deepspeed_multinode_launcher", "deepspeed_hostfile", "deepspeed_exclusion_filter",
                            "deepspeed_inclusion_filter"}


def _deepspeed_section(section: Mapping[str, Any], source: str) -> dict[str, Any]:
    """Accelerate's ``deepspeed_config`` section as `DeepSpeedPlugin` arguments."""
    plugin = {k: v for k, v in section.items() if k not in _DEEPSPEED_LAUNCHER_KEYS}
    if section.get("deepspeed_multinode_launcher", "standard") not in ("standard", None):
        warnings.warn(
            f"deepspeed_multinode_launcher={section['deepspeed_multinode_launcher']!r} in {source!r} is not used: "
            "`trainer launch` starts the processes with torchrun on every machine",
            stacklevel=3,
        )
    if "deepspeed_config_file" in plugin:
        plugin["hf_ds_config"] = plugin.pop("deepspeed_config_file")
    for key in ("offload_optimizer_device", "offload_param_device"):
        if plugin.get(key) is None:
            plugin.pop(key, None)
    return plugin
