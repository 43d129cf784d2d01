"""The model a memory estimate runs: where it comes from, its repeated blocks, its batch and its loss.

A model is given as an `nn.Module` (real or on the meta device), a zero-argument factory, ``"package.module:factory"``,
or a local directory holding a Hugging Face ``config.json``. Every estimate works on a *meta copy* (`meta_copy`): the
caller's module is never touched, and nothing is allocated.

The repeated blocks of a model (`strategies.blocks.find_blocks`, the rule `FSDPStrategy` shards by default) are the
units the estimate checkpoints (activation checkpointing) and shards (FSDP).
"""

from __future__ import annotations

import copy
import importlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from strategies.blocks import Blocks

ModelSource = nn.Module | Callable[[], nn.Module] | str | Path


def load_meta_model(source: ModelSource) -> nn.Module:
    """`source` as a module on the meta device (a Hugging Face config is built there; a factory runs under it)."""
    if isinstance(source, nn.Module):
        return meta_copy(source)
    if isinstance(source, (str, Path)):
        text = str(source)
        if Path(text).is_dir():
            return _from_config_dir(Path(text))
        if ":" in text and not Path(text).exists():
            return _from_factory(_import_factory(text), text)
        raise FileNotFoundError(
            f"model={text!r} is neither a directory holding a Hugging Face config.json nor 'package.module:factory'; "
            "pass a local model directory (e.g. ./llama-70b with its config.json) or a factory such as 'mypkg.models:build'"
        )
    if callable(source):
        return _from_factory(source, getattr(source, "__qualname__", repr(source)))
    raise TypeError(
        f"model={source!r} ({type(source).__name__}) must be an nn.Module, a zero-argument factory returning one, "
        "'package.module:factory', or a directory holding a Hugging Face config.json"
    )


def meta_copy(module: nn.Module) -> nn.Module:
    """A deep copy of `module` whose parameters and buffers are empty meta tensors (tied weights stay tied)."""
    memo: dict[int, Any] = {}
    for tensor in [*module.parameters(), *module.buffers()]:
        if id(tensor) not in memo:
            empty = torch.empty(tensor.shape, dtype=tensor.dtype, device="meta")
            memo[id(tensor)] = nn.Parameter(empty, requires_grad=tensor.requires_grad) if isinstance(tensor, nn.Parameter) else empty
    return copy.deepcopy(module, memo)


def _import_factory(spec: str) -> Callable[[], Any]:
    module_name, _, attr = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise ValueError(f"model={spec!r}: cannot import {attr!r} from {module_name!r} ({err}); pass 'package.module:factory'") from err
    if not callable(factory):
        raise TypeError(f"model={spec!r} names {type(factory).__name__} {factory!r}, not a callable returning an nn.Module")
    return factory  # type: ignore[no-any-return]


def _from_factory(factory: Callable[[], Any], name: str) -> nn.Module:
    with torch.device("meta"):
        built = factory()
    if not isinstance(built, nn.Module):
        raise TypeError(f"the model factory {name} returned {type(built).__name__}, not an nn.Module; return the model itself")
    return meta_copy(built) if _has_real_tensors(built) else built


def _from_config_dir(folder: Path) -> nn.Module:
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"model={str(folder)!r} has no config.json; pass a Hugging Face model directory or 'package.module:factory'")
    try:
        import transformers
    except ImportError as err:
        raise ImportError("a model directory needs the transformers package: pip install transformers") from err
    try:
        config = transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except (ValueError, KeyError, OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{folder / 'config.json'} is not a config transformers can read: {err}") from err
    with torch.device("meta"):
        try:  # a causal LM where the config has one (its loss is the training loss), else the base model
            return transformers.AutoModelForCausalLM.from_config(config)  # type: ignore[no-any-return]
        except ValueError:
            return transformers.AutoModel.from_config(config)  # type: ignore[no-any-return]


def _has_real_tensors(module: nn.Module) -> bool:
    return any(t.device.type != "meta" for t in [*module.parameters(), *module.buffers()])


# the repeated blocks ---------------------------------------------------------------------------------------------


def keep_blocks(model: nn.Module, blocks: Blocks, count: int) -> nn.Module:
    """`model` (a meta copy) with only its first `count` repeated blocks, in place."""
    if blocks.list_name is None:
        return model
    parent_name, _, attr = blocks.list_name.rpartition(".")
    parent = model.get_submodule(parent_name) if parent_name else model
    setattr(parent, attr, nn.ModuleList(list(getattr(parent, attr))[:count]))
    return model


# the batch and the loss ------------------------------------------------------------------------------------------


def is_language_model(model: nn.Module) -> bool:
    """A ``transformers`` model with a vocabulary: its batch is token ids."""
    return isinstance(getattr(getattr(model, "config", None), "vocab_size", None), int)


def make_batch(model: nn.Module, batch_size: int, shape: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """Token ids ``(B, S)`` for a language model, else a float tensor ``(B, *shape)`` (values do not matter here)."""
    if is_language_model(model):
        return torch.zeros((batch_size, *shape), dtype=torch.long, device=device)
    return torch.zeros((batch_size, *shape), device=device)


def compute_loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """A causal-LM loss on the batch as labels (``transformers`` models), else ``model(x).mean()``."""
    if batch.dtype == torch.long:
        return model(input_ids=batch, labels=batch).loss  # type: ignore[no-any-return]
    out = model(batch)
    out = out[0] if isinstance(out, (tuple, list)) else out
    return out.float().mean()  # type: ignore[no-any-return]


def stage_loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """What a stage's trace backpropagates: a loss whose graph holds the stage's output until backward (a pipeline stage
    keeps it until the microbatch's backward), and whose gradient is of the output's size (as the next stage sends it)."""
    out = model(batch)
    out = out[0] if isinstance(out, (tuple, list)) else out
    return (out * out).float().mean()  # type: ignore[no-any-return]
