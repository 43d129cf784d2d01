"""Accelerate's ``kwargs_handlers``: small records that tune one part of a run, each honoured or refused.

    accelerator = Accelerator(mixed_precision="fp16", kwargs_handlers=[
        DistributedDataParallelKwargs(find_unused_parameters=True, comm_hook=DDPCommunicationHookType.FP16),
        InitProcessGroupKwargs(timeout=timedelta(seconds=120)),
        GradScalerKwargs(init_scale=1024.0),
        AutocastKwargs(cache_enabled=False),
        ProfileKwargs(schedule_option={"wait": 1, "warmup": 1, "active": 2}, output_trace_dir="traces"),
    ])

Where each goes: `DistributedDataParallelKwargs` into ``DistributedDataParallel(...)`` and its communication hook
(`strategies.ddp`); `InitProcessGroupKwargs` into the process group (its timeout and backend); `GradScalerKwargs`
into the fp16 loss scaler; `AutocastKwargs` into every autocast region (the prepared model's forward and
``accelerator.autocast()``); `ProfileKwargs` into ``accelerator.profile()``. A setting that cannot take effect in the
run it is given to is an error naming the fix, never dropped. The FP8 recipes (`AORecipeKwargs`, `TERecipeKwargs`,
`MSAMPRecipeKwargs`, `FP8RecipeKwargs`) pick the FP8 backend (`strategies.fp8`): torchao converts the model at
``prepare``; FP8 needs an NVIDIA GPU of compute capability 8.9 or newer, and is refused elsewhere.
"""

from __future__ import annotations

import copy
import datetime
import enum
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from strategies.fp8 import check_fp8_device

if TYPE_CHECKING:
    from torch import nn


class KwargsHandler:
    """Base of the handler records (Accelerate's): `to_kwargs` gives the fields that differ from their defaults."""

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(self.__dict__)

    def to_kwargs(self) -> dict[str, Any]:
        """The fields whose values differ from a default-built record's (what Accelerate passes on)."""
        defaults = type(self)().to_dict()
        return {key: value for key, value in self.to_dict().items() if key not in defaults or defaults[key] != value}


@dataclass
class AutocastKwargs(KwargsHandler):
    """``torch.autocast`` settings for the mixed-precision regions: the prepared model's forward and
    ``accelerator.autocast()``. ``enabled=False`` runs them in float32; ``cache_enabled`` is torch's weight-cast cache."""

    enabled: bool = True
    cache_enabled: bool | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise TypeError(f"AutocastKwargs(enabled={self.enabled!r}) must be True or False")
        if self.cache_enabled is not None and not isinstance(self.cache_enabled, bool):
            raise TypeError(f"AutocastKwargs(cache_enabled={self.cache_enabled!r}) must be True, False or None (torch's default)")

    def settings(self) -> dict[str, Any]:
        """Keyword arguments for ``torch.autocast`` (``cache_enabled`` only when set)."""
        out: dict[str, Any] = {"enabled": self.enabled}
        if self.cache_enabled is not None:
            out["cache_enabled"] = self.cache_enabled
        return out


class DDPCommunicationHookType(str, enum.Enum):
    """A DDP communication hook (torch's ``ddp_comm_hooks``): how gradients travel in the all-reduce.

    ``NO``: plain all-reduce; ``FP16``/``BF16``: compressed to that dtype for the all-reduce; ``POWER_SGD`` /
    ``BATCHED_POWER_SGD``: low-rank compression (PowerSGD). ``FP16``/``BF16`` are also wrappers around a PowerSGD hook.
    """

    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"
    POWER_SGD = "power_sgd"
    BATCHED_POWER_SGD = "batched_power_sgd"

    def __str__(self) -> str:
        return str(self.value)

    @classmethod
    def list(cls) -> list[str]:
        return [str(item) for item in cls]


def _hook_type(value: Any, name: str, allowed: tuple[DDPCommunicationHookType, ...]) -> DDPCommunicationHookType:
    try:
        hook = DDPCommunicationHookType(getattr(value, "value", value))
    except ValueError:
        hook = None
    if hook is None or hook not in allowed:
        raise ValueError(f"{name}={value!r} is not supported; choose one of {[str(a) for a in allowed]}")
    return hook


@dataclass
class DistributedDataParallelKwargs(KwargsHandler):
    """Arguments for ``torch.nn.parallel.DistributedDataParallel`` (every field is passed on) and its communication hook.

    Args:
        dim, broadcast_buffers, bucket_cap_mb, find_unused_parameters, check_reduction, gradient_as_bucket_view,
            static_graph: passed to ``DistributedDataParallel``.
        comm_hook: a `DDPCommunicationHookType`: gradients compressed to fp16/bf16, or PowerSGD.
        comm_wrapper: ``FP16``/``BF16``: compress a PowerSGD hook's communication further.
        comm_state_option: ``PowerSGDState`` arguments (``matrix_approximation_rank``, ``start_powerSGD_iter``, ...);
            PowerSGD hooks only.
        extra: any further ``DistributedDataParallel`` keyword arguments (ours; not in Accelerate).

    With one process there is no ``DistributedDataParallel``: the settings have nothing to act on (as in Accelerate),
    and a warning says so when any is set.
    """

    dim: int = 0
    broadcast_buffers: bool = True
    bucket_cap_mb: float | None = 25
    find_unused_parameters: bool = False
    check_reduction: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    comm_hook: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_wrapper: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_state_option: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        hooks = tuple(DDPCommunicationHookType)
        self.comm_hook = _hook_type(self.comm_hook, "comm_hook", hooks)
        self.comm_wrapper = _hook_type(self.comm_wrapper, "comm_wrapper", hooks[:3])
        power_sgd = self.comm_hook in (DDPCommunicationHookType.POWER_SGD, DDPCommunicationHookType.BATCHED_POWER_SGD)
        if self.comm_state_option and not power_sgd:
            raise ValueError(
                f"comm_state_option={self.comm_state_option!r} configures PowerSGD's state, but comm_hook={str(self.comm_hook)!r}; "
                "set comm_hook=DDPCommunicationHookType.POWER_SGD (or BATCHED_POWER_SGD), or drop comm_state_option"
            )
        if self.comm_wrapper is not DDPCommunicationHookType.NO and self.comm_hook is DDPCommunicationHookType.NO:
            raise ValueError(
                f"comm_wrapper={str(self.comm_wrapper)!r} wraps a communication hook, but comm_hook='no'; set comm_hook "
                "(e.g. DDPCommunicationHookType.POWER_SGD), or drop comm_wrapper"
            )
        if not isinstance(self.extra, dict):
            raise TypeError(f"extra={self.extra!r} must be a dict of DistributedDataParallel keyword arguments")
        clash = sorted(set(self.extra) & set(self.ddp_kwargs(extra=False)))
        if clash:
            raise ValueError(f"extra sets {clash}, which are fields of DistributedDataParallelKwargs; set the fields instead")

    def to_dict(self, ignore_keys: tuple[str, ...] = ("comm_hook", "comm_wrapper", "comm_state_option")) -> dict[str, Any]:
        return {key: value for key, value in super().to_dict().items() if key not in ignore_keys}

    def ddp_kwargs(self, extra: bool = True) -> dict[str, Any]:
        """The keyword arguments for ``DistributedDataParallel`` (all fields but the hook's, then `extra`)."""
        out = {"dim": self.dim, "broadcast_buffers": self.broadcast_buffers, "bucket_cap_mb": self.bucket_cap_mb,
               "find_unused_parameters": self.find_unused_parameters, "check_reduction": self.check_reduction,
               "gradient_as_bucket_view": self.gradient_as_bucket_view, "static_graph": self.static_graph}
        return {**out, **self.extra} if extra else out

    def comm_hook_settings(self) -> dict[str, Any]:
        """The hook for `strategies.ddp.register_comm_hook` (empty without one)."""
        if self.comm_hook is DDPCommunicationHookType.NO:
            return {}
        return {"hook": self.comm_hook.value, "wrapper": None if self.comm_wrapper is DDPCommunicationHookType.NO else self.comm_wrapper.value,
                "state_option": dict(self.comm_state_option)}

    def is_default(self) -> bool:
        return not self.to_kwargs() and not self.comm_hook_settings() and not self.extra

    def register_comm_hook(self, model: nn.Module) -> None:
        """Register the communication hook on a ``DistributedDataParallel`` `model` (Accelerate's method)."""
        from strategies.ddp import register_comm_hook  # lazy: the config records import no torch.distributed

        settings = self.comm_hook_settings()
        if settings:
            register_comm_hook(model, **settings)


DDPKwargs = DistributedDataParallelKwargs


@dataclass
class GradScalerKwargs(KwargsHandler):
    """Arguments for the fp16 loss scaler (``torch.amp.GradScaler``; FSDP's ``ShardedGradScaler``).

    Only ``mixed_precision="fp16"`` scales losses; with another precision there is no scaler and a warning says the
    settings have nothing to act on. DeepSpeed scales fp16 losses itself: set its ``fp16`` config section instead.
    """

    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True


@dataclass
class InitProcessGroupKwargs(KwargsHandler):
    """The process group's settings: ``timeout`` (a ``timedelta`` or seconds) bounds every collective's wait;
    ``backend`` (``"gloo"``, ``"nccl"``, ...) replaces the one chosen from the device when set to something other
    than Accelerate's default ``"nccl"``. ``init_method`` other than ``"env://"`` is refused: the launcher's environment is used.

    Without a ``timeout`` the Accelerate defaults apply (1800 s; 600 s for nccl), as in Accelerate.
    """

    backend: str | None = "nccl"
    init_method: str | None = None
    timeout: datetime.timedelta | float | None = None

    def __post_init__(self) -> None:
        if self.timeout is None:
            self.timeout = datetime.timedelta(seconds=1800 if self.backend != "nccl" else 600)
        elif isinstance(self.timeout, (int, float)) and not isinstance(self.timeout, bool):
            self.timeout = datetime.timedelta(seconds=float(self.timeout))
        if not isinstance(self.timeout, datetime.timedelta) or self.timeout.total_seconds() <= 0:
            raise ValueError(f"InitProcessGroupKwargs(timeout={self.timeout!r}) must be a positive datetime.timedelta (or seconds)")
        if self.init_method not in (None, "env://"):
            raise ValueError(
                f"InitProcessGroupKwargs(init_method={self.init_method!r}) is not supported: processes find each other through "
                "the launcher's environment (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE; init_method='env://'). Drop init_method "
                "and launch with `trainer launch` or torchrun"
            )

    @property
    def timeout_seconds(self) -> float:
        assert isinstance(self.timeout, datetime.timedelta)
        return self.timeout.total_seconds()


ProfilerActivity = str  # "cpu", "cuda", "xpu", "mtia", "hpu"


@dataclass
class ProfileKwargs(KwargsHandler):
    """``torch.profiler.profile`` settings for ``accelerator.profile()`` (Accelerate's fields).

    Args:
        activities: ``"cpu"``, ``"cuda"``, ``"xpu"``, ``"mtia"``, ``"hpu"`` (those this machine has); torch's default when None.
        schedule_option: ``torch.profiler.schedule`` arguments: ``wait``, ``warmup``, ``active``, ``repeat``, ``skip_first``;
            call ``prof.step()`` once per step inside the block.
        on_trace_ready: called with the profiler whenever a scheduled ``active`` window ends (torch's ``on_trace_ready``).
        record_shapes, profile_memory, with_stack, with_flops, with_modules: passed to ``torch.profiler.profile``.
        output_trace_dir: after the block, each process writes its Chrome trace there as ``profile_<rank>.json``.
    """

    activities: list[ProfilerActivity] | None = None
    schedule_option: dict[str, int] | None = None
    on_trace_ready: Callable[..., Any] | None = None
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_flops: bool = False
    with_modules: bool = False
    output_trace_dir: str | os.PathLike[str] | None = None

    def __post_init__(self) -> None:
        allowed = {"wait", "warmup", "active", "repeat", "skip_first", "skip_first_wait"}
        unknown = sorted(set(self.schedule_option or {}) - allowed)
        if unknown:
            raise ValueError(f"schedule_option has unknown keys {unknown}; use wait, warmup, active, repeat, skip_first")
        if self.on_trace_ready is not None and not callable(self.on_trace_ready):
            raise TypeError(f"on_trace_ready={self.on_trace_ready!r} must be a function taking the profiler")

    def _get_profiler_activity(self, activity: ProfilerActivity) -> Any:
        import torch

        available: dict[str, Any] = {"cpu": torch.profiler.ProfilerActivity.CPU, "cuda": torch.profiler.ProfilerActivity.CUDA}
        for name, check in (("xpu", lambda: torch.xpu.is_available()), ("mtia", lambda: torch.mtia.is_available()),
                            ("hpu", lambda: hasattr(torch, "hpu") and torch.hpu.is_available())):
            member = getattr(torch.profiler.ProfilerActivity, name.upper(), None)
            try:
                present = member is not None and check()
            except (AttributeError, RuntimeError):
                present = False
            if present:
                available[name] = member
        if activity not in available:
            raise ValueError(f"profiler activity {activity!r} is not available here; choose from {sorted(available)}")
        return available[activity]

    def build(self) -> Any:
        """The ``torch.profiler.profile`` these settings describe."""
        import torch

        activities = None if self.activities is None else [self._get_profiler_activity(a) for a in self.activities]
        schedule = None if self.schedule_option is None else torch.profiler.schedule(**self.schedule_option)
        return torch.profiler.profile(
            activities=activities, schedule=schedule, on_trace_ready=self.on_trace_ready, record_shapes=self.record_shapes,
            profile_memory=self.profile_memory, with_stack=self.with_stack, with_flops=self.with_flops, with_modules=self.with_modules,
        )


# FP8 recipes (strategies.fp8 applies them). FP8 needs an NVIDIA GPU of compute capability 8.9+ (Ada, Hopper, Blackwell).
@dataclass
class AORecipeKwargs(KwargsHandler):
    """torchao's FP8 recipe (Accelerate's fields): a ``Float8LinearConfig`` or its two flags, and a module filter (`strategies.fp8`)."""

    config: Any = None
    module_filter_func: Callable[..., Any] | None = None
    pad_inner_dim: bool | None = None
    enable_fsdp_float8_all_gather: bool | None = None


@dataclass
class TERecipeKwargs(KwargsHandler):
    """Transformer Engine's FP8 recipe (Accelerate's fields). Not wired: the `Accelerator` refuses it, naming the package."""

    use_autocast_during_eval: bool | None = None
    margin: int | None = None
    interval: int | None = None
    fp8_format: str | None = None
    amax_history_len: int | None = None
    amax_compute_algo: str | None = None
    override_linear_precision: tuple[bool, bool, bool] | None = None
    use_mxfp8_block_scaling: bool | None = None


@dataclass
class MSAMPRecipeKwargs(KwargsHandler):
    """MS-AMP's FP8 recipe (Accelerate's fields). Not wired: the `Accelerator` refuses it, naming the package."""

    opt_level: str | None = None


@dataclass
class FP8RecipeKwargs(TERecipeKwargs, MSAMPRecipeKwargs):
    """Accelerate's deprecated FP8 recipe (a ``backend`` plus the TE and MS-AMP fields); ``backend`` is ``"TE"`` or ``"MSAMP"``."""

    backend: str | None = None


FP8_RECIPES = (AORecipeKwargs, TERecipeKwargs, MSAMPRecipeKwargs, FP8RecipeKwargs)


def check_fp8(device_type: str, capability: tuple[int, int] | None, what: str) -> None:
    """Refuse FP8 (`what` names the request) on a machine without an NVIDIA GPU of compute capability 8.9+."""
    check_fp8_device(device_type, capability, what)


_ATTRIBUTES: dict[type, str] = {
    DistributedDataParallelKwargs: "ddp_handler",
    GradScalerKwargs: "scaler_handler",
    InitProcessGroupKwargs: "init_handler",
    AutocastKwargs: "autocast_handler",
    ProfileKwargs: "profile_handler",
    FP8RecipeKwargs: "fp8_recipe_handler",
    AORecipeKwargs: "ao_recipe_handler",
    TERecipeKwargs: "te_recipe_handler",
    MSAMPRecipeKwargs: "msamp_recipe_handler",
}


@dataclass
class KwargsHandlers:
    """The handlers an `Accelerator` got, one per kind, under Accelerate's attribute names."""

    ddp_handler: DistributedDataParallelKwargs | None = None
    scaler_handler: GradScalerKwargs | None = None
    init_handler: InitProcessGroupKwargs | None = None
    autocast_handler: AutocastKwargs | None = None
    profile_handler: ProfileKwargs | None = None
    fp8_recipe_handler: FP8RecipeKwargs | None = None
    ao_recipe_handler: AORecipeKwargs | None = None
    te_recipe_handler: TERecipeKwargs | None = None
    msamp_recipe_handler: MSAMPRecipeKwargs | None = None

    @classmethod
    def sort(cls, handlers: list[Any] | tuple[Any, ...] | None) -> KwargsHandlers:
        """One record per kind from `handlers`; an unknown object or a kind given twice is an error."""
        out = cls()
        if handlers is None:
            return out
        if not isinstance(handlers, (list, tuple)):
            raise TypeError(f"kwargs_handlers={handlers!r} must be a list of handler records, e.g. [DistributedDataParallelKwargs(...)]")
        for handler in handlers:
            attribute = _ATTRIBUTES.get(type(handler))
            if attribute is None:
                raise TypeError(
                    f"kwargs_handlers got {handler!r:.80}, which is not a handler this Accelerator knows; pass instances of "
                    f"{', '.join(sorted(c.__name__ for c in _ATTRIBUTES))} (from trainer.utils)"
                )
            if getattr(out, attribute) is not None:
                raise ValueError(f"kwargs_handlers has two {type(handler).__name__}; pass one")
            setattr(out, attribute, handler)
        return out

    def fp8_recipes(self) -> list[Any]:
        return [h for h in (self.fp8_recipe_handler, self.ao_recipe_handler, self.te_recipe_handler, self.msamp_recipe_handler) if h is not None]

    def timeout(self, process_group_timeout: float | None) -> float | None:
        """The process-group timeout in seconds: ``process_group_timeout`` or the `InitProcessGroupKwargs` one (not two values)."""
        if self.init_handler is None or "timeout" not in self.init_handler.to_kwargs():
            return process_group_timeout
        seconds = self.init_handler.timeout_seconds
        if process_group_timeout is not None and float(process_group_timeout) != seconds:
            raise ValueError(
                f"process_group_timeout={process_group_timeout!r} and InitProcessGroupKwargs(timeout={seconds:g} s) disagree; set one"
            )
        return seconds

    def backend(self) -> str | None:
        """The backend `InitProcessGroupKwargs` asks for (None: chosen from the device). Accelerate's default
        ``"nccl"`` counts as unset, as in Accelerate (which passes on only the fields changed from their defaults)."""
        if self.init_handler is None:
            return None
        return self.init_handler.to_kwargs().get("backend")


__all__ = [
    "AORecipeKwargs", "AutocastKwargs", "DDPCommunicationHookType", "DDPKwargs", "DistributedDataParallelKwargs", "FP8RecipeKwargs",
    "GradScalerKwargs", "InitProcessGroupKwargs", "KwargsHandler", "KwargsHandlers", "MSAMPRecipeKwargs", "ProfileKwargs",
    "TERecipeKwargs", "check_fp8",
]
