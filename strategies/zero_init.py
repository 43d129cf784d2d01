"""DeepSpeed ZeRO-3 partitioned construction: a model built inside `partitioned_init` never exists in full.

`deepspeed.zero.Init` patches every ``nn.Module`` class's ``__init__``: when a module's constructor returns, each of
its own parameters (full size for that moment, initialized by the constructor) takes process 0's values and is cut
into one slice per process; the parameter itself keeps an empty ``data`` and carries ``ds_shape``/``ds_numel`` (the
full shape) and ``ds_tensor`` (this process's slice). So a process holds at most one module's full parameters at a
time, plus its slices. Initialization done later through ``module.apply(fn)`` sees the full tensors (zero.Init
gathers them around ``fn``); code that writes another module's parameters directly in a constructor sees the empty
ones, and its values are lost: initialize in each module's own constructor or ``reset_parameters`` instead.

The values equal those of a plain construction with the same seed on process 0 (every process draws the same
numbers, process 0's are kept). A Hugging Face model's ``post_init`` applies ``_init_weights`` through its own
``smart_apply``, which zero.Init does not see, so `partitioned_init` runs it through transformers' ZeRO-3 variant
(parameters gathered, process 0 initializes), as transformers' own ``from_config`` does under DeepSpeed. Import the
model's classes before the block (as a script's imports do): zero.Init patches the classes that exist when it starts.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any

from torch import nn


def is_partitioned(module: nn.Module) -> bool:
    """True when some parameter of `module` was partitioned by `deepspeed.zero.Init` (it has ``ds_id``)."""
    return any(hasattr(p, "ds_id") for p in module.parameters())


@contextlib.contextmanager
def partitioned_init(deepspeed: Any, config: dict[str, Any], precision_context: AbstractContextManager[Any]) -> Iterator[None]:
    """Build models partitioned across the process group (which must exist), as the engine with `config` will train them.

    `config` is a DeepSpeed config: zero.Init takes the parameters' dtype from its ``bf16``/``fp16`` sections and
    their offload device from ``zero_optimization.offload_param``.
    """
    import torch._dynamo  # noqa: F401  # its first import checks torch.Tensor.__new__, which zero.Init replaces: import it before

    with deepspeed.zero.Init(config_dict_or_path=config), precision_context, _hugging_face_init_gathered():
        yield


@contextlib.contextmanager
def _hugging_face_init_gathered() -> Iterator[None]:
    """Make ``PreTrainedModel.initialize_weights`` gather each module's partitioned parameters around ``_init_weights``.

    Without it, ``_init_weights`` writes into the empty partitioned tensors and the layers keep their constructors'
    defaults (an ``nn.Embedding`` N(0, 1) instead of N(0, ``initializer_range``)). Only when transformers is imported
    (a model class cannot be built without it) and has the ZeRO-3 variant (transformers 5).
    """
    if "transformers" not in sys.modules:
        yield
        return
    try:
        from transformers.integrations.deepspeed import initialize_weights_zero3
        from transformers.modeling_utils import PreTrainedModel
    except ImportError:
        yield
        return
    original = PreTrainedModel.initialize_weights

    def initialize_weights(self: Any) -> None:
        if any(hasattr(p, "ds_id") for p in self.parameters()):
            initialize_weights_zero3(self)
        else:
            original(self)

    PreTrainedModel.initialize_weights = initialize_weights  # type: ignore[method-assign]
    try:
        yield
    finally:
        PreTrainedModel.initialize_weights = original  # type: ignore[method-assign]
