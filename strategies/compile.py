"""`torch.compile` applied after a strategy set the model up (sharded, activation-checkpointed), whole or per block.

    apply_compile(model, CompileConfig(backend="inductor", regional=True))

Only ``forward`` functions are compiled, in place: a strategy's hooks around them (FSDP2's all-gathers, DDP's
reducer) stay eager, and parameter names and ``state_dict`` keys stay plain. ``regional=True`` compiles each
repeated block (every child of an ``nn.ModuleList`` whose children share one class, e.g. transformer layers)
instead of the whole forward: one graph per block class, compiled once and reused, as torchtitan does.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from strategies.activation_checkpointing import checkpointed_function


@dataclass
class CompileConfig:
    """What `torch.compile` is asked for (the fields of Accelerate's ``TorchDynamoPlugin``)."""

    backend: str | Callable[..., Any] = "inductor"
    mode: str | None = None
    fullgraph: bool = False
    dynamic: bool | None = None
    options: dict[str, Any] = field(default_factory=dict)
    regional: bool = False

    def __post_init__(self) -> None:
        if not (callable(self.backend) or (isinstance(self.backend, str) and self.backend)):
            raise ValueError(f"compile backend={self.backend!r} must be a torch.compile backend name (e.g. 'inductor') or a callable")
        modes = (None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
        if self.mode not in modes:
            raise ValueError(f"compile mode={self.mode!r} is not a torch.compile mode; choose one of {modes}")

    def kwargs(self) -> dict[str, Any]:
        out: dict[str, Any] = {"backend": self.backend, "fullgraph": self.fullgraph, "dynamic": self.dynamic}
        if self.mode not in (None, "default"):
            out["mode"] = self.mode
        if self.options:
            out["options"] = dict(self.options)
        return out


def apply_compile(model: nn.Module, config: CompileConfig) -> list[nn.Module]:
    """Compile `model`'s forward, or each repeated block's with ``config.regional``; returns the modules compiled."""
    import torch

    targets = repeated_blocks(model) if config.regional else [model]
    if config.regional and not targets:
        raise ValueError(
            f"regional compilation found no repeated blocks in {type(model).__name__} (children of an nn.ModuleList sharing one "
            "class); compile the whole model (use_regional_compilation=False)"
        )
    for module in targets:
        if not getattr(module.forward, "_trainwright_compiled", False):
            module.forward = _compiled(module.forward, lambda fn: torch.compile(fn, **config.kwargs()))
    return targets


def _compiled(forward: Callable[..., Any], compile_fn: Callable[[Callable[..., Any]], Any]) -> Callable[..., Any]:
    """`forward` compiled. An activation-checkpointed forward is compiled whole: dynamo traces the checkpoint (a
    higher-order op) and the block inside it, with side effects in the block (Hugging Face layers set a context
    variable) allowed and not replayed by the recomputation; without that, dynamo would run such a block eagerly.
    """
    compiled = compile_fn(forward)
    if checkpointed_function(forward) is None:
        compiled._trainwright_compiled = True
        return compiled  # type: ignore[no-any-return]
    import torch._dynamo

    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        with torch._dynamo.config.patch(skip_fwd_side_effects_in_bwd_under_checkpoint=True):
            return compiled(*args, **kwargs)

    run._trainwright_compiled = True  # type: ignore[attr-defined]
    return run


def recompile_with(model: nn.Module, dynamo_ctx: Any) -> None:
    """Apply the compile of a ``torch.compile(model)`` wrapper (its ``dynamo_ctx``) to `model`'s own forward."""
    if not getattr(model.forward, "_trainwright_compiled", False):
        model.forward = _compiled(model.forward, dynamo_ctx)


def unwrap_compiled(model: nn.Module) -> tuple[Any, Any]:
    """``(module, dynamo_ctx)`` of a ``torch.compile(module)`` wrapper; ``(model, None)`` for anything else."""
    original = getattr(model, "_orig_mod", None)
    if isinstance(original, nn.Module) and hasattr(model, "dynamo_ctx"):
        return original, model.dynamo_ctx
    return model, None


_FORWARD_MARKS = ("_trainwright_compiled", "_trainwright_autocast")


def plain_view(model: nn.Module) -> nn.Module:
    """`model` as its class's eager forward runs it: the forwards this project replaced in place (compiled, here, or
    wrapped for mixed precision by `strategies.precision.cast_forward`) are left out, in `model` and every submodule.

    A view, not a copy: shallow copies of the modules on the way to a replaced forward, sharing every parameter,
    buffer and untouched submodule with `model`, which keeps running as before. `model` itself when nothing was replaced.
    """
    if not any(_marked(m) for m in model.modules()):
        return model
    view = type(model).__new__(type(model))
    view.__dict__ = dict(model.__dict__)
    if _marked(model):
        del view.__dict__["forward"]
    children = dict(model._modules)
    for name, child in children.items():
        if child is not None:
            children[name] = plain_view(child)
    view.__dict__["_modules"] = children
    return view


def _marked(module: nn.Module) -> bool:
    forward = module.__dict__.get("forward")
    return forward is not None and any(getattr(forward, mark, False) for mark in _FORWARD_MARKS)


def repeated_blocks(model: nn.Module) -> list[nn.Module]:
    """The children of every ``nn.ModuleList`` in `model` whose children all share one class (outermost lists only)."""
    blocks: list[nn.Module] = []
    inside: set[int] = set()
    for sub in model.modules():
        if id(sub) in inside or not isinstance(sub, nn.ModuleList) or len(sub) == 0:
            continue
        if len({type(child) for child in sub}) == 1:
            blocks.extend(sub)
            inside.update(id(m) for m in sub.modules())
    return blocks
