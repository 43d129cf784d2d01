"""The Accelerator's models and checkpoints: unwrapped weights, ``save_model``, ``save_state``/``load_state`` (their
work is in `trainer.accelerator.state`) and the objects and hooks they take part in."""

from __future__ import annotations

import os
import warnings
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from strategies.abilities import Engine
from strategies.checkpoint_io import save_model_weights, save_safetensors, torch_save
from strategies.compile import plain_view
from trainer.accelerator import state as accelerator_state
from trainer.accelerator.layout import ProcessLayout
from trainer.accelerator.registry import Prepared

if TYPE_CHECKING:
    from trainer.accelerator.accelerator import Accelerator


class Checkpointing(ProcessLayout):
    """The models-and-checkpoints part of the `Accelerator`."""

    __slots__ = ()
    prepared: Prepared
    _save_state_pre_hooks: OrderedDict[int, Callable[..., None]]
    _load_state_pre_hooks: OrderedDict[int, Callable[..., None]]

    def unwrap_model(self, model: nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True) -> nn.Module:
        """The model without the strategy's wrapper (DDP, DeepSpeed's engine).

        Models are compiled in place here (their ``forward``), so the unwrapped model runs compiled; with
        ``keep_torch_compile=False`` you get a view of it that runs eagerly (the same parameters and buffers; the
        prepared model stays compiled). Parameter names are plain either way. ``keep_fp32_wrapper=False`` gives a
        view without the mixed-precision forward (autocast, float32 outputs), which also runs eagerly; Accelerate
        instead removes that forward from the prepared model itself.
        """
        if not isinstance(model, nn.Module):
            raise TypeError(f"unwrap_model() takes a model (torch.nn.Module), got {type(model).__name__}")
        model = self.strategy.unwrap_module(model)
        if keep_torch_compile and keep_fp32_wrapper:
            return model
        view = plain_view(model)  # eager, and without the precision's forward
        if keep_fp32_wrapper and view is not model:
            self.strategy.precision.convert_module(view)  # the mixed-precision forward back, as prepare() put it
        return view

    def get_state_dict(self, model: nn.Module, unwrap: bool = True) -> dict[str, torch.Tensor]:
        """The model's full state dict (the same on every process; a collective for sharded strategies).

        ``unwrap=False`` (single device and DDP; Accelerate's) keeps the wrapper's key names (``module.``); the
        sharded strategies always give the full unwrapped weights, as in Accelerate.
        """
        if not unwrap and not self.strategy.sharded and not isinstance(self.strategy, Engine):
            return model.state_dict()
        return self.strategy.module_state_dict(model)

    def save(self, obj: Any, f: str | os.PathLike, safe_serialization: bool = False) -> None:
        """Save `obj` on the main process (safetensors for a state dict when ``safe_serialization``)."""
        if not self.is_main_process:
            return
        (save_safetensors if safe_serialization else torch_save)(obj, Path(f))

    def save_model(self, model: nn.Module, save_directory: str | os.PathLike, max_shard_size: int | str = "10GB", safe_serialization: bool = True) -> None:
        """Save the unwrapped weights (safetensors), sharded by `max_shard_size` with an index file."""
        check_path(save_directory, "save_directory")
        state = self.get_state_dict(model)
        if self.is_main_process:
            save_model_weights(state, Path(save_directory), max_shard_size=max_shard_size, safe_serialization=safe_serialization)
        self.wait_for_everyone()

    def register_for_checkpointing(self, *objects: Any) -> None:
        """Save and restore these objects (anything with ``state_dict``/``load_state_dict``) in `save_state`."""
        bad = [o for o in objects if not (hasattr(o, "state_dict") and hasattr(o, "load_state_dict"))]
        if bad:
            raise TypeError(f"objects {bad!r} have no state_dict()/load_state_dict(); only such objects can be registered for checkpointing")
        self.prepared.custom_objects.extend(objects)

    def register_save_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Call ``hook(models, weights, output_dir)`` in `save_state`, on every process, before the weights are written.

        `models` is the list of prepared models, `weights` their state dicts (unwrapped keys) in that order, and
        `output_dir` the directory being written (the hidden staging directory that becomes the checkpoint when the
        save commits): files the hook writes there move with the checkpoint. The hook may change `weights` in place:
        a state dict it removes is not written (save that model yourself, then ``weights.pop()``), and the remaining
        ones are written in order as ``model.safetensors``, ``model_1.safetensors``, ... Under a sharded strategy
        (FSDP, DeepSpeed) `weights` is empty and the strategy writes the weights itself, as in Accelerate.

        Returns:
            A handle; ``handle.remove()`` unregisters the hook.
        """
        return _add_hook(self._save_state_pre_hooks, hook, "register_save_state_pre_hook", "hook(models, weights, output_dir)")

    def register_load_state_pre_hook(self, hook: Callable[..., None]) -> RemovableHandle:
        """Call ``hook(models, input_dir)`` in `load_state`, on every process, before the weights are loaded.

        `models` is a list of the prepared models; a model the hook removes from it is not loaded from the
        checkpoint (load it yourself, then ``models.pop()``), and the remaining ones load, in order, the weights
        files `save_state` wrote (the pair of `register_save_state_pre_hook`). Under a sharded strategy `models` is
        empty, as in Accelerate.

        Returns:
            A handle; ``handle.remove()`` unregisters the hook.
        """
        return _add_hook(self._load_state_pre_hooks, hook, "register_load_state_pre_hook", "hook(models, input_dir)")

    @property
    def save_state_pre_hooks(self) -> list[Callable[..., None]]:
        """The hooks of `register_save_state_pre_hook` not removed, in the order `save_state` calls them."""
        return list(self._save_state_pre_hooks.values())

    @property
    def load_state_pre_hooks(self) -> list[Callable[..., None]]:
        """The hooks of `register_load_state_pre_hook` not removed, in the order `load_state` calls them."""
        return list(self._load_state_pre_hooks.values())

    def save_state(
        self, output_dir: str | os.PathLike | None = None, safe_serialization: bool = True, *, extra_state: dict[str, Any] | None = None,
        async_save: bool = False,
    ) -> Any:
        """Save everything needed to resume exactly; see `trainer.accelerator.state.save_state`. Returns the directory.

        ``async_save=True`` returns as soon as the state is copied out of the training tensors, with a handle
        (``done()``, ``result()`` → the directory) while the files are written in the background; the checkpoint is
        committed (manifest written, directory renamed into place) only once every process's write finished. At most
        one save is in flight: the next save, `load_state` and `end_training` wait for it, and an error of the
        background write is raised there, naming the checkpoint.
        """
        check_path(output_dir, "output_dir")
        if safe_serialization is not True:
            warnings.warn(
                f"save_state(safe_serialization={safe_serialization!r}) changes nothing here: checkpoints always hold "
                "weights as safetensors and other states as tensor-only files, loaded without unpickling objects",
                stacklevel=2,
            )
        return accelerator_state.save_state(cast("Accelerator", self), output_dir, extra_state=extra_state, async_save=async_save)

    def load_state(self, input_dir: str | os.PathLike | None = None, *, strict: bool = True, verify: bool = True, **kwargs: Any) -> dict[str, Any]:
        """Restore what `save_state` wrote; returns its ``extra_state``. No path: the newest automatic checkpoint.

        Every file's name and size is checked against the manifest first, and its hash (xxh3-128 or SHA-256, as the
        manifest says) in the same pass that reads it; ``verify=False`` checks only names and sizes.
        """
        check_path(input_dir, "input_dir")
        return accelerator_state.load_state(cast("Accelerator", self), input_dir, strict=strict, verify=verify, **kwargs)

    def skip_first_batches(self, dataloader: torch.utils.data.DataLoader, num_batches: int = 0) -> Any:
        """A loader that starts `num_batches` into `dataloader`, skipping at the batch-sampler level."""
        from strategies.data import skip_first_batches  # lazy: `import trainer.accelerator` does not load strategies.data

        return skip_first_batches(dataloader, num_batches)


def _add_hook(hooks: OrderedDict[int, Callable[..., None]], hook: Any, method: str, signature: str) -> RemovableHandle:
    """Register `hook` in `hooks` (what `method` does); a handle whose ``remove()`` unregisters it."""
    if not callable(hook):
        raise TypeError(f"{method}(hook={hook!r}) needs a callable {signature}")
    handle = RemovableHandle(hooks)
    hooks[handle.id] = hook
    return handle


def check_path(value: Any, name: str) -> None:
    """A directory argument: None, a str or an os.PathLike."""
    if value is not None and not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name}={value!r} must be a directory path (str or os.PathLike)")
