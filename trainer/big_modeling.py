"""Building models too large for one process: Accelerate's ``init_empty_weights`` and ``init_on_device``.

    with init_empty_weights():
        model = LlamaForCausalLM(config)        # shapes only: no memory, no initialization
    model, optimizer = accelerator.prepare(model, optimizer)   # sharded, then each process initializes its shards

A model left on the meta device is made real by `prepare` (every strategy; see `strategies.materialize`): a
sharding strategy allocates and initializes only each process's shards. ``Accelerator.init_module()`` (and the
Trainer's ``init_module()``) pick the right context for the strategy instead.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn


@contextlib.contextmanager
def init_on_device(device: torch.device | str, include_buffers: bool | None = None) -> Iterator[None]:
    """Create the parameters (and with ``include_buffers``, the buffers) of modules built in the block on `device`.

    Accelerate's semantics: by default only parameters move (buffers are created as the code asks, e.g. on the CPU),
    so buffers computed in ``__init__`` keep their values.
    """
    device = torch.device(device)
    if include_buffers:
        with device:
            yield
        return
    original = nn.Module.register_parameter

    def register_parameter(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original(module, name, param)
        if param is not None:
            kwargs: dict[str, Any] = dict(vars(param)) if type(param) is not nn.Parameter else {}
            moved = type(param)(param.to(device), **kwargs) if kwargs else nn.Parameter(param.to(device), requires_grad=param.requires_grad)
            module._parameters[name] = moved

    nn.Module.register_parameter = register_parameter  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]


def init_empty_weights(include_buffers: bool | None = None) -> contextlib.AbstractContextManager[None]:
    """Build modules on the meta device: shapes without memory or initialization (Accelerate's ``init_empty_weights``).

    ``include_buffers=True`` puts buffers on the meta device too (they are then initialized by the modules'
    ``reset_parameters()`` / a Hugging Face model's ``_init_weights`` when materialized, or must be loaded).
    """
    return init_on_device(torch.device("meta"), include_buffers=include_buffers)
