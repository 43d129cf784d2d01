"""Mixed precision as an object composed into a strategy.

`Precision` owns autocast, loss scaling, unscaling before clipping and the optimizer step, so no call
site branches on ``if scaler:``.
"""

from __future__ import annotations

import contextlib
import functools
from contextlib import AbstractContextManager
from typing import Any

import torch
from torch import nn

from strategies.collectives import apply_to_tensors

_ALIASES = {
    "no": "no", "32": "no", "32-true": "no", "fp32": "no", "float32": "no",
    "fp16": "fp16", "16": "fp16", "16-mixed": "fp16", "float16": "fp16",
    "bf16": "bf16", "bf16-mixed": "bf16", "bfloat16": "bf16",
}
_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


PRECISION_NAMES = tuple(_ALIASES)


def normalize_precision(value: Any) -> str:
    """Map every accepted spelling (``16``, ``"16-mixed"``, ``"bf16-mixed"``, ``"32-true"``, ...) to ``"no"``, ``"fp16"`` or ``"bf16"``."""
    if value is None:
        return "no"
    if isinstance(value, bool):
        raise ValueError(f"mixed_precision={value!r} is not supported; choose one of 'no', 'fp16', 'bf16' (or 32, 16, '16-mixed', 'bf16-mixed')")
    key = str(value).strip().lower()
    if key.startswith("precisiontype."):
        key = key.split(".", 1)[1]
    if key not in _ALIASES:
        raise ValueError(
            f"mixed_precision={value!r} is not supported; choose one of 'no', 'fp16', 'bf16' "
            "(or '32', '16-mixed', 'bf16-mixed')"
        )
    return _ALIASES[key]


def check_precision_supported(mode: str, device: torch.device) -> None:
    """Raise if this hardware cannot run `mode`."""
    if mode == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError(
            f"mixed_precision='bf16' needs a GPU with bfloat16 support, but {torch.cuda.get_device_name(device)} has none; "
            "use mixed_precision='fp16' or 'no'"
        )
    if mode == "fp16" and device.type == "mps" and not hasattr(torch.amp, "GradScaler"):
        raise ValueError("mixed_precision='fp16' on MPS needs a newer torch; use mixed_precision='no'")
    if mode != "no" and device.type not in ("cpu", "cuda", "mps", "xpu", "xla", "hpu", "npu"):
        raise ValueError(f"mixed_precision={mode!r} is not supported on device type {device.type!r}; use mixed_precision='no'")


class Precision:
    """Autocast + (for fp16) dynamic loss scaling for one device."""

    def __init__(self, mode: str = "no", device: torch.device | None = None) -> None:
        self.mode = normalize_precision(mode)
        self.device = torch.device("cpu") if device is None else torch.device(device)
        check_precision_supported(self.mode, self.device)
        self.dtype = _DTYPES.get(self.mode)
        self.scaler: torch.amp.GradScaler | None = None
        if self.mode == "fp16":
            self.scaler = torch.amp.GradScaler(self.device.type)
        self._unscaled: set[int] = set()
        self.step_was_skipped = False

    def convert_module(self, module: nn.Module) -> nn.Module:
        """Make `module`'s forward run under autocast and hand back float32 outputs (once; a no-op in full precision)."""
        if self.dtype is None or getattr(module.forward, "_trainwright_autocast", False):
            return module
        original = module.forward

        @functools.wraps(original)
        def forward(*args: Any, **kwargs: Any) -> Any:
            with self.autocast():
                output = original(*args, **kwargs)
            return apply_to_tensors(_to_fp32, output)

        forward._trainwright_autocast = True  # type: ignore[attr-defined]
        module.forward = forward
        return module

    def forward_context(self) -> AbstractContextManager[Any]:
        """Context the faces enter around a step that runs outside the module's forward (``training_step``)."""
        return self.autocast()

    def autocast(self, enabled: bool = True) -> AbstractContextManager[Any]:
        """Context that runs the enclosed ops in the mixed dtype (a no-op in full precision)."""
        if self.dtype is None or not enabled:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

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
                optimizer.step()
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
    """Mixed precision for FSDP2: parameters all-gathered in the low dtype, gradients reduced in float32.

    The casts are FSDP's own (`MixedPrecisionPolicy`, applied when the strategy shards the module), so no
    autocast runs; ``fp16`` adds a `ShardedGradScaler`, which agrees on skipped steps across ranks.
    """

    def __init__(self, mode: str = "no", device: torch.device | None = None) -> None:
        super().__init__(mode, device)
        if self.mode == "fp16":
            from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

            self.scaler = ShardedGradScaler(self.device.type)

    def mp_policy(self) -> Any:
        """The `MixedPrecisionPolicy` for `fully_shard` (None in full precision)."""
        if self.dtype is None:
            return None
        from torch.distributed.fsdp import MixedPrecisionPolicy

        return MixedPrecisionPolicy(param_dtype=self.dtype, reduce_dtype=torch.float32, output_dtype=torch.float32)

    def convert_module(self, module: nn.Module) -> nn.Module:
        return module

    def forward_context(self) -> AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def autocast(self, enabled: bool = True) -> AbstractContextManager[Any]:
        return contextlib.nullcontext()


class DeepSpeedPrecision(Precision):
    """Mixed precision inside the DeepSpeed engine: the engine keeps the module in bf16 (its optimizer keeps
    float32 master weights) and scales fp16 losses itself, so no autocast and no scaler run here.

    The module's forward casts floating-point inputs to the dtype of the module's parameters (bf16 inside the
    engine, float32 for a module prepared for evaluation only) and returns float32 outputs, so a float32 batch and
    a float32 loss work unchanged (Lightning's DeepSpeed precision does the same).
    """

    def __init__(self, mode: str = "no", device: torch.device | None = None) -> None:
        super().__init__(mode, device)
        self.scaler = None

    def engine_config(self) -> dict[str, Any]:
        """The ``bf16``/``fp16`` sections of a DeepSpeed config for this mode."""
        return {"bf16": {"enabled": self.mode == "bf16"}, "fp16": {"enabled": self.mode == "fp16"}}

    def convert_module(self, module: nn.Module) -> nn.Module:
        if self.dtype is None or getattr(module.forward, "_trainwright_autocast", False):
            return module
        original = module.forward
        first = next((p for p in module.parameters() if p.is_floating_point()), None)

        @functools.wraps(original)
        def forward(*args: Any, **kwargs: Any) -> Any:
            dtype = first.dtype if first is not None else self.dtype  # the engine's bf16, or float32 outside it (evaluation)

            def cast(tensor: torch.Tensor) -> torch.Tensor:
                return tensor.to(dtype) if tensor.is_floating_point() else tensor

            output = original(*apply_to_tensors(cast, args), **apply_to_tensors(cast, kwargs))
            return apply_to_tensors(_to_fp32, output)

        forward._trainwright_autocast = True  # type: ignore[attr-defined]
        module.forward = forward
        return module

    def forward_context(self) -> AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def autocast(self, enabled: bool = True) -> AbstractContextManager[Any]:
        return contextlib.nullcontext()


def _to_fp32(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.float() if tensor.dtype in (torch.float16, torch.bfloat16) else tensor
