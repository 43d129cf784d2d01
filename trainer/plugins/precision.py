"""``lightning.pytorch.plugins.precision`` under the rename: the precision objects of `strategies.precision`, with
Lightning's constructors (``MixedPrecision("16-mixed", "cuda")``, ``HalfPrecision("bf16-true")``, ``DoublePrecision()``).

A strategy builds its own precision from ``Trainer(precision=...)``; these objects say the same thing in Lightning's
words (``Trainer(plugins=[MixedPrecision("bf16-mixed", "cuda")])`` is ``Trainer(precision="bf16-mixed")``).
"""

from __future__ import annotations

import torch

from strategies.precision import DeepSpeedPrecision, FSDPPrecision, Precision
from trainer.lightning_api import not_offered

_MIXED = ("16-mixed", "bf16-mixed")
_HALF = ("16-true", "bf16-true")


class MixedPrecision(Precision):
    """Lightning's ``MixedPrecision(precision, device, scaler=None)``: autocast in ``"16-mixed"`` (with loss scaling:
    `scaler`, or a new ``torch.amp.GradScaler``) or ``"bf16-mixed"`` on `device`."""

    def __init__(self, precision: str, device: str, scaler: torch.amp.GradScaler | None = None) -> None:
        if precision not in _MIXED:
            raise ValueError(f"MixedPrecision(precision={precision!r}): choose one of {_MIXED}; the true modes are HalfPrecision")
        if scaler is not None and precision == "bf16-mixed":
            raise ValueError("MixedPrecision('bf16-mixed', scaler=...): bf16 needs no loss scaler; pass scaler=None")
        super().__init__(precision, torch.device(device), scaler=scaler)  # in its settings: the Trainer's strategy uses it too


class HalfPrecision(Precision):
    """Lightning's ``HalfPrecision(precision="16-true")``: parameters, inputs and computation in float16 (or bfloat16)."""

    def __init__(self, precision: str = "16-true") -> None:
        if precision not in _HALF:
            raise ValueError(f"HalfPrecision(precision={precision!r}): choose one of {_HALF}")
        super().__init__(precision)


class DoublePrecision(Precision):
    """Lightning's ``DoublePrecision()``: parameters, inputs and computation in float64 (``"64-true"``)."""

    def __init__(self) -> None:
        super().__init__("64-true")


_MODULE = "lightning.pytorch.plugins.precision"
XLAPrecision = not_offered("XLAPrecision", _MODULE, "pass Trainer(strategy='xla', precision=...)", module=__name__)
BitsandbytesPrecision = not_offered(
    "BitsandbytesPrecision", _MODULE, "quantized training is not offered; quantize the model yourself (bitsandbytes) before fit",
    module=__name__,
)
TransformerEnginePrecision = not_offered(
    "TransformerEnginePrecision", _MODULE, "fp8 through Transformer Engine is not offered; use precision='bf16-mixed'", module=__name__,
)

__all__ = [
    "BitsandbytesPrecision", "DeepSpeedPrecision", "DoublePrecision", "FSDPPrecision", "HalfPrecision", "MixedPrecision",
    "Precision", "TransformerEnginePrecision", "XLAPrecision",
]
