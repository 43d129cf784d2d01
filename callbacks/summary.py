"""`ModelSummary`: a table of the module's layers and parameter counts, printed at fit start."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from callbacks.base import Callback
from strategies.base import user_class

if TYPE_CHECKING:
    from callbacks.view import TrainerView
    from trainer.fit.module import TrainModule


@dataclass
class LayerRow:
    """One row of the summary table."""

    name: str
    type: str
    params: int


@dataclass
class Summary:
    """The parameter counts of a module and its layers up to some depth."""

    layers: list[LayerRow] = field(default_factory=list)
    total_params: int = 0
    trainable_params: int = 0
    size_bytes: int = 0

    @property
    def non_trainable_params(self) -> int:
        return self.total_params - self.trainable_params

    @property
    def size_mb(self) -> float:
        """Memory taken by parameters and buffers, in megabytes (10**6 bytes)."""
        return self.size_bytes / 1e6

    def __str__(self) -> str:
        return format_summary(self)


def _numel(tensor: torch.Tensor) -> int:
    """Elements of a tensor (the full count of a DeepSpeed ZeRO-3 partitioned one); 0 for a lazy parameter without a shape yet."""
    if isinstance(tensor, torch.nn.parameter.UninitializedParameter):
        return 0
    full = getattr(tensor, "ds_numel", None)
    return full if isinstance(full, int) else tensor.numel()


def summarize(module: torch.nn.Module, max_depth: int = 1) -> Summary:
    """Count the parameters of ``module`` and of its submodules up to ``max_depth`` levels deep.

    Shared (tied) parameters are counted once. ``max_depth=-1`` lists every submodule, ``0`` none.

    Args:
        module: the model to describe.
        max_depth: how many levels of submodules get a row.

    Returns:
        A `Summary`; ``str()`` of it is the printed table.
    """
    summary = Summary()
    for _, parameter in module.named_parameters():
        count = _numel(parameter)
        summary.total_params += count
        summary.size_bytes += count * parameter.element_size()
        if parameter.requires_grad:
            summary.trainable_params += count
    for _, buffer in module.named_buffers():
        summary.size_bytes += _numel(buffer) * buffer.element_size()
    if max_depth == 0:
        return summary
    for name, submodule in module.named_modules():
        depth = name.count(".") + 1
        if not name or (max_depth > 0 and depth > max_depth):
            continue
        params = sum(_numel(p) for p in submodule.parameters())
        summary.layers.append(LayerRow(name=name, type=user_class(submodule).__name__, params=params))
    return summary


def format_count(count: int) -> str:
    """``1234`` → ``'1.2 K'``, ``3_400_000`` → ``'3.4 M'``; below a thousand the plain number."""
    for divisor, suffix in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "K")):
        if count >= divisor:
            return f"{count / divisor:.1f} {suffix}"
    return str(count)


def format_summary(summary: Summary) -> str:
    """Render a `Summary` as a text table followed by the totals."""
    lines = []
    if summary.layers:
        rows = [("", "Name", "Type", "Params")]
        rows += [(str(i), r.name, r.type, format_count(r.params)) for i, r in enumerate(summary.layers)]
        widths = [max(len(row[col]) for row in rows) for col in range(4)]
        rendered = [" | ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]
        rule = "-" * max(len(line) for line in rendered)
        lines += [rendered[0], rule, *rendered[1:], rule]
    lines += [
        f"{format_count(summary.trainable_params):<10} Trainable params",
        f"{format_count(summary.non_trainable_params):<10} Non-trainable params",
        f"{format_count(summary.total_params):<10} Total params",
        f"{summary.size_mb:<10.3f} Total estimated model params size (MB)",
    ]
    return "\n".join(lines)


class ModelSummary(Callback):
    """Print a table of the module's layers (name, type, parameters) and totals when ``fit`` starts.

    Printed once, on the global main process. The Trainer adds this callback by default
    (``enable_model_summary=True``); pass your own instance to change ``max_depth``.

    Args:
        max_depth: levels of submodules listed (``1``: direct children; ``-1``: all; ``0``: totals only).

    Raises:
        ValueError: ``max_depth`` is not an integer >= -1.

    Example::

        trainer = Trainer(callbacks=[ModelSummary(max_depth=2)])
    """

    def __init__(self, max_depth: int = 1) -> None:
        if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < -1:
            raise ValueError(
                f"ModelSummary(max_depth={max_depth!r}) is invalid; pass an integer: 1 for direct "
                "children, a larger number for deeper layers, -1 for every layer, 0 for totals only."
            )
        self.max_depth = max_depth
        self.summary: Summary | None = None

    def on_fit_start(self, trainer: TrainerView, module: TrainModule) -> None:
        if not trainer.is_global_zero:
            return
        self.summary = summarize(module, self.max_depth)
        print(format_summary(self.summary), flush=True)
