"""Activation checkpointing by module class: keep only each block's inputs in forward, recompute the rest in backward.

    apply_activation_checkpointing(model, {TransformerBlock})      # any strategy; FSDP2 takes it as an argument

Each chosen submodule's ``forward`` runs under `torch.utils.checkpoint.checkpoint` (non-reentrant). The submodule
itself is not wrapped (unlike torch's ``checkpoint_wrapper``), so parameter names, ``state_dict`` keys, checkpoints
and exports stay the plain ones. With FSDP2 it is applied before `fully_shard` (as torchtitan does): the block's
parameters are gathered by FSDP's hooks around the checkpointed forward, and again before its recomputation.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

from torch import nn
from torch.utils.checkpoint import checkpoint

Policy = Iterable[type[nn.Module] | str] | Callable[[nn.Module], bool]


def check_policy(policy: Any, name: str = "activation_checkpointing_policy") -> Policy | None:
    """`policy` as given (classes, class names, or a ``module -> bool`` function), or an error naming the bad value."""
    if policy is None or policy is False:
        return None
    if isinstance(policy, type) and issubclass(policy, nn.Module):
        return (policy,)
    if callable(policy) and not isinstance(policy, type):
        return policy  # type: ignore[no-any-return]
    if isinstance(policy, (str, bytes)) or not isinstance(policy, Iterable):
        raise TypeError(f"{name}={policy!r} must be module classes (or class names), e.g. {{TransformerBlock}}, or a function module -> bool")
    items = tuple(policy)
    bad = [c for c in items if not (isinstance(c, str) or (isinstance(c, type) and issubclass(c, nn.Module)))]
    if bad:
        raise TypeError(f"{name} must hold nn.Module subclasses or class names, got {bad!r}; e.g. {{TransformerBlock}}")
    return items


def selects(policy: Policy, module: nn.Module) -> bool:
    if callable(policy):
        return bool(policy(module))
    classes = tuple(c for c in policy if isinstance(c, type))
    names = {c for c in policy if isinstance(c, str)}
    return isinstance(module, classes) or type(module).__name__ in names


def apply_activation_checkpointing(model: nn.Module, policy: Policy) -> list[nn.Module]:
    """Checkpoint the forward of every submodule of `model` that `policy` selects (outermost ones only); returns them."""
    checked = check_policy(policy)
    if checked is None:
        return []
    chosen: list[nn.Module] = []
    inside: set[int] = set()
    for sub in model.modules():
        if id(sub) in inside or sub is model or not selects(checked, sub):
            continue
        if checkpointed_function(sub.forward) is None:
            sub.forward = checkpoint_forward(sub.forward)
        chosen.append(sub)
        inside.update(id(m) for m in sub.modules())
    if not chosen:
        raise ValueError(
            f"activation checkpointing policy {policy!r} selects no submodule of {type(model).__name__}; name the classes of its "
            "repeated blocks (e.g. the transformer layer class)"
        )
    return chosen


def checkpoint_forward(forward: Callable[..., Any]) -> Callable[..., Any]:
    """`forward` run under non-reentrant `torch.utils.checkpoint.checkpoint`."""

    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    run._trainwright_checkpointed = forward  # type: ignore[attr-defined]
    return run


def checkpointed_function(forward: Any) -> Callable[..., Any] | None:
    """The function a `checkpoint_forward` wrapper runs, or None when `forward` is not one."""
    return getattr(forward, "_trainwright_checkpointed", None)
