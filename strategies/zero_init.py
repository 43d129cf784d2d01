"""DeepSpeed ZeRO-3 partitioned construction: a model built inside `partitioned_init` never exists in full.

`deepspeed.zero.Init` patches every ``nn.Module`` class's ``__init__``: when a module's constructor returns, each of
its own parameters (full size for that moment, initialized by the constructor) takes process 0's values and is cut
into one slice per process; the parameter itself keeps an empty ``data`` and carries ``ds_shape``/``ds_numel`` (the
full shape) and ``ds_tensor`` (this process's slice). So a process holds at most one module's full parameters at a
time, plus its slices. Initialization done later through ``module.apply(fn)`` sees the full tensors (zero.Init
gathers them around ``fn``); code that writes another module's parameters directly in a constructor sees the empty
ones, and its values are lost: initialize in each module's own constructor or ``reset_parameters`` instead.

The values equal those of a plain construction with the same seed on process 0 (every process draws the same
numbers, process 0's are kept). For Hugging Face models `partitioned_init` also does what transformers does under
Accelerate's ``HfDeepSpeedConfig``: ``from_pretrained`` loads the checkpoint into the partitions (process 0 reads
it) and ``from_config`` initializes on gathered parameters. A model built by its constructor would get its
``_init_weights`` through transformers' own ``smart_apply``, which zero.Init does not see (it would write into the
empty partitioned tensors and leave the layers' defaults, e.g. N(0, 1) embeddings instead of N(0,
``initializer_range``)), so it runs through transformers' ZeRO-3 variant (parameters gathered, process 0
initializes). Import the model's classes before the block (as a script's imports do): zero.Init patches the classes
that exist when it starts.
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

    with deepspeed.zero.Init(config_dict_or_path=config), precision_context, _hugging_face_zero3(config):
        yield


class _Zero3Config:
    """What transformers asks of Accelerate's ``HfDeepSpeedConfig`` (``is_zero3()``, ``config``)."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config

    def is_zero3(self) -> bool:
        return True


@contextlib.contextmanager
def _hugging_face_zero3(config: dict[str, Any]) -> Iterator[None]:
    """Tell transformers ZeRO-3 is on (as ``HfDeepSpeedConfig`` does; one already set is kept), and make
    ``PreTrainedModel.initialize_weights`` run ``_init_weights`` on gathered parameters.

    Only when transformers is imported (a model class cannot be built without it) and has its ZeRO-3 initialization
    (transformers 5).
    """
    if "transformers" not in sys.modules:
        yield
        return
    try:
        from transformers.integrations import deepspeed as hf_deepspeed
        from transformers.modeling_utils import PreTrainedModel
    except ImportError:
        yield
        return
    initialize_zero3 = getattr(hf_deepspeed, "initialize_weights_zero3", None)
    if initialize_zero3 is None:
        yield
        return
    original = PreTrainedModel.initialize_weights

    def initialize_weights(self: Any) -> None:
        if any(hasattr(p, "ds_id") for p in self.parameters()):
            initialize_zero3(self)
        else:
            original(self)

    announced = _Zero3Config(config) if hf_deepspeed.deepspeed_config() is None else None
    if announced is not None:
        hf_deepspeed.set_hf_deepspeed_config(announced)  # a weak reference: `announced` lives until the block ends
    PreTrainedModel.initialize_weights = initialize_weights  # type: ignore[method-assign]
    try:
        yield
    finally:
        PreTrainedModel.initialize_weights = original  # type: ignore[method-assign]
        if announced is not None:
            hf_deepspeed.unset_hf_deepspeed_config()
