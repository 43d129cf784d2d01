"""Convert a checkpoint file written by Lightning (``*.ckpt``) into a checkpoint directory of this Trainer.

    trainer convert-checkpoint epoch=9-step=500.ckpt converted/
    # or: trainer.convert_lightning_checkpoint("epoch=9-step=500.ckpt", "converted")

then ``Trainer.fit(module, ckpt_path="converted")`` resumes the run (weights, optimizers, schedulers, epoch,
global_step) and ``MyModule.load_from_checkpoint("converted")`` rebuilds the module from its hyperparameters.

The file is read with ``torch.load(weights_only=True)``: tensors and plain containers only, plus the few classes
Lightning puts in its checkpoints (`ALLOWED_GLOBALS`, rebuilt as plain data). Any other class in the file is refused
by name before anything is unpickled, so converting a file never runs code from it.

What carries over, from the file's keys: ``state_dict`` → ``model.safetensors``; ``optimizer_states`` →
``optimizer.bin``, ...; ``lr_schedulers`` → ``scheduler.bin``, ...; ``hyper_parameters`` → ``hparams.json``;
``epoch``, ``global_step`` and ``loops.fit_loop`` → the loop position (a checkpoint written at an epoch's end resumes at
the next epoch's start, as in Lightning; one written inside an epoch resumes after the batches it had run). Left out,
and listed in what `convert_lightning_checkpoint` returns: callback states (their keys and file paths are
Lightning's), the precision plugin's state (a fresh gradient scaler calibrates itself in a few steps), a datamodule's
state, and the RNG states (Lightning saves none; the resumed run keeps the generator the script seeded).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from strategies import checkpoint_io as io
from strategies import checkpoint_store as store
from strategies.checkpoint_formats import dedupe_shared_tensors

__all__ = ["ALLOWED_GLOBALS", "convert_lightning_checkpoint", "not_converted"]


# The classes a Lightning checkpoint may hold besides tensors and builtin containers, each rebuilt as plain data.
# Lightning's ``AttributeDict`` (saved hyperparameters) is read back as the plain dict it is.
ALLOWED_GLOBALS: dict[str, Any] = {
    "lightning.fabric.utilities.data.AttributeDict": dict,
    "lightning_fabric.utilities.data.AttributeDict": dict,
    "lightning.pytorch.utilities.parsing.AttributeDict": dict,
    "pytorch_lightning.utilities.parsing.AttributeDict": dict,
    "argparse.Namespace": argparse.Namespace,
    "pathlib.PosixPath": pathlib.PosixPath,
    "pathlib.PurePosixPath": pathlib.PurePosixPath,
    "pathlib.WindowsPath": pathlib.PureWindowsPath,
    "pathlib.PureWindowsPath": pathlib.PureWindowsPath,
    "datetime.timedelta": timedelta,
}


def not_converted(path: Path) -> ValueError:
    """The error for a Lightning ``.ckpt`` file given where a checkpoint directory is expected."""
    return ValueError(
        f"{str(path)!r} is a file, a Lightning checkpoint; checkpoints here are directories, so convert it first: "
        f"`trainer convert-checkpoint {path} {path.with_suffix('')}` (or trainer.convert_lightning_checkpoint(src, dst)), "
        f"then pass {str(path.with_suffix(''))!r}"
    )


def read_lightning_checkpoint(src: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a Lightning ``.ckpt`` file safely (``torch.load(weights_only=True)`` with `ALLOWED_GLOBALS`).

    Raises:
        FileNotFoundError: `src` is not a file.
        ValueError: the file holds a class outside `ALLOWED_GLOBALS` (named), or is not a Lightning checkpoint.
    """
    path = Path(src)
    if not path.is_file():
        raise FileNotFoundError(f"{str(path)!r} is not a file; pass the path of a Lightning .ckpt file")
    try:
        found = torch.serialization.get_unsafe_globals_in_checkpoint(str(path))
    except (RuntimeError, ValueError, OSError) as err:
        raise ValueError(f"{str(path)!r} is not a checkpoint torch.save wrote in its zip format (Lightning's): {err}") from err
    refused = sorted(name for name in found if name not in ALLOWED_GLOBALS and not _numpy_data(name))
    if refused:
        raise ValueError(
            f"{str(path)!r} holds {', '.join(refused)}, which the converter does not unpickle (it rebuilds only tensors, "
            f"containers and {', '.join(sorted(ALLOWED_GLOBALS))}): unpickling an arbitrary class can run code. Load the file "
            "where you trust it and save the parts as plain data (e.g. hyper_parameters as a dict of numbers and strings)"
        )
    allowed: list[Callable[..., Any] | tuple[Callable[..., Any], str]]
    allowed = [(ALLOWED_GLOBALS[name], name) for name in found if name in ALLOWED_GLOBALS]
    allowed += [(_numpy_global(name), name) for name in found if _numpy_data(name)]
    with torch.serialization.safe_globals(allowed):
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("state_dict"), dict):
        raise ValueError(f"{str(path)!r} has no 'state_dict' entry, so it is not a Lightning checkpoint (keys: "
                         f"{sorted(checkpoint) if isinstance(checkpoint, dict) else type(checkpoint).__name__})")
    return checkpoint


_NUMPY_DATA = ("numpy.core.multiarray.scalar", "numpy._core.multiarray.scalar", "numpy.dtype")


def _numpy_data(name: str) -> bool:
    """NumPy scalars and their dtypes (a metric or hyperparameter logged as a NumPy number)."""
    return name in _NUMPY_DATA or (name.startswith("numpy.dtypes.") and name.endswith("DType"))


def _numpy_global(name: str) -> Any:
    import importlib

    module, _, attr = name.rpartition(".")
    return getattr(importlib.import_module(module), attr)


def convert_lightning_checkpoint(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> dict[str, Any]:
    """Convert the Lightning checkpoint file `src` into the checkpoint directory `dst` (written atomically).

    Args:
        src: a ``.ckpt`` file written by Lightning (``Trainer.save_checkpoint`` or ``ModelCheckpoint``).
        dst: the checkpoint directory to create (an existing checkpoint there is replaced once the new one is complete).

    Returns:
        What was converted: ``{"path", "epoch", "global_step", "optimizers", "schedulers", "weights_only", "left_out"}``
        (``left_out``: the file's entries not carried over, see the module docstring).

    Raises:
        FileNotFoundError: `src` does not exist.
        ValueError: `src` holds a class the converter does not unpickle, or is not a Lightning checkpoint; or `dst`
            exists and is not a checkpoint directory (it is never replaced), or ends in ``.ckpt``.
    """
    checkpoint = read_lightning_checkpoint(src)
    target = Path(dst).absolute()
    if target.suffix == ".ckpt":
        raise ValueError(f"convert_lightning_checkpoint(dst={str(dst)!r}): the destination is a checkpoint directory; name it "
                         f"without .ckpt (e.g. {str(target.with_suffix(''))!r}), since loaders here take a .ckpt file for Lightning's")
    if target.exists() and not io.is_complete(target):
        raise ValueError(f"convert_lightning_checkpoint(dst={str(dst)!r}) exists and is not a checkpoint directory, which the "
                         "converted checkpoint would replace; pass a new directory (or an earlier checkpoint to overwrite)")
    weights = _weights(checkpoint["state_dict"], Path(src))
    optimizers, schedulers = list(checkpoint.get("optimizer_states") or []), list(checkpoint.get("lr_schedulers") or [])
    weights_only = "optimizer_states" not in checkpoint
    hparams = _json_hparams(dict(checkpoint.get("hyper_parameters") or {}), Path(src))
    epoch, global_step = int(checkpoint.get("epoch", 0)), int(checkpoint.get("global_step", 0))
    progress = _loop_progress(checkpoint, epoch, global_step)
    trainer_state = {"format_version": io.FORMAT_VERSION, "epoch": progress["epoch"], "global_step": global_step,
                     "loops": {"fit_loop": progress}, "callbacks": {}, "hyper_parameters": hparams, "callback_metrics": {}}
    writer = io.CheckpointWriter(target)
    writer.clear_staging()
    try:
        writer.save_safetensors(store.model_file(0), weights)
        writer.save_json(store.HPARAMS, hparams)
        if not weights_only:
            for i, state in enumerate(optimizers):
                writer.save_torch(store.optimizer_file(i), state)
            for i, state in enumerate(schedulers):
                writer.save_torch(store.scheduler_file(i), state)
            writer.save_json(store.DATALOADERS, {"dataloaders": [], "step": 0})  # at an accumulation boundary
            writer.save_json(store.EXTRA_STATE, trainer_state)
        meta: dict[str, Any] = {
            "num_processes": 1, "world_size": 1, "sharded": False, "models": 1, "optimizers": len(optimizers),
            "schedulers": len(schedulers), "created": time.time(), "global_step": global_step, "epoch": epoch,
            "rng_states": False, "converted_from": f"lightning {checkpoint.get('pytorch-lightning_version', '?')}",
        }
        if weights_only:
            meta.update(kind=store.WEIGHTS_ONLY, optimizers=0, schedulers=0)
        writer.commit(meta)
    except BaseException:
        import shutil

        shutil.rmtree(writer.staging, ignore_errors=True)
        raise
    known = {"state_dict", "optimizer_states", "lr_schedulers", "hyper_parameters", "epoch", "global_step", "loops",
             "pytorch-lightning_version", "hparams_name"}
    return {"path": str(target), "epoch": progress["epoch"], "global_step": global_step, "optimizers": len(optimizers),
            "schedulers": len(schedulers), "weights_only": weights_only, "left_out": sorted(k for k in checkpoint if k not in known)}


def _weights(state: dict[str, Any], src: Path) -> dict[str, torch.Tensor]:
    bad = sorted(k for k, v in state.items() if not isinstance(v, torch.Tensor))
    if bad:
        raise ValueError(f"{str(src)!r}: state_dict entries {bad[:5]} are not tensors; a Lightning state_dict holds tensors only")
    return dedupe_shared_tensors({k: v.detach().contiguous() for k, v in state.items()})


def _json_hparams(hparams: dict[str, Any], src: Path) -> dict[str, Any]:
    """The hyperparameters as JSON (what ``hparams.json`` holds): namespaces, paths and durations become plain data,
    0-dim tensors and NumPy scalars numbers; anything else is refused by its key."""

    def plain(value: Any, where: str) -> Any:
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, argparse.Namespace):
            return plain(vars(value), where)
        if isinstance(value, dict):
            return {str(k): plain(v, f"{where}[{k!r}]") for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
        if isinstance(value, (pathlib.PurePath, timedelta)):
            return str(value)
        if callable(getattr(value, "item", None)) and getattr(value, "ndim", None) == 0:
            return plain(value.item(), where)
        raise ValueError(f"{str(src)!r}: {where} is a {type(value).__name__}, which hparams.json (JSON) cannot hold; convert "
                         "it in a trusted environment, or pass it to load_from_checkpoint(..., name=value) instead")

    result: dict[str, Any] = plain(hparams, "hyper_parameters")
    return result


def _loop_progress(checkpoint: dict[str, Any], epoch: int, global_step: int) -> dict[str, Any]:
    """Our loop position (`trainer.fit.progress.LoopProgress`) from Lightning's ``loops.fit_loop``.

    A checkpoint whose epoch had run its last batch (written at the epoch's end: its epoch-interval schedulers have
    stepped) resumes at the next epoch's start, as Lightning resumes it. One from inside an epoch resumes after the
    batches it had run, as an uninterrupted run goes on (Lightning, with a loader that has no ``state_dict``, warns and
    draws the epoch's first batches again instead). Without ``loops`` (hand-made files) the epoch is taken as finished."""
    fit_loop = (checkpoint.get("loops") or {}).get("fit_loop") or {}
    current = (fit_loop.get("epoch_loop.batch_progress") or {}).get("current") or {}
    completed = int(current.get("completed") or 0)
    done = int(current.get("processed", completed) or 0)  # saved in on_train_batch_end: processed, not yet completed
    stepped = int((fit_loop.get("epoch_loop.state_dict") or {}).get("_batches_that_stepped", global_step))
    finished = not fit_loop or bool((fit_loop.get("epoch_loop.batch_progress") or {}).get("is_last_batch"))
    if epoch < 0 or global_step < 0:
        raise ValueError(f"the checkpoint's epoch {epoch!r} / global_step {global_step!r} are not valid positions")
    if finished:
        return {"epoch": epoch + 1, "global_step": global_step, "batches_that_stepped": stepped + (done > completed),
                "batches_done_in_epoch": 0}
    return {"epoch": epoch, "global_step": global_step, "batches_that_stepped": stepped, "batches_done_in_epoch": done,
            "stepping_batch_open": done > completed}
