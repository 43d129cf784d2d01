"""Small configuration records of the `Accelerator` face (the names Accelerate users know)."""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass, field
from typing import Any

from trainer.accelerator.kwargs import DistributedDataParallelKwargs


class DistributedType(str, enum.Enum):
    """What kind of distributed run this is."""

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    MULTI_XPU = "MULTI_XPU"
    FSDP = "FSDP"
    DEEPSPEED = "DEEPSPEED"
    XLA = "XLA"
    TPU = "XLA"  # noqa: PIE796  (Accelerate's old name: an alias, so `distributed_type == DistributedType.TPU` still works)
    # Accelerate's other kinds, for scripts that compare against them; never reported here (no such backend is supported)
    MULTI_NPU = "MULTI_NPU"
    MULTI_MLU = "MULTI_MLU"
    MULTI_SDAA = "MULTI_SDAA"
    MULTI_MUSA = "MULTI_MUSA"
    MULTI_HPU = "MULTI_HPU"
    MULTI_NEURON = "MULTI_NEURON"
    MEGATRON_LM = "MEGATRON_LM"


@dataclass
class ProjectConfiguration:
    """Where a project writes checkpoints and logs, and how checkpoints are named.

    With ``automatic_checkpoint_naming=True``, `Accelerator.save_state()` writes
    ``{project_dir}/checkpoints/checkpoint_{iteration}`` and keeps at most ``total_limit`` of them.
    """

    project_dir: str | None = None
    logging_dir: str | None = None
    automatic_checkpoint_naming: bool = False
    total_limit: int | None = None
    iteration: int = 0
    save_on_each_node: bool = False

    def __post_init__(self) -> None:
        if self.logging_dir is None:
            self.logging_dir = self.project_dir
        if self.total_limit is not None and (not isinstance(self.total_limit, int) or self.total_limit < 1):
            raise ValueError(f"total_limit={self.total_limit!r} must be a positive int (or None to keep every checkpoint)")
        if self.automatic_checkpoint_naming and self.project_dir is None:
            raise ValueError("automatic_checkpoint_naming=True needs a project_dir; pass ProjectConfiguration(project_dir='...')")

    def set_directories(self, project_dir: str | os.PathLike | None = None) -> None:
        self.project_dir = None if project_dir is None else os.fspath(project_dir)
        if self.logging_dir is None:
            self.logging_dir = self.project_dir


@dataclass
class DataLoaderConfiguration:
    """How `prepare` shards data loaders.

    ``use_stateful_dataloader`` is accepted for Accelerate scripts: every prepared loader here is stateful
    (``state_dict()``/``load_state_dict()`` resume at the next batch, and `save_state` records the position),
    with or without torchdata, so the flag changes nothing. The loader is ours, not a torchdata
    ``StatefulDataLoader``.

    ``dispatch_batches`` (default: on for iterable data sets whose batches go to the device) gives an iterable data
    set the order of Accelerate's ``DataLoaderDispatcher``; every process reads the stream and keeps its part, nothing
    is broadcast. For a map-style data set ``dispatch_batches=True`` is refused when the loader is prepared.

    ``use_seedable_sampler`` (off, as in Accelerate) shuffles by ``data_seed + epoch`` instead of drawing from the
    sampler's generator or torch's global RNG at every pass; ``data_seed`` has no effect without it (docs/data.md).
    """

    split_batches: bool = False
    even_batches: bool = True
    dispatch_batches: bool | None = None
    use_seedable_sampler: bool = False
    non_blocking: bool = False
    data_seed: int | None = None
    use_stateful_dataloader: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.use_stateful_dataloader, bool):
            raise TypeError(f"use_stateful_dataloader={self.use_stateful_dataloader!r} must be True or False")
        if self.dispatch_batches is not None and not isinstance(self.dispatch_batches, bool):
            raise TypeError(f"dispatch_batches={self.dispatch_batches!r} must be True, False or None (Accelerate's default)")


@dataclass
class GradientAccumulationPlugin:
    """Gradient accumulation settings (``num_steps``; ``sync_with_dataloader`` syncs at the end of a loader)."""

    num_steps: int = 1
    adjust_scheduler: bool = True
    sync_with_dataloader: bool = True
    sync_each_batch: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.num_steps, int) or isinstance(self.num_steps, bool) or self.num_steps < 1:
            raise ValueError(f"gradient accumulation num_steps={self.num_steps!r} must be an int >= 1")


# DDPKwargs (Accelerate's DistributedDataParallelKwargs) lives with the other kwargs handlers; named here too
DDPKwargs = DistributedDataParallelKwargs


@dataclass
class DeepSpeedPlugin:
    """Accelerate's DeepSpeed settings (``Accelerator(deepspeed_plugin=DeepSpeedPlugin(...))``), mapped onto
    `strategies.DeepSpeedStrategy`; ``hf_ds_config`` is a DeepSpeed config dict or JSON file path.

    ``zero3_init_flag`` (ZeRO-3): whether models built in ``accelerator.init_module()`` are partitioned as they are
    built (`deepspeed.zero.Init`); unset means yes, ``False`` builds a full copy there (partitioned when prepared).
    ``zero3_save_16bit_model`` needs no flag: ``save_model`` always writes the consolidated float32 weights.
    """

    hf_ds_config: Any = None
    gradient_accumulation_steps: int | None = None
    gradient_clipping: float | None = None
    zero_stage: int | None = None
    is_train_batch_min: bool = True
    offload_optimizer_device: str | None = None
    offload_param_device: str | None = None
    offload_optimizer_nvme_path: str | None = None
    offload_param_nvme_path: str | None = None
    zero3_init_flag: bool | None = None
    zero3_save_16bit_model: bool | None = None
    transformer_moe_cls_names: str | None = None
    _config: dict[str, Any] | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def deepspeed_config(self) -> dict[str, Any]:
        """The DeepSpeed config dict: the running strategy's (`bind`) once an Accelerator runs it, else `hf_ds_config` loaded."""
        if self._config is None:
            from strategies.deepspeed import load_config  # lazy: the config records import no torch (strategies does)

            self._config = load_config(self.hf_ds_config)
        return self._config

    def bind(self, config: dict[str, Any]) -> None:
        """Make `deepspeed_config` this dict (the running strategy's config, which `prepare` reads)."""
        self._config = config

    def __post_init__(self) -> None:
        if self.transformer_moe_cls_names:
            raise ValueError("transformer_moe_cls_names (DeepSpeed MoE leaf modules) is not supported; leave it unset")
        for name in ("offload_optimizer_device", "offload_param_device"):
            value = getattr(self, name)
            if value not in (None, "none", "cpu", "nvme"):
                raise ValueError(f"{name}={value!r} must be 'none', 'cpu' or 'nvme'")

    def strategy_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `DeepSpeedStrategy` (its ``config`` carries the offload devices and accumulation steps)."""
        from strategies.deepspeed import load_config  # lazy: the config records import no torch (strategies does)

        config = load_config(self.hf_ds_config)
        zero = config.setdefault("zero_optimization", {})
        for key, device, path in (("offload_optimizer", self.offload_optimizer_device, self.offload_optimizer_nvme_path),
                                  ("offload_param", self.offload_param_device, self.offload_param_nvme_path)):
            if device not in (None, "none"):
                zero[key] = {"device": device, **({"nvme_path": path} if path else {})}
        if self.gradient_accumulation_steps is not None:
            config["gradient_accumulation_steps"] = self.gradient_accumulation_steps
        return {"config": config, "zero_stage": self.zero_stage, "gradient_clipping": self.gradient_clipping, "zero_init": self.zero3_init_flag}


# FSDP1-only fields of Accelerate's plugin: their defaults are accepted, anything else is refused (FSDP2 has no such knob)
_FSDP1_ONLY = {"backward_prefetch": None, "forward_prefetch": False, "limit_all_gathers": True, "use_orig_params": True,
               "param_init_fn": None, "ignored_modules": None, "state_dict_config": None, "optim_state_dict_config": None}
_RESHARD = {"FULL_SHARD": True, "SHARD_GRAD_OP": False, "1": True, "2": False}


@dataclass
class FullyShardedDataParallelPlugin:
    """Accelerate's FSDP settings (``Accelerator(fsdp_plugin=...)``, or the ``fsdp_config`` section of an ``accelerate
    config`` file), mapped onto `strategies.FSDPStrategy` (FSDP2). Every field is read: one that has no FSDP2 meaning
    (FSDP1's prefetch and state-dict configs, ``NO_SHARD``/``HYBRID_SHARD``) is refused with the reason when set to
    anything but its default.

    ``auto_wrap_policy``: ``"transformer_based_wrap"`` (the classes named in ``transformer_cls_names_to_wrap``, or the
    model's ``_no_split_modules``), ``"size_based_wrap"`` (``min_num_params``), ``"no_wrap"`` or None (the root only),
    or a set of module classes. ``activation_checkpointing=True`` checkpoints the same block classes.
    """

    fsdp_version: int | None = None
    sharding_strategy: Any = None
    reshard_after_forward: Any = None
    auto_wrap_policy: Any = None
    transformer_cls_names_to_wrap: Any = None
    min_num_params: int | None = None
    cpu_offload: Any = False
    activation_checkpointing: bool = False
    cpu_ram_efficient_loading: bool = False
    sync_module_states: bool | None = None
    mixed_precision_policy: Any = None
    state_dict_type: Any = None
    backward_prefetch: Any = None
    forward_prefetch: bool = False
    limit_all_gathers: bool = True
    use_orig_params: bool | None = True
    param_init_fn: Any = None
    ignored_modules: Any = None
    state_dict_config: Any = None
    optim_state_dict_config: Any = None

    def __post_init__(self) -> None:
        if self.fsdp_version not in (None, 2, "2"):
            raise ValueError(
                f"fsdp_version={self.fsdp_version!r}: only FSDP2 (torch's fully_shard) is supported; FSDP1's full-state-dict and "
                "optimizer checkpoints are unreliable. Set fsdp_version=2 (the same settings carry over)"
            )
        for name, default in _FSDP1_ONLY.items():
            value = getattr(self, name)
            if value is not None and value != default:
                raise ValueError(f"{name}={value!r} is an FSDP1 setting with no FSDP2 meaning; leave it unset (FSDP2 always "
                                 "keeps the original parameters and prefetches one block ahead)")
        if self.state_dict_type is not None and _name(self.state_dict_type) != "SHARDED_STATE_DICT":
            raise ValueError(
                f"state_dict_type={self.state_dict_type!r}: save_state writes sharded states (torch.distributed.checkpoint), which "
                "load at any process count; full weights come from accelerator.save_model / get_state_dict. Use "
                "'SHARDED_STATE_DICT' or leave it unset"
            )
        if self.activation_checkpointing and _name(self.auto_wrap_policy) not in ("TRANSFORMER_BASED_WRAP", "SET"):
            raise ValueError(
                "activation_checkpointing=True checkpoints the transformer block classes: set auto_wrap_policy="
                "'transformer_based_wrap' (with transformer_cls_names_to_wrap, or a model with _no_split_modules)"
            )

    def strategy_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `strategies.FSDPStrategy`."""
        from strategies.fsdp import NO_SPLIT_MODULES  # lazy: the config records import no torch (strategies does)

        kwargs: dict[str, Any] = {"reshard_after_forward": self._reshard(), "cpu_offload": bool(self.cpu_offload),
                                  "cpu_ram_efficient_loading": bool(self.cpu_ram_efficient_loading or self.sync_module_states)}
        policy = _name(self.auto_wrap_policy)
        if policy == "TRANSFORMER_BASED_WRAP":
            names = self.transformer_cls_names_to_wrap
            names = names.split(",") if isinstance(names, str) else names
            kwargs["wrap_classes"] = tuple(n.strip() if isinstance(n, str) else n for n in names) if names else (NO_SPLIT_MODULES,)
        elif policy == "SIZE_BASED_WRAP":
            kwargs["min_num_params"] = int(self.min_num_params or 100_000_000)
        elif policy == "SET":
            kwargs["wrap_classes"] = tuple(self.auto_wrap_policy)
        elif policy in ("NO_WRAP", "NONE"):  # Accelerate's default: the root alone (one unit)
            kwargs["wrap_classes"] = ()
        else:
            raise ValueError(
                f"auto_wrap_policy={self.auto_wrap_policy!r} is not supported with FSDP2; use 'transformer_based_wrap', "
                "'size_based_wrap', 'no_wrap' or a set of module classes"
            )
        if self.activation_checkpointing:
            kwargs["activation_checkpointing_policy"] = kwargs["wrap_classes"]
        if self.mixed_precision_policy is not None:
            kwargs["mixed_precision_policy"] = _mixed_precision_policy(self.mixed_precision_policy)
        return kwargs

    def _reshard(self) -> bool:
        for name in ("reshard_after_forward", "sharding_strategy"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool):
                return value
            key = _name(value)
            if key not in _RESHARD:
                raise ValueError(
                    f"{name}={value!r} is not supported: FSDP2 here shards over one mesh dimension ('FULL_SHARD': reshard after "
                    "forward, or 'SHARD_GRAD_OP': keep the gathered parameters until backward); NO_SHARD is DDP "
                    "(strategy='ddp'), HYBRID_SHARD needs a 2-D mesh, which is not available yet"
                )
            return _RESHARD[key]
        return True


def _name(value: Any) -> str:
    """An enum's or string's upper-case name ("transformer_based_wrap" -> "TRANSFORMER_BASED_WRAP"); "SET" for a set of classes."""
    if value is None:
        return "NONE"
    if isinstance(value, (set, frozenset, list, tuple)):
        return "SET"
    if callable(value) and not isinstance(value, type):
        return f"CALLABLE {getattr(value, '__name__', value)!r}"
    text = getattr(value, "name", value)
    return str(text).split(".")[-1].upper()


def _mixed_precision_policy(value: Any) -> Any:
    """A `MixedPrecisionPolicy` from one, or from a dict of its fields (dtypes or their names, as in a YAML config)."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if isinstance(value, MixedPrecisionPolicy):
        return value
    if not isinstance(value, dict):
        raise TypeError(f"mixed_precision_policy={value!r} must be a torch.distributed.fsdp.MixedPrecisionPolicy or a dict of its fields")
    fields = {}
    for key, item in value.items():
        if key not in ("param_dtype", "reduce_dtype", "output_dtype", "cast_forward_inputs"):
            raise ValueError(f"mixed_precision_policy has unknown field {key!r}; use param_dtype, reduce_dtype, output_dtype, cast_forward_inputs")
        if isinstance(item, str):
            dtype = getattr(torch, {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}.get(item, item), None)
            if not isinstance(dtype, torch.dtype):
                raise ValueError(f"mixed_precision_policy {key}={item!r} is not a torch dtype; use e.g. 'bfloat16' or 'float32'")
            item = dtype
        fields[key] = item
    return MixedPrecisionPolicy(**fields)


FSDPPlugin = FullyShardedDataParallelPlugin


@dataclass
class TorchDynamoPlugin:
    """Accelerate's ``torch.compile`` settings (``Accelerator(dynamo_plugin=...)`` or ``dynamo_backend=``). The model is
    compiled after the strategy set it up (sharded, activation-checkpointed); ``use_regional_compilation`` compiles each
    repeated block instead of the whole forward (see `strategies.compile`). ``backend="no"`` (or ``disable``) compiles nothing.
    """

    backend: Any = None
    mode: str | None = None
    fullgraph: bool = False
    dynamic: bool | None = None
    options: dict[str, Any] | None = None
    disable: bool = False
    use_regional_compilation: bool = False

    def __post_init__(self) -> None:
        if self.backend is None:
            self.backend = os.environ.get("TRAINWRIGHT_DYNAMO_BACKEND", "no")
        self.backend = getattr(self.backend, "value", self.backend)
        if isinstance(self.backend, str):
            self.backend = self.backend.lower()
        self.config()  # checks the values now

    @property
    def enabled(self) -> bool:
        return not self.disable and self.backend != "no"

    def config(self) -> Any:
        """The `strategies.compile.CompileConfig` these settings describe."""
        from strategies.compile import CompileConfig  # lazy: the config records import no torch (strategies does)

        backend = "inductor" if self.backend == "no" else self.backend
        return CompileConfig(backend=backend, mode=self.mode, fullgraph=bool(self.fullgraph), dynamic=self.dynamic,
                             options=dict(self.options or {}), regional=bool(self.use_regional_compilation))
