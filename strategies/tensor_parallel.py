"""Tensor parallelism: split layers over the ``tp`` dimension of the mesh with torch's `parallelize_module`.

A plan maps submodule names (``*`` matches one name, as in ``"layers.*.mlp.up_proj"``) to torch's parallel styles
(`ColwiseParallel`, `RowwiseParallel`, `SequenceParallel`, ...) or to the names Hugging Face models use in their own
plans (``config.base_model_tp_plan`` and the class's ``_tp_plan``): ``"colwise"``, ``"rowwise"``,
``"colwise_gather_output"`` / ``"colwise_rep"`` (output replicated), ``"rowwise_rep"`` (input replicated),
``"embedding_rowwise"`` (an embedding's vocabulary split over the processes), ``"sequence_parallel"``. `model_plan` reads a `transformers` model's plan, so ``tp > 1`` needs no plan of yours.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Any

from torch import nn

_HF_STYLES = ("colwise", "rowwise", "colwise_gather_output", "colwise_rep", "rowwise_rep", "embedding_rowwise", "sequence_parallel")


def _style(name: str, value: Any) -> Any:
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel, SequenceParallel

    if isinstance(value, ParallelStyle):
        return value
    styles = {
        "colwise": lambda: ColwiseParallel(),
        "rowwise": lambda: RowwiseParallel(),
        "colwise_gather_output": lambda: ColwiseParallel(output_layouts=Replicate()),
        "colwise_rep": lambda: ColwiseParallel(output_layouts=Replicate()),
        "rowwise_rep": lambda: RowwiseParallel(input_layouts=Replicate()),
        "embedding_rowwise": lambda: RowwiseParallel(input_layouts=Replicate()),  # vocabulary split over the processes
        "sequence_parallel": lambda: SequenceParallel(),
    }
    if value not in styles:
        raise ValueError(
            f"tensor-parallel plan entry {name!r}: {value!r} is not a parallel style; use a torch.distributed.tensor.parallel "
            f"style (ColwiseParallel(), RowwiseParallel(), ...) or one of {', '.join(map(repr, _HF_STYLES))}"
        )
    return styles[value]()


def model_plan(model: nn.Module) -> dict[str, Any]:
    """The tensor-parallel plan `transformers` models carry: for the model itself or each one inside it (a `TrainModule`
    holding one as ``self.model``), its base model's ``config.base_model_tp_plan`` (names relative to the base model,
    e.g. ``model.``) and its class's ``_tp_plan`` (e.g. ``lm_head``), prefixed with where it sits. Empty for other models."""
    plan: dict[str, Any] = {}
    taken: list[str] = []
    for name, sub in model.named_modules():
        own_base = getattr(getattr(sub, "config", None), "base_model_tp_plan", None)
        if own_base is None or any(name.startswith(f"{t}.") or not t for t in taken):
            continue  # not a transformers model, or inside one already read
        taken.append(name)
        where = f"{name}." if name else ""
        base = dict(own_base)
        prefix = getattr(sub, "base_model_prefix", "")
        if prefix and hasattr(sub, prefix) and getattr(sub, prefix) is not sub:
            base = {f"{prefix}.{key}": value for key, value in base.items()}
        own = dict(getattr(sub, "_tp_plan", None) or {})
        plan.update({f"{where}{key}": value for key, value in {**base, **own}.items()})
    return plan


def _config_of(model: nn.Module) -> Any:
    """The config of the `transformers` model `model` is or holds (None for others)."""
    for _, sub in model.named_modules():
        if getattr(getattr(sub, "config", None), "base_model_tp_plan", None) is not None:
            return sub.config
    return None


def check_divisible(model: nn.Module, tp: int) -> None:
    """A `transformers` model's attention heads and key/value heads must split evenly over `tp` processes."""
    config = _config_of(model)
    for field in ("num_attention_heads", "num_key_value_heads"):
        heads = getattr(config, field, None)
        if isinstance(heads, int) and heads % tp:
            raise ValueError(f"{type(model).__name__} has {field}={heads}, which tp={tp} does not divide; choose a tp that divides it")


def apply_tensor_parallel(model: nn.Module, tp_mesh: Any, plan: Mapping[str, Any] | None) -> nn.Module:
    """Split `model`'s layers over `tp_mesh` (in place) by `plan`, or by the model's own plan (`model_plan`) when None.

    Raises:
        ValueError: no plan given and the model carries none; a plan entry that names no submodule or is no style.
    """
    from torch.distributed.tensor.parallel import parallelize_module

    given = plan is not None
    plan = dict(plan) if plan is not None else model_plan(model)
    if not plan:
        raise ValueError(
            f"tp={tp_mesh.size()} needs a tensor-parallel plan, and {type(model).__name__} carries none (transformers models "
            "carry config.base_model_tp_plan); pass one, e.g. tp_plan={'layers.*.up': ColwiseParallel(), "
            "'layers.*.down': RowwiseParallel()} (names of submodules, '*' for any one name)"
        )
    check_divisible(model, tp_mesh.size())
    styles = {name: _style(name, value) for name, value in plan.items()}
    if given:
        names = [name for name, _ in model.named_modules()]
        unmatched = [key for key in styles if not any(fnmatch.fnmatchcase(n, key) for n in names)]
        if unmatched:
            raise ValueError(
                f"tensor-parallel plan entries {unmatched} name no submodule of {type(model).__name__}; its submodules are "
                f"named like {names[1:6]}"
            )
    parallelize_module(model, tp_mesh, styles)
    return model
