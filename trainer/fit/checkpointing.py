"""Checkpoints of a `Trainer` run: save, verify, restore and find them.

A checkpoint is a directory. The `Accelerator` writes the training state into it (model weights as
safetensors with the unwrapped model's keys, optimizers, schedulers, scaler, dataloader positions, the RNG
states of every rank, and ``extra_state.json``); this module adds the Trainer's part to ``extra_state`` (loop
position, callback states, hyperparameters, additions from ``on_save_checkpoint`` hooks), an ``hparams.json``
for `TrainModule.load_from_checkpoint`, and its step and epoch to ``manifest.json`` (size and hash of
every file, written last). A directory is *complete* when its manifest exists and matches its files. Writing
and reading the directory are `strategies.checkpoint_io`'s, the same for both faces.

Crash safety: everything is written under a hidden ``.<name>.partial`` directory next to the target, flushed,
then renamed into place, so a crash mid-save leaves earlier checkpoints untouched and never a half-written
directory under a real name. Loading reads only safetensors, JSON and ``torch.load(weights_only=True)`` files
(through the `Accelerator`), each checked against the manifest: an added or missing file is refused before any
file is read, a changed one in the pass that reads it, before any of it is used.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from callbacks.checkpoint import ModelCheckpoint
from strategies import checkpoint_io
from strategies import checkpoint_store as store
from strategies.checkpoint_io import FORMAT_VERSION, load_weights, read_manifest, verify_checkpoint
from strategies.checkpoint_io import is_complete as is_complete_checkpoint
from strategies.lightning_checkpoint import not_converted
from trainer.accelerator.state import Part, save_state

if TYPE_CHECKING:
    from trainer.fit.trainer import Trainer

__all__ = ["find_last_checkpoint", "is_complete_checkpoint", "read_manifest", "restore_checkpoint", "save_checkpoint", "verify_checkpoint"]


# --------------------------------------------------------------------------------------------- saving
def save_checkpoint(trainer: Trainer, dirpath: str | os.PathLike[str], *, async_save: bool = False, weights_only: bool = False) -> Path | store.PendingSave:
    """Write a complete checkpoint of `trainer`'s run to the directory `dirpath`, atomically (with `async_save`, in
    the background once the state is copied: see `strategies.checkpoint_store`).

    Every rank must call this (it is collective). It is the `Accelerator`'s checkpoint (one staging
    directory, one manifest) with the Trainer's state in ``extra_state.json``, its ``hparams.json``, and the
    step and epoch in the manifest. An existing directory at `dirpath` is replaced only once the new
    checkpoint is complete.

    Args:
        trainer: the `Trainer` (see the attributes contract in ``docs/checkpoints.md``).
        dirpath: the checkpoint directory to create.
        weights_only: write the model weights and ``hparams.json`` alone (`TrainModule.load_from_checkpoint` and
            ``validate``/``test``/``predict(ckpt_path=...)`` load it; resuming training from it is refused).

    Returns:
        The checkpoint directory, or with `async_save` the `PendingSave` handle of its background write.
    """
    target = Path(dirpath).absolute()
    state = trainer.run_state
    meta = {"global_step": state.global_step, "epoch": state.current_epoch}
    pending = save_state(trainer.accelerator, target, meta=meta, async_save=async_save, weights_only=weights_only)
    return pending if async_save else target


def trainer_parts(trainer: Trainer) -> list[Part]:
    """What a Trainer adds to its accelerator's checkpoints: its state (``extra_state.json``: loop progress, callbacks,
    logging accumulators, datamodule, hyperparameters and the ``on_save_checkpoint`` additions) and ``hparams.json``."""
    return [Part(store.EXTRA_STATE, "json", TrainerState(trainer)), Part(store.HPARAMS, "json", _Hparams(trainer))]


class TrainerState:
    """The Trainer's part of a checkpoint (JSON only); restored in ``fit`` only (evaluation loads the weights alone)."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer

    def state_dict(self) -> dict[str, Any]:
        return build_checkpoint_state(self.trainer)

    def load_state_dict(self, checkpoint: dict[str, Any]) -> None:
        _restore_trainer_state(self.trainer, checkpoint)


class _Hparams:
    """``hparams.json``: the module's hyperparameters, for `TrainModule.load_from_checkpoint` (nothing to restore)."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer

    def state_dict(self) -> dict[str, Any]:
        module = self.trainer.lightning_module
        return to_json_safe(dict(module.hparams), "hyper_parameters") if module is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def build_checkpoint_state(trainer: Trainer) -> dict[str, Any]:
    """The Trainer's part of a checkpoint (JSON only), after the ``on_save_checkpoint`` hooks added theirs."""
    module = trainer.lightning_module
    callback_states: dict[str, Any] = {}
    for callback in trainer.callbacks:
        state = callback.state_dict()
        if state:
            key = callback.state_key
            if key in callback_states:
                raise ValueError(
                    f"two callbacks share the checkpoint key {key!r}; give them distinct `state_key` properties "
                    "so their states can be told apart on resume"
                )
            callback_states[key] = state
    checkpoint: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "epoch": trainer.run_state.current_epoch,
        "global_step": trainer.run_state.global_step,
        "loops": trainer.run_state.state_dict(),  # {"fit_loop": the loop position}
        "callbacks": callback_states,
        "hyper_parameters": dict(module.hparams) if module is not None else {},
    }
    datamodule = trainer.datamodule
    if datamodule is not None and datamodule.state_dict():
        checkpoint["datamodule"] = datamodule.state_dict()
    metrics = trainer.callback_metrics
    checkpoint["callback_metrics"] = {k: _as_number(v) for k, v in metrics.items() if _as_number(v) is not None}
    checkpoint["results"] = trainer.results_state_dict()  # epoch accumulators of self.log(on_epoch=True): exact after resume
    trainer.dispatch.call("on_save_checkpoint", checkpoint)  # the callbacks, then the module (Lightning's order)
    safe: dict[str, Any] = to_json_safe(checkpoint, "checkpoint")
    return safe


def _as_number(value: Any) -> float | None:
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", None) == 0:
        value = item()
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def to_json_safe(value: Any, where: str) -> Any:
    """Return `value` with 0-dim tensors / numpy scalars turned into numbers; raise if it is not JSON data.

    Raises:
        TypeError: naming the key path of the first value JSON cannot hold.
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"checkpoint key {where}[{key!r}] is a {type(key).__name__}; use str keys (JSON)")
            out[key] = to_json_safe(item, f"{where}[{key!r}]")
        return out
    if isinstance(value, (list, tuple)):
        return [to_json_safe(item, f"{where}[{i}]") for i, item in enumerate(value)]
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", None) == 0:
        return to_json_safe(item(), where)
    raise TypeError(
        f"checkpoint value {where} is a {type(value).__name__}, which a checkpoint cannot hold: the Trainer's part "
        "of a checkpoint is JSON (str, int, float, bool, None, lists, str-keyed dicts, 0-dim tensors); store "
        "tensors in the module's state_dict instead, or leave the value out (e.g. save_hyperparameters(ignore=[...]))"
    )


# --------------------------------------------------------------------------------------------- restoring
def restore_checkpoint(trainer: Trainer, path: str | os.PathLike[str]) -> None:
    """Restore the full training state of `trainer` from the checkpoint directory `path`.

    Restores (through the `Accelerator`) weights, optimizers, schedulers, scaler, dataloader positions and RNG
    states, then the loop position (``trainer.run_state``), each callback's state (by ``state_key``), and
    calls the ``on_load_checkpoint`` hooks. Every rank must call it. Outside ``fit`` (``validate``, ``test``,
    ``predict``) only the model weights are loaded.

    Raises:
        ValueError: the checkpoint is incomplete or tampered with, its loaders took another global batch, or it is a
            DeepSpeed checkpoint of another number of processes.
    """
    directory = Path(path)
    accelerator = trainer.accelerator
    if trainer.run_state.stage not in (None, "fit"):
        verify_checkpoint(directory, share=(accelerator.process_index, accelerator.num_processes, accelerator.gather_object))
        return _restore_weights(trainer, directory)
    module = trainer.lightning_module
    strict = module.strict_loading if module is not None else True  # Lightning's `strict_loading` applies to resuming too
    accelerator.load_state(str(directory), strict=strict)  # checks each file as it reads it; `TrainerState` restores the Trainer's part
    return None


def _restore_trainer_state(trainer: Trainer, checkpoint: dict[str, Any]) -> None:
    if "loops" not in checkpoint:
        raise ValueError("the checkpoint has no Trainer state in its extra_state.json; it was not written by Trainer.save_checkpoint")
    trainer.run_state.load_state_dict(checkpoint["loops"])  # (the restart rules are its progress's own)
    trainer.callback_metrics.update(checkpoint.get("callback_metrics") or {})
    if "results" in checkpoint:
        trainer.load_results_state_dict(checkpoint["results"])
    if trainer.datamodule is not None and "datamodule" in checkpoint:
        trainer.datamodule.load_state_dict(checkpoint["datamodule"])
    trainer.dispatch.call("on_load_checkpoint", checkpoint)  # the module, then the callbacks (Lightning's order)
    _restore_callback_states(trainer, checkpoint.get("callbacks") or {})  # after the hooks, as Lightning


def _restore_weights(trainer: Trainer, directory: Path) -> None:
    """``validate``/``test``/``predict`` from a checkpoint: load only the model weights."""
    module = trainer.attached_module
    device = next((p.device for p in module.parameters()), "cpu")
    load_weights(directory, module, device=device, load_full=trainer.accelerator.strategy.load_module_state_dict)


def _restore_callback_states(trainer: Trainer, states: dict[str, Any]) -> None:
    for callback in trainer.callbacks:
        state = states.get(callback.state_key)
        if state is not None:
            callback.load_state_dict(state)


def load_hparams(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The module hyperparameters saved with the checkpoint at `directory` (after the manifest check)."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    path = directory / store.HPARAMS
    if store.HPARAMS not in manifest["files"] or not path.is_file():
        raise ValueError(f"checkpoint {str(directory)!r} has a missing or modified {store.HPARAMS}; load an intact checkpoint")
    data = checkpoint_io.CheckpointReader(directory, manifest).read_json(store.HPARAMS)
    if not isinstance(data, dict):
        raise ValueError(f"{str(path)!r} does not hold a JSON object of hyperparameters")
    return data


# --------------------------------------------------------------------------------------------- finding
def default_checkpoint_dir(trainer: Trainer) -> Path:
    """``<project_dir>/checkpoints``: where checkpoints go unless `ModelCheckpoint(dirpath=...)` says otherwise."""
    return store.default_dir(trainer.project_dir)


def find_last_checkpoint(dirpath: str | os.PathLike[str]) -> Path | None:
    """The newest complete checkpoint in `dirpath` (`strategies.checkpoint_store.newest_in`)."""
    return store.newest_in(dirpath)


def resolve_ckpt_path(trainer: Trainer, ckpt_path: str | os.PathLike[str] | None) -> Path | None:
    """Turn ``fit(ckpt_path=...)`` into a checkpoint directory.

    Args:
        trainer: the `Trainer`.
        ckpt_path: None; ``"last"`` (the newest complete checkpoint in the checkpoint directories, or None when
            there is none yet, so a first run starts from scratch); ``"best"`` (the checkpoint callback's best);
            or a checkpoint directory.

    Raises:
        ValueError: ``"best"`` without a best checkpoint, or a path that is not a complete checkpoint.
        FileNotFoundError: the path does not exist.
    """
    if ckpt_path is None:
        return None
    resuming = trainer.run_state.stage in (None, "fit")
    if ckpt_path == "last":
        found = store.newest_of(_checkpoint_dirs(trainer), resumable=resuming)
        if found is None and resuming and (weights := store.newest_of(_checkpoint_dirs(trainer))) is not None:
            store.check_resumable(weights, read_manifest(weights))  # only weights-only checkpoints: say so, not start afresh
        return found
    if ckpt_path == "best":
        callback = trainer.checkpoint_callback
        best = callback.best_model_path if callback is not None else ""
        if not best:
            raise ValueError(
                "ckpt_path='best' needs a best checkpoint, but "
                + ("there is no ModelCheckpoint callback" if callback is None else "ModelCheckpoint has not saved one yet")
                + "; add ModelCheckpoint(monitor=...) and fit first, or pass ckpt_path='last' or a checkpoint directory"
            )
        ckpt_path = best
    directory = lightning_path(Path(ckpt_path))
    manifest = read_manifest(directory)
    if resuming:
        store.check_resumable(directory, manifest)
    return directory.absolute()


def check_weights_only(weights_only: Any, where: str) -> None:
    """Lightning 2.6's ``weights_only`` (how ``torch.load`` reads a ``.ckpt``): None and True are what loading here always
    is; False (unpickle arbitrary objects) is refused, since a checkpoint here holds no pickles."""
    if weights_only is None or weights_only is True:
        return
    if weights_only is False:
        raise ValueError(
            f"{where}(..., weights_only=False) asks to unpickle the checkpoint, but checkpoints here hold no pickles "
            "(safetensors, JSON and tensor-only files, read as torch.load(weights_only=True) reads them): leave weights_only out "
            "or pass None/True. A Lightning .ckpt file must be converted first (see docs/migrating-from-lightning.md)"
        )
    raise TypeError(f"{where}(..., weights_only={weights_only!r}) must be None, True or False")


def lightning_path(path: Path) -> Path:
    """Accept the file names Lightning users write: ``<dir>/last.ckpt`` is the newest checkpoint in ``<dir>`` (the link
    the store keeps there, or without it the newest found), ``<dir>/epoch=3-step=40.ckpt`` the checkpoint directory
    ``<dir>/epoch=3-step=40``. Other paths are returned as given.

    Raises:
        ValueError: `path` is a file Lightning wrote (a ``.ckpt`` file): the message gives the command converting it.
    """
    if path.suffix == ".ckpt" and path.is_file():
        raise not_converted(path)
    if store.is_last_link(path) and path.exists():
        return path.parent / os.readlink(path)
    if path.exists() or path.suffix != ".ckpt":
        return path
    if path.stem == "last":
        found = find_last_checkpoint(path.parent)
        if found is None:
            raise FileNotFoundError(f"{str(path)!r}: there is no complete checkpoint in {str(path.parent)!r} yet")
        return found
    return path.with_suffix("")


def _checkpoint_dirs(trainer: Trainer) -> list[Path]:
    dirs = [default_checkpoint_dir(trainer)]
    for callback in trainer.callbacks:
        if isinstance(callback, ModelCheckpoint):
            directory = callback.resolve_dirpath(trainer)
            if directory not in dirs:
                dirs.append(directory)
    return dirs

