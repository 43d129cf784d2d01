"""Small configuration records of the `Accelerator` face (the names Accelerate users know)."""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass, field
from typing import Any


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
    """

    split_batches: bool = False
    even_batches: bool = True
    dispatch_batches: bool | None = None
    use_seedable_sampler: bool = True
    non_blocking: bool = False
    data_seed: int | None = None
    use_stateful_dataloader: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.use_stateful_dataloader, bool):
            raise TypeError(f"use_stateful_dataloader={self.use_stateful_dataloader!r} must be True or False")
        if self.dispatch_batches:
            raise NotImplementedError(
                "dispatch_batches=True (rank 0 loads and scatters every batch) is not supported; every rank loads its own shard. "
                "Leave dispatch_batches unset"
            )


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


@dataclass
class DDPKwargs:
    """Extra arguments for `DistributedDataParallel` (Accelerate's ``DistributedDataParallelKwargs``)."""

    find_unused_parameters: bool = False
    static_graph: bool = False
    bucket_cap_mb: float | None = None
    gradient_as_bucket_view: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


DistributedDataParallelKwargs = DDPKwargs


@dataclass
class DeepSpeedPlugin:
    """Accelerate's DeepSpeed settings (``Accelerator(deepspeed_plugin=DeepSpeedPlugin(...))``), mapped onto
    `strategies.DeepSpeedStrategy`; ``hf_ds_config`` is a DeepSpeed config dict or JSON file path.

    ``zero3_init_flag=True`` (building the model already partitioned) is refused: the model is partitioned when
    prepared. ``zero3_save_16bit_model`` needs no flag: ``save_model`` always writes the consolidated float32 weights.
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

    def __post_init__(self) -> None:
        if self.zero3_init_flag:
            raise ValueError(
                "zero3_init_flag=True (constructing the model partitioned) is not supported: the model is partitioned when "
                "prepared; leave zero3_init_flag unset"
            )
        if self.transformer_moe_cls_names:
            raise ValueError("transformer_moe_cls_names (DeepSpeed MoE leaf modules) is not supported; leave it unset")
        for name in ("offload_optimizer_device", "offload_param_device"):
            value = getattr(self, name)
            if value not in (None, "none", "cpu", "nvme"):
                raise ValueError(f"{name}={value!r} must be 'none', 'cpu' or 'nvme'")

    def strategy_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `DeepSpeedStrategy` (its ``config`` carries the offload devices and accumulation steps)."""
        from strategies.deepspeed import load_config

        config = load_config(self.hf_ds_config)
        zero = config.setdefault("zero_optimization", {})
        for key, device, path in (("offload_optimizer", self.offload_optimizer_device, self.offload_optimizer_nvme_path),
                                  ("offload_param", self.offload_param_device, self.offload_param_nvme_path)):
            if device not in (None, "none"):
                zero[key] = {"device": device, **({"nvme_path": path} if path else {})}
        if self.gradient_accumulation_steps is not None:
            config["gradient_accumulation_steps"] = self.gradient_accumulation_steps
        return {"config": config, "zero_stage": self.zero_stage, "gradient_clipping": self.gradient_clipping}
