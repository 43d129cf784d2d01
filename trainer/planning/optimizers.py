"""Which optimizer the planner steps: any optimizer, as a user writes it.

    resolve_optimizer("sgd")                                        # torch.optim.SGD with torch's defaults: no momentum
    resolve_optimizer("torch.optim.SGD", {"momentum": 0.9})         # a class path and its keyword arguments
    resolve_optimizer(functools.partial(torch.optim.SGD, momentum=0.9))
    resolve_optimizer(torch.optim.Adagrad)                          # a class, or any callable params -> Optimizer

A short name is a `torch.optim` class's name in lower case (``adamw``, ``sgd``, ``adagrad``, ``rmsprop``, ...) and
means that class with torch's defaults: ``sgd`` keeps no state (torch's SGD has no momentum unless asked for). The
planner runs the optimizer's real ``step()`` on fake tensors, so what it holds is counted as it is, whatever it is.

Where the optimizer has torch's ``foreach`` switch and it was left to torch's choice, the planner picks what torch
picks on the run's device: the batched (foreach) implementation on ``cuda``, one tensor at a time on ``cpu`` (the
trace runs on CPU tensors, where torch would pick the latter). A ``foreach`` or ``fused`` the user set is kept.
"""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import torch
from torch import nn

OptimizerFactory = Callable[..., torch.optim.Optimizer]

# torch.optim classes the planner cannot step as a training loop steps them, and why
_REFUSED = {
    "LBFGS": "steps with a closure that re-evaluates the model several times per step; the planner runs one "
             "forward and backward, then step() without a closure",
    "SparseAdam": "needs sparse gradients (nn.Embedding(sparse=True)); the planner's models produce dense ones",
}


def short_names() -> dict[str, type[torch.optim.Optimizer]]:
    """Every `torch.optim` optimizer class by its lower-case name (``"adamw"`` -> `torch.optim.AdamW`)."""
    return {
        name.lower(): cls for name, cls in vars(torch.optim).items()
        if inspect.isclass(cls) and issubclass(cls, torch.optim.Optimizer) and cls is not torch.optim.Optimizer
    }


@dataclass(frozen=True)
class OptimizerSpec:
    """An optimizer to step: ``factory(params)`` builds it; ``name`` is how the estimate names it."""

    name: str
    factory: OptimizerFactory = field(compare=False)

    def build(self, params: Iterable[nn.Parameter], device: str) -> torch.optim.Optimizer:
        """The optimizer over `params`, its ``foreach`` (where torch would choose) as torch chooses on `device`."""
        try:
            optimizer = self.factory(list(params))
        except ValueError as err:  # e.g. torch's Muon: "only supports 2D parameters"
            raise ValueError(
                f"optimizer={self.name} refused the model's trainable parameters: {err}. The planner passes them all in "
                "one group; for an optimizer of some of them, pass a callable that picks them, e.g. "
                "lambda params: torch.optim.Muon([p for p in params if p.ndim == 2])"
            ) from err
        for group in optimizer.param_groups:
            if "foreach" in group and group["foreach"] is None and not group.get("fused"):
                group["foreach"] = device == "cuda"
        return optimizer


# what a user passes: a short name or class path, an Optimizer class, a callable params -> Optimizer, or a resolved spec
OptimizerLike: TypeAlias = "str | type[torch.optim.Optimizer] | OptimizerFactory | OptimizerSpec"


def resolve_optimizer(optimizer: OptimizerLike, kwargs: Mapping[str, Any] | None = None) -> OptimizerSpec:
    """`optimizer` (a short name, a class path ``"torch.optim.SGD"`` / ``"package.module:Class"``, an Optimizer class,
    or a callable params -> Optimizer such as ``functools.partial(SGD, momentum=0.9)``), with `kwargs` bound to it."""
    if isinstance(optimizer, OptimizerSpec):
        if kwargs:
            raise ValueError(f"optimizer_kwargs={dict(kwargs)!r} with an already resolved optimizer {optimizer.name}; "
                             "pass the optimizer class or name with its keyword arguments instead")
        return optimizer
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise TypeError(f"optimizer_kwargs={kwargs!r} must be a dict of keyword arguments, e.g. {{'momentum': 0.9}}")
    factory, name = _factory(optimizer)
    base = factory
    while isinstance(base, functools.partial):
        base = base.func
    refused = _REFUSED.get(getattr(base, "__name__", ""))
    if refused and base is getattr(torch.optim, getattr(base, "__name__", ""), None):
        raise ValueError(f"optimizer={name}: the planner cannot estimate torch.optim.{base.__name__}: it {refused}")
    if kwargs:
        bound = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        factory, name = functools.partial(factory, **kwargs), f"{name}({bound})"
    _check_builds(factory, name)
    return OptimizerSpec(name=name, factory=factory)


def _check_builds(factory: OptimizerFactory, name: str) -> None:
    """Build it once over one small real parameter, so a wrong keyword argument is named now, not inside the trace."""
    try:
        built = factory([nn.Parameter(torch.zeros(2, 2))])
    except (TypeError, ValueError) as err:
        raise type(err)(f"optimizer={name} cannot be built: {err}; check its keyword arguments (optimizer_kwargs) against "
                        "the optimizer's signature") from err
    if not isinstance(built, torch.optim.Optimizer):
        raise TypeError(f"optimizer={name}: calling it with the parameters returned {type(built).__name__}, not a "
                        "torch.optim.Optimizer; pass an Optimizer class, its path, or a callable params -> Optimizer")


def _factory(optimizer: object) -> tuple[OptimizerFactory, str]:
    if isinstance(optimizer, str):
        names = short_names()
        if optimizer in names:
            return names[optimizer], optimizer
        if "." in optimizer or ":" in optimizer:
            return _import(optimizer), optimizer
        raise ValueError(
            f"optimizer={optimizer!r} is not a torch.optim short name ({', '.join(sorted(names))}) nor a class path; "
            "write e.g. 'sgd', 'torch.optim.SGD' or 'mypkg.optim:Lion'"
        )
    if inspect.isclass(optimizer) and issubclass(optimizer, torch.optim.Optimizer):
        return optimizer, f"{optimizer.__module__}.{optimizer.__qualname__}"
    if callable(optimizer):
        return optimizer, _callable_name(optimizer)
    raise TypeError(
        f"optimizer={optimizer!r} must be a torch.optim short name ('adamw', 'sgd', ...), a class path "
        "('torch.optim.SGD'), an Optimizer class, or a callable params -> Optimizer (functools.partial(SGD, momentum=0.9))"
    )


def _import(path: str) -> OptimizerFactory:
    module_name, _, attribute = path.partition(":") if ":" in path else path.rpartition(".")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"optimizer={path!r} could not be imported ({err}); write 'package.module.Class' or "
                         "'package.module:Class', e.g. 'torch.optim.SGD'") from None
    if not callable(target):
        raise TypeError(f"optimizer={path!r} is a {type(target).__name__}, not an Optimizer class or factory")
    return target  # type: ignore[no-any-return]


def _callable_name(factory: Any) -> str:
    if isinstance(factory, functools.partial):
        bound = ", ".join([*(repr(a) for a in factory.args), *(f"{k}={v!r}" for k, v in factory.keywords.items())])
        return f"{_callable_name(factory.func)}({bound})"
    module, name = getattr(factory, "__module__", None), getattr(factory, "__qualname__", None)
    return f"{module}.{name}" if module and name else repr(factory)


def parse_kwargs(pairs: Iterable[str]) -> dict[str, Any]:
    """``["momentum=0.9", "nesterov=True", "betas=(0.9, 0.95)"]`` as keyword arguments (Python literals; anything
    else a string)."""
    import ast

    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep or not key.strip().isidentifier():
            raise ValueError(f"optimizer kwarg {pair!r} is not KEY=VALUE; write e.g. momentum=0.9 nesterov=True")
        try:
            out[key.strip()] = ast.literal_eval(text.strip())
        except (ValueError, SyntaxError):
            out[key.strip()] = text.strip()
    return out
