"""Precision as an object composed into a strategy.

`Precision` owns autocast, loss scaling, unscaling before clipping and the optimizer step, so no call
site branches on ``if scaler:``. Its modes:

* ``"no"``: full precision (float32).
* ``"fp16"``, ``"bf16"``: mixed precision. Parameters stay float32; the forward runs under ``torch.autocast``
  (``fp16`` adds a dynamic `GradScaler`).
* ``"fp16-true"``, ``"bf16-true"``, ``"fp64-true"``: true precision (Lightning's ``"16-true"``, ``"bf16-true"``,
  ``"64-true"``). The module is converted (``module.to(dtype)``) before the strategy wraps or shards it, so the
  parameters, gradients and optimizer states are in that dtype; floating-point inputs reaching the module's
  forward are cast to it, and torch's default dtype is that dtype inside the forward and the step, so tensors
  created there are too. No autocast, no loss scaler.

Who owns it: the strategy. A `Precision` is built from a `PrecisionSettings` (the mode and what the faces' arguments add:
FP8, FSDP's `MixedPrecisionPolicy`, a loss scaler or its arguments, autocast's settings), by the strategy at construction
and again by `Strategy.configure_precision(settings)`, which the faces call with what they translated from Accelerate's
handlers or Lightning's precision plugins. Nothing else changes a precision once built.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any, Self

import torch
from torch import nn

from strategies.collectives import apply_to_tensors
from strategies.optim import step_optimizer

_ALIASES = {
    "no": "no", "32": "no", "32-true": "no", "fp32": "no", "float32": "no",
    "fp16": "fp16", "16": "fp16", "16-mixed": "fp16", "float16": "fp16",
    "bf16": "bf16", "bf16-mixed": "bf16", "bfloat16": "bf16",
    "fp16-true": "fp16-true", "16-true": "fp16-true",
    "bf16-true": "bf16-true",
    "fp64-true": "fp64-true", "64-true": "fp64-true", "64": "fp64-true", "fp64": "fp64-true", "double": "fp64-true",
    "float64": "fp64-true",
}
_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16,
           "fp16-true": torch.float16, "bf16-true": torch.bfloat16, "fp64-true": torch.float64}

PRECISION_NAMES = tuple(_ALIASES)
TRUE_PRECISION_MODES = ("fp16-true", "bf16-true", "fp64-true")
PRECISION_CHOICES = ("'no', 'fp16', 'bf16', 'fp16-true', 'bf16-true', 'fp64-true' "
                     "(or 32, 16, '16-mixed', 'bf16-mixed', '16-true', 64, '64-true', 'double')")


def normalize_precision(value: Any) -> str:
    """Map every accepted spelling (``16``, ``"16-mixed"``, ``"bf16-mixed"``, ``"32-true"``, ``"16-true"``, ``64``, ...)
    to a mode: ``"no"``, ``"fp16"``, ``"bf16"``, ``"fp16-true"``, ``"bf16-true"`` or ``"fp64-true"``."""
    if value is None:
        return "no"
    key = "" if isinstance(value, bool) else str(value).strip().lower()
    if key.startswith("precisiontype."):
        key = key.split(".", 1)[1]
    if key not in _ALIASES:
        raise ValueError(f"mixed_precision={value!r} is not supported; choose one of {PRECISION_CHOICES}")
    return _ALIASES[key]


def check_precision_supported(mode: str, device: torch.device) -> None:
    """Raise if this hardware cannot run `mode`."""
    if mode in ("bf16", "bf16-true") and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError(
            f"mixed_precision={mode!r} needs a GPU with bfloat16 support, but {torch.cuda.get_device_name(device)} has none; "
            f"use mixed_precision={mode.replace('bf16', 'fp16')!r} or 'no'"
        )
    if mode == "fp16" and device.type == "mps" and not hasattr(torch.amp, "GradScaler"):
        raise ValueError("mixed_precision='fp16' on MPS needs a newer torch; use mixed_precision='no'")
    if mode == "fp64-true" and device.type == "mps":
        raise ValueError("mixed_precision='fp64-true' is not supported on MPS, which has no float64; use mixed_precision='no'")
    if mode != "no" and device.type not in ("cpu", "cuda", "mps", "xpu", "xla", "hpu", "npu"):
        raise ValueError(f"mixed_precision={mode!r} is not supported on device type {device.type!r}; use mixed_precision='no'")


_SCALER_ARGUMENTS = ("init_scale", "growth_factor", "backoff_factor", "growth_interval", "enabled")
_AUTOCAST_ARGUMENTS = ("enabled", "cache_enabled")


@dataclasses.dataclass(frozen=True)
class PrecisionSettings:
    """Everything a strategy's `Precision` is built from (`Strategy.configure_precision`); each field is what one of the
    faces' arguments carries.

    Args:
        mode: the precision mode (any spelling `normalize_precision` accepts; stored normalized).
        float8: train the Linear layers in FP8 under bf16 autocast (``Accelerator(mixed_precision="fp8")``); needs mode ``"bf16"``.
        policy: FSDP2's `MixedPrecisionPolicy` instead of the mode's (``FullyShardedDataParallelPlugin(mixed_precision_policy=...)``,
            Lightning's ``FSDPPrecision``); ``strategy="fsdp"`` only.
        scaler: a loss scaler instead of the mode's (Lightning's ``MixedPrecision("16-mixed", device, scaler=...)``).
        scaler_kwargs: ``GradScaler`` arguments for the mode's loss scaler (Accelerate's ``GradScalerKwargs``).
        autocast: ``torch.autocast``'s ``enabled`` / ``cache_enabled`` for every autocast region (Accelerate's ``AutocastKwargs``).
    """

    mode: str = "no"
    float8: bool = False
    policy: Any = None
    scaler: torch.amp.GradScaler | None = None
    scaler_kwargs: Mapping[str, Any] | None = None
    autocast: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", normalize_precision(self.mode))
        if not isinstance(self.float8, bool):
            raise TypeError(f"PrecisionSettings(float8={self.float8!r}) must be True or False")
        if self.float8 and self.mode != "bf16":
            raise ValueError(f"PrecisionSettings(float8=True) runs FP8 under bf16 autocast, but mode is {self.mode!r}; "
                             "use mode='bf16' (Accelerator(mixed_precision='fp8') sets it)")
        if self.scaler is not None and self.scaler_kwargs:
            raise ValueError(f"PrecisionSettings got a scaler ({type(self.scaler).__name__}) and scaler_kwargs={dict(self.scaler_kwargs)!r}; "
                             "pass one: the kwargs configure the mode's scaler, the scaler replaces it")
        for name, given, allowed in (("scaler_kwargs", self.scaler_kwargs, _SCALER_ARGUMENTS),
                                     ("autocast", self.autocast, _AUTOCAST_ARGUMENTS)):
            unknown = sorted(set(given or ()) - set(allowed))
            if unknown:
                raise ValueError(f"PrecisionSettings({name}=...) has {unknown!r}, which it does not take; choose from {list(allowed)}")
            object.__setattr__(self, name, dict(given) if given else None)  # empty: the defaults, as None


class DefaultDtype:
    """Context manager: torch's default dtype is `dtype` inside the block, and the previous one again after it,
    also when the block raises (Lightning's ``_DtypeContextManager``)."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self._previous: list[torch.dtype] = []

    def __enter__(self) -> None:
        self._previous.append(torch.get_default_dtype())
        torch.set_default_dtype(self.dtype)

    def __exit__(self, *exc: object) -> None:
        torch.set_default_dtype(self._previous.pop())


def cast_forward(
    module: nn.Module,
    *,
    inputs: Callable[[], torch.dtype] | None = None,
    context: Callable[[], AbstractContextManager[Any]] | None = None,
    outputs: Callable[[torch.Tensor], torch.Tensor],
) -> nn.Module:
    """Wrap `module`'s forward, once (a second call is a no-op): floating-point inputs are cast to ``inputs()``
    (left as they are when None), the forward runs inside ``context()`` (when given), and `outputs` is applied
    to every output tensor after the context is left."""
    if getattr(module.forward, "_trainwright_autocast", False):
        return module
    original = module.forward

    @functools.wraps(original)
    def forward(*args: Any, **kwargs: Any) -> Any:
        if inputs is not None:
            dtype = inputs()

            def cast(tensor: torch.Tensor) -> torch.Tensor:
                return tensor.to(dtype) if tensor.is_floating_point() else tensor

            args, kwargs = apply_to_tensors(cast, args), apply_to_tensors(cast, kwargs)
        if context is None:
            output = original(*args, **kwargs)
        else:
            with context():
                output = original(*args, **kwargs)
        return apply_to_tensors(outputs, output)

    forward._trainwright_autocast = True  # type: ignore[attr-defined]
    module.forward = forward
    return module


class Precision:
    """Autocast + (for fp16) dynamic loss scaling for one device, or true precision (see the module docstring).

    ``dtype`` is the low dtype of a mixed or true mode (None in full precision); ``parameter_dtype`` is the dtype
    the module's parameters are converted to, in the true modes only (None otherwise). ``settings`` is the
    `PrecisionSettings` it was built from; a strategy builds another from new settings (`from_settings`).

    Args:
        mode: the precision mode (any spelling `normalize_precision` accepts).
        device: the device it computes on (CPU when None).
        scaler: a loss scaler instead of the mode's ``GradScaler`` (fp16 only).
    """

    takes_policy = False  # whether an FSDP2 MixedPrecisionPolicy is what casts (FSDPPrecision)

    def __init__(self, mode: str = "no", device: torch.device | None = None, *, scaler: torch.amp.GradScaler | None = None) -> None:
        self.mode = normalize_precision(mode)
        self.device = torch.device("cpu") if device is None else torch.device(device)
        check_precision_supported(self.mode, self.device)
        self.dtype = _DTYPES.get(self.mode)
        self.parameter_dtype = self.dtype if self.mode in TRUE_PRECISION_MODES else None
        self.scaler: torch.amp.GradScaler | None = self.new_scaler()
        self.autocast_settings: dict[str, Any] = {}  # torch.autocast's enabled / cache_enabled (Accelerate's AutocastKwargs)
        self._unscaled: set[int] = set()
        self.step_was_skipped = False
        self.in_use = False  # a module was converted with it (set up or prepared): its settings are fixed from then on
        self.settings = PrecisionSettings(self.mode)
        if scaler is not None:
            self._take(PrecisionSettings(self.mode, scaler=scaler))

    @classmethod
    def from_settings(cls, settings: PrecisionSettings, device: torch.device | None = None) -> Self:
        """A precision of this class built from `settings`; `ValueError` for a setting it cannot take, naming the fix."""
        precision = cls(settings.mode, device)
        precision._take(settings)
        return precision

    def _take(self, settings: PrecisionSettings) -> None:
        """Apply what `settings` adds to the mode (a new precision only: `from_settings` and the constructors)."""
        if settings.policy is not None and not self.takes_policy:
            raise ValueError(
                f"PrecisionSettings(policy={settings.policy!r}): a MixedPrecisionPolicy is for strategy='fsdp', but this strategy's "
                f"precision is a {type(self).__name__}; drop the policy or use strategy='fsdp'"
            )
        if settings.autocast is not None:
            self._check_autocast(settings.autocast)
            self.autocast_settings = {"enabled": bool(settings.autocast.get("enabled", True)),
                                      "cache_enabled": settings.autocast.get("cache_enabled")}
        if settings.scaler_kwargs is not None:
            self.scaler = self._configured_scaler(settings.scaler_kwargs)
        if settings.scaler is not None:
            if self.scaler is None:
                raise ValueError(
                    f"a loss scaler ({type(settings.scaler).__name__}, as MixedPrecision(..., scaler=...)) needs a precision with loss "
                    f"scaling, but {type(self).__name__} with mode {self.mode!r} has none; drop the scaler"
                )
            self.scaler = settings.scaler
        self.settings = settings

    @property
    def float8(self) -> bool:
        """Whether the Linear layers train in FP8 (under bf16 autocast): reported as ``"fp8"``."""
        return self.settings.float8

    def new_scaler(self) -> torch.amp.GradScaler | None:
        """The mode's loss scaler: a ``GradScaler`` for fp16, else None."""
        return torch.amp.GradScaler(self.device.type) if self.mode == "fp16" else None

    def _check_autocast(self, settings: Mapping[str, Any]) -> None:
        if not self.uses_autocast():
            enabled, cache_enabled = settings.get("enabled", True), settings.get("cache_enabled")
            raise ValueError(
                f"autocast settings (enabled={enabled!r}, cache_enabled={cache_enabled!r}) need a mixed precision that runs "
                f"torch.autocast, but {type(self).__name__} with mode {self.mode!r} runs none; use mixed_precision='bf16' or "
                "'fp16' with strategy='single'/'ddp', or drop the settings"
            )

    def _configured_scaler(self, kwargs: Mapping[str, Any]) -> torch.amp.GradScaler:
        """The mode's loss scaler built with these ``GradScaler`` arguments (Accelerate's ``GradScalerKwargs``)."""
        if self.scaler is None:
            raise ValueError(
                f"loss-scaler settings {dict(kwargs)!r} need mixed_precision='fp16' with a GradScaler, but {type(self).__name__} "
                f"with mode {self.mode!r} has none; use mixed_precision='fp16', or drop the settings"
            )
        return type(self.scaler)(self.device.type, **kwargs)

    def convert_parameters(self, module: nn.Module) -> nn.Module:
        """True precision: ``module.to(dtype)`` (floating-point parameters and buffers, in place, so optimizers built on
        them keep them). A strategy calls it before it wraps or shards the module; a no-op in the other modes."""
        self.in_use = True
        return module if self.parameter_dtype is None else module.to(self.parameter_dtype)

    def convert_module(self, module: nn.Module) -> nn.Module:
        """Wrap `module`'s forward for this mode (once; a no-op in full precision).

        Mixed: the forward runs under autocast and hands back float32 outputs. True: floating-point inputs are cast
        to the dtype, the forward runs with it as torch's default dtype, and floating-point outputs come back in the
        caller's default dtype (float32 in your own loop, as Lightning Fabric; the dtype inside a Trainer step, as Lightning).
        """
        self.in_use = True
        if self.dtype is None:
            return module
        if self.parameter_dtype is not None:
            dtype = self.parameter_dtype
            return cast_forward(module, inputs=lambda: dtype, context=self.forward_context, outputs=_to_default_dtype)
        return cast_forward(module, context=self.autocast, outputs=_to_fp32)

    def convert_input(self, data: Any) -> Any:
        """True precision: `data` with its floating-point tensors cast to the dtype (the batch a Trainer step gets,
        as Lightning's); `data` itself in the other modes."""
        if self.parameter_dtype is None:
            return data
        dtype = self.parameter_dtype
        return apply_to_tensors(lambda t: t.to(dtype) if t.is_floating_point() else t, data)

    def forward_context(self) -> AbstractContextManager[Any]:
        """Context the faces enter around a step that runs outside the module's forward (``training_step``):
        autocast in the mixed modes, the dtype as torch's default dtype in the true modes."""
        return self.autocast()

    def module_init_context(self) -> AbstractContextManager[Any]:
        """Context to build a model in: in the true modes torch's default dtype is the dtype inside it, so the
        parameters are created in it (Lightning's ``module_init_context``); a no-op in the other modes."""
        if self.parameter_dtype is None:
            return contextlib.nullcontext()
        return DefaultDtype(self.parameter_dtype)

    def autocast(self, enabled: bool | None = None, cache_enabled: bool | None = None) -> AbstractContextManager[Any]:
        """Context that runs the enclosed ops in the mixed dtype (a no-op in full precision); in the true modes it
        makes the dtype torch's default dtype (parameters and inputs are already in it).

        `enabled` and `cache_enabled` are ``torch.autocast``'s; unset, they are `autocast_settings`' (the settings'
        ``autocast``). ``enabled=False`` in a mixed mode is ``torch.autocast(enabled=False)``: float32 inside,
        also within an enclosing autocast region.
        """
        on = self.autocast_settings.get("enabled", True) if enabled is None else enabled
        if self.dtype is None:
            return contextlib.nullcontext()
        if self.parameter_dtype is not None:
            return DefaultDtype(self.parameter_dtype) if on else contextlib.nullcontext()
        cache = self.autocast_settings.get("cache_enabled") if cache_enabled is None else cache_enabled
        extra = {} if cache is None else {"cache_enabled": cache}
        return torch.autocast(device_type=self.device.type, dtype=self.dtype, enabled=on, **extra)

    def uses_autocast(self) -> bool:
        """Whether this precision computes through ``torch.autocast`` (the mixed modes; not the true ones)."""
        return self.dtype is not None and self.parameter_dtype is None

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        if self.scaler is not None:
            loss = self.scaler.scale(loss)
        if kwargs:
            loss.backward(**kwargs)
        else:  # every step: a plain call costs less than unpacking an empty dict (the same below)
            loss.backward()

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Unscale `optimizer`'s gradients once per step (before clipping)."""
        if self.scaler is not None and id(optimizer) not in self._unscaled:
            self.scaler.unscale_(optimizer)
            self._unscaled.add(id(optimizer))

    def optimizer_step(self, optimizer: torch.optim.Optimizer, **kwargs: Any) -> bool:
        """Step `optimizer`; return False when fp16 loss scaling skipped the step (inf/nan gradients)."""
        if self.scaler is None:
            if kwargs:
                optimizer.step(**kwargs)
            else:
                step_optimizer(optimizer)  # optimizer.step() without torch's labels where nothing sees them
            self.step_was_skipped = False
            return True
        scale_before = self.scaler.get_scale()
        self.scaler.step(optimizer, **kwargs)
        self.scaler.update()
        self._unscaled.discard(id(optimizer))
        self.step_was_skipped = self.scaler.get_scale() < scale_before
        return not self.step_was_skipped

    def state_dict(self) -> dict[str, Any]:
        return {} if self.scaler is None else self.scaler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)


class FSDPPrecision(Precision):
    """Precision for FSDP2.

    Mixed (``fp16``, ``bf16``): parameters all-gathered in the low dtype, gradients reduced in float32. The casts
    are FSDP's own (`MixedPrecisionPolicy`, applied when the strategy shards the module), so no autocast runs;
    ``fp16`` adds a `ShardedGradScaler`, which agrees on skipped steps across ranks.

    True (``fp16-true``, ``bf16-true``, ``fp64-true``): the strategy converts the module before sharding it, so the
    shards (and gradients, reductions and optimizer states) are in that dtype; no policy, inputs cast as by `Precision`.

    Args:
        mode: the precision mode (any spelling `normalize_precision` accepts).
        device: the device the strategy runs on.
        policy: an explicit `torch.distributed.fsdp.MixedPrecisionPolicy` for `fully_shard` (Accelerate's
            ``FullyShardedDataParallelPlugin(mixed_precision_policy=...)``); `mp_policy` returns it instead of the
            mode's. A strategy's is set through ``strategy.configure_precision(settings)``, before the module is sharded.
        scaler: a loss scaler instead of the mode's ``ShardedGradScaler`` (fp16 only).
    """

    takes_policy = True

    def __init__(self, mode: str = "no", device: torch.device | None = None, *, policy: Any = None,
                 scaler: torch.amp.GradScaler | None = None) -> None:
        super().__init__(mode, device, scaler=scaler)
        if policy is not None:
            self._take(dataclasses.replace(self.settings, policy=policy))

    @property
    def policy(self) -> Any:
        """The explicit `MixedPrecisionPolicy` of the settings (None: the mode's)."""
        return self.settings.policy

    def new_scaler(self) -> torch.amp.GradScaler | None:
        if self.mode != "fp16":
            return None
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(self.device.type)

    def mp_policy(self) -> Any:
        """The `MixedPrecisionPolicy` for `fully_shard`: `policy` when set, else the mode's (None in full and true precision)."""
        if self.policy is not None:
            return self.policy
        if self.dtype is None or self.parameter_dtype is not None:
            return None
        from torch.distributed.fsdp import MixedPrecisionPolicy

        return MixedPrecisionPolicy(param_dtype=self.dtype, reduce_dtype=torch.float32, output_dtype=torch.float32)

    def convert_module(self, module: nn.Module) -> nn.Module:
        self.in_use = True
        return module if self.parameter_dtype is None else super().convert_module(module)

    def forward_context(self) -> AbstractContextManager[Any]:
        return contextlib.nullcontext() if self.parameter_dtype is None else super().forward_context()

    def autocast(self, enabled: bool | None = None, cache_enabled: bool | None = None) -> AbstractContextManager[Any]:
        return contextlib.nullcontext() if self.parameter_dtype is None else super().autocast(enabled)

    def uses_autocast(self) -> bool:
        return False  # the casts are FSDP's MixedPrecisionPolicy


class DeepSpeedPrecision(Precision):
    """Mixed precision inside the DeepSpeed engine: the engine keeps the module in bf16 (its optimizer keeps
    float32 master weights) and scales fp16 losses itself, so no autocast and no scaler run here.

    The module's forward casts floating-point inputs to the dtype of the module's parameters (bf16 inside the
    engine, float32 for a module prepared for evaluation only) and returns float32 outputs, so a float32 batch and
    a float32 loss work unchanged (Lightning's DeepSpeed precision does the same). The true modes are refused:
    the engine keeps float32 master weights whatever the module's dtype.
    """

    def __init__(self, mode: str = "no", device: torch.device | None = None) -> None:
        self.refuse_true_precision(normalize_precision(mode))
        super().__init__(mode, device)

    def new_scaler(self) -> torch.amp.GradScaler | None:
        return None  # the engine scales fp16 losses itself

    @staticmethod
    def refuse_true_precision(mode: str) -> None:
        """Raise `ValueError` for a true mode, naming what to use instead."""
        if mode not in TRUE_PRECISION_MODES:
            return
        instead = "'no'" if mode == "fp64-true" else "'bf16' (or 'fp16' on GPUs)"
        raise ValueError(
            f"mixed_precision={mode!r} is not supported by strategy='deepspeed': its engine keeps float32 master weights "
            f"and computes in the low dtype itself; use {instead}, or strategy='fsdp'/'ddp' for true {mode[:-5]} parameters"
        )

    def engine_config(self) -> dict[str, Any]:
        """The ``bf16``/``fp16`` sections of a DeepSpeed config for this mode."""
        return {"bf16": {"enabled": self.mode == "bf16"}, "fp16": {"enabled": self.mode == "fp16"}}

    def convert_module(self, module: nn.Module) -> nn.Module:
        self.in_use = True
        if self.dtype is None:
            return module
        first = next((p for p in module.parameters() if p.is_floating_point()), None)
        fallback = self.dtype

        def dtype() -> torch.dtype:
            return first.dtype if first is not None else fallback  # the engine's bf16, or float32 outside it (evaluation)

        return cast_forward(module, inputs=dtype, outputs=_to_fp32)

    def forward_context(self) -> AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def autocast(self, enabled: bool | None = None, cache_enabled: bool | None = None) -> AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def uses_autocast(self) -> bool:
        return False  # the engine computes in its dtype

    def _configured_scaler(self, kwargs: Mapping[str, Any]) -> torch.amp.GradScaler:
        raise ValueError(
            f"loss-scaler settings {dict(kwargs)!r}: DeepSpeed scales fp16 losses itself; set them in the DeepSpeed config's 'fp16' "
            "section (initial_scale_power, loss_scale_window, hysteresis, min_loss_scale) and drop GradScalerKwargs"
        )


def _to_fp32(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.float() if tensor.dtype in (torch.float16, torch.bfloat16) else tensor


def _to_default_dtype(tensor: torch.Tensor) -> torch.Tensor:
    dtype = torch.get_default_dtype()
    return tensor.to(dtype) if tensor.is_floating_point() and tensor.dtype != dtype else tensor
