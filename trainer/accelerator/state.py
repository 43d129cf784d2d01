"""`save_state` / `load_state`: everything needed to resume a run exactly.

Every rank takes part, through one `strategies.checkpoint_io.CheckpointWriter` each. Rank 0 writes the
shared parts (weights, optimizers, schedulers, scaler, data positions, registered objects, extra state)
into a hidden staging directory; each rank writes its own RNG states there, and under a sharded strategy
(FSDP) its own shards of the weights and optimizer states (`torch.distributed.checkpoint`, in ``sharded/``)
instead of rank 0's full files. Then rank 0 writes ``manifest.json`` (every rank's file hashes, computed
while writing), flushes and renames the directory into place. A crash at any point leaves the previous
checkpoint untouched, and an incomplete one is never loaded.
"""

from __future__ import annotations

import hashlib
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from strategies import checkpoint_io as io
from strategies import checkpoint_store as store
from strategies.abilities import Engine
from strategies.base import Strategy
from strategies.checkpoint_staging import Staging
from strategies.checkpoint_store import Write

if TYPE_CHECKING:
    from trainer.accelerator.accelerator import Accelerator

class Stateful(Protocol):
    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> None: ...


@dataclass(frozen=True)
class Part:
    """One named entry of a checkpoint besides the weights and RNG states: `file` holds what ``obj.state_dict()``
    returns, as ``"torch"`` (tensors and plain containers, read back with ``weights_only``) or ``"json"``.
    `optional`: an empty state is not written, and a checkpoint without the file loads (nothing to restore)."""

    file: str
    kind: str
    obj: Stateful
    optional: bool = False


def checkpoint_parts(accelerator: Accelerator, extra_state: dict[str, Any] | None = None) -> list[Part]:
    """Everything a checkpoint holds besides the weights and RNG states, by name: the same list saves and loads."""
    parts = [Part(store.scheduler_file(i), "torch", sched) for i, sched in enumerate(accelerator.prepared.schedulers)]
    parts.append(Part(store.SCALER, "torch", accelerator.strategy.precision, optional=True))
    parts += [Part(store.custom_file(i), "torch", obj) for i, obj in enumerate(accelerator.prepared.custom_objects)]
    parts.append(Part(store.DATALOADERS, "json", _LoaderPositions(accelerator)))
    registered = accelerator.checkpoint_parts  # the Trainer's (its state in extra_state.json, hparams.json)
    if extra_state is not None and any(part.file == store.EXTRA_STATE for part in registered):
        raise ValueError("save_state(extra_state=...) is the Accelerator face's; a Trainer saves its own state there")
    if not any(part.file == store.EXTRA_STATE for part in registered):
        parts.append(Part(store.EXTRA_STATE, "json", _Extra(extra_state or {})))
    return parts + list(registered)


class _LoaderPositions:
    """The prepared loaders' positions, the data seed and the step counter (``dataloaders.json``)."""

    def __init__(self, accelerator: Accelerator) -> None:
        self.accelerator = accelerator

    def state_dict(self) -> dict[str, Any]:
        acc = self.accelerator
        loaders = [loader.state_dict() for loader in acc.prepared.dataloaders if hasattr(loader, "state_dict")]
        return {"dataloaders": loaders, "data_seed": acc.prepared.data_seed, "step": acc.step}

    def load_state_dict(self, data: dict[str, Any]) -> None:
        acc = self.accelerator
        acc.prepared.data_seed = data.get("data_seed", acc.prepared.data_seed)
        acc.step = int(data.get("step", 0))
        loaders = [loader for loader in acc.prepared.dataloaders if hasattr(loader, "load_state_dict")]
        for loader, state in zip(loaders, data.get("dataloaders", [])):
            loader.load_state_dict(state)


class _Extra:
    """``save_state(extra_state=...)``: a JSON object saved as it is and returned by `load_state`."""

    def __init__(self, value: dict[str, Any]) -> None:
        self.value = value

    def state_dict(self) -> dict[str, Any]:
        return self.value

    def load_state_dict(self, value: Any) -> None:
        self.value = value


def _automatic_dir(accelerator: Accelerator) -> Path:
    project_dir = accelerator.project_configuration.project_dir
    if project_dir is None:  # ProjectConfiguration refuses automatic naming without one, and load_state checks first
        raise ValueError("numbered checkpoints live under a project directory; pass ProjectConfiguration(project_dir=...)")
    return store.default_dir(project_dir)


def save_state(
    accelerator: Accelerator,
    output_dir: str | os.PathLike | None = None,
    *,
    extra_state: dict[str, Any] | None = None,
    meta: dict[str, Any] | None = None,
    async_save: bool = False,
    weights_only: bool = False,
) -> Any:
    """Write a checkpoint directory and return its path (see the module docstring), or with `async_save` a
    `strategies.checkpoint_store.PendingSave` as soon as the state is copied (the files are written in the background).

    What it holds besides the weights and RNG states is `checkpoint_parts` (a `Trainer` adds its own); `meta` adds
    manifest entries (the Trainer's step and epoch, by which the newest checkpoint is found). `weights_only` (the
    Trainer's ``ModelCheckpoint(save_weights_only=True)``) writes the model weights and ``hparams.json`` alone, marked
    so in the manifest (`strategies.checkpoint_store.WEIGHTS_ONLY`): nothing resumes from it.
    """
    if not isinstance(async_save, bool):
        raise TypeError(f"save_state(async_save={async_save!r}) must be True or False")
    config = accelerator.project_configuration
    accelerator.checkpoints.wait()  # (the counter below may have moved on with the save in flight)
    if config.automatic_checkpoint_naming:
        if output_dir is not None:
            raise ValueError("automatic_checkpoint_naming=True chooses the directory itself; call save_state() without output_dir")
        final = store.numbered_dir(_automatic_dir(accelerator), config.iteration)
        if final.exists():
            raise FileExistsError(
                f"checkpoint directory {str(final)!r} already exists; set ProjectConfiguration(iteration=...) past it "
                "or call load_state() first, which restores the counter"
            )
    elif output_dir is None:
        raise ValueError("save_state() needs an output_dir, or ProjectConfiguration(automatic_checkpoint_naming=True)")
    else:
        final = Path(output_dir)
    strategy, rank, main = accelerator.strategy, accelerator.process_index, accelerator.is_main_process
    if weights_only and isinstance(strategy, Engine):
        raise NotImplementedError(
            "a weights-only checkpoint is not available with strategy='deepspeed': its engine writes its optimizer "
            "partitions with the weights. Save full checkpoints (save_weights_only=False)"
        )

    def collect(staging: Staging | None) -> Write:
        if weights_only:
            write_weights = strategy.collect_checkpoint(accelerator.prepared.models, [], staging)
        else:
            write_weights = _collect_weights(accelerator, final, manifest, staging)
        rng_tensors, rng_meta = io.capture_rng_state()  # (fresh tensors: nothing to copy)
        parts = checkpoint_parts(accelerator, extra_state)
        if weights_only:
            parts = [part for part in parts if part.file == store.HPARAMS]
        states = [(part, part.obj.state_dict()) for part in parts]  # every process (hooks)
        shared = {part.file: (part.kind, state) for part, state in states if main and (state or not part.optional)}
        if staging is not None:
            shared = staging.copy("shared", shared)

        def write(writer: io.CheckpointWriter) -> None:  # (the small files first: they reach the disk while the weights are written)
            if not weights_only:
                writer.save_safetensors(store.rng_file(rank), rng_tensors, metadata=rng_meta)
            for name, (kind, data) in shared.items():
                writer.save_json(name, data) if kind == "json" else writer.save_torch(name, data)
            write_weights(writer)

        return write

    manifest = {"num_processes": accelerator.num_processes, "world_size": accelerator.num_processes, "sharded": strategy.sharded,
                "models": len(accelerator.prepared.models), "optimizers": 0 if weights_only else len(accelerator.prepared.optimizers),
                "schedulers": 0 if weights_only else len(accelerator.prepared.schedulers), "created": time.time(), **(meta or {})}
    if weights_only:
        manifest["kind"] = store.WEIGHTS_ONLY
    result = accelerator.checkpoints.save(final.absolute(), collect, manifest, async_save=async_save)
    if config.automatic_checkpoint_naming:
        if main and config.total_limit is not None:
            limit, folder = config.total_limit, final.absolute().parent

            def prune() -> None:
                for old in store.numbered_checkpoints(folder)[:-limit]:
                    store.remove_checkpoint(old)

            accelerator.checkpoints.after_commit(prune)
        config.iteration += 1
    return result if async_save else str(final)


def resolve_load_dir(accelerator: Accelerator, input_dir: str | os.PathLike | None) -> Path:
    if input_dir is not None:
        return Path(input_dir)
    config = accelerator.project_configuration
    if config.project_dir is None:
        raise ValueError("load_state() without a path needs ProjectConfiguration(project_dir=...) to find the newest checkpoint")
    found = store.numbered_checkpoints(_automatic_dir(accelerator))
    if not found:
        raise FileNotFoundError(f"no complete checkpoint_<n> directory under {str(_automatic_dir(accelerator))!r}; save_state() first")
    return found[-1]


def _check_process_count(accelerator: Accelerator, reader: io.CheckpointReader, manifest: dict[str, Any]) -> None:
    """Refuse, before anything is loaded, what this run cannot resume exactly: a DeepSpeed engine's partitions of another
    number of processes under another strategy (`strategy='deepspeed'` reshards them), or loader positions its loaders
    cannot take (another global batch)."""
    path, world = reader.directory, accelerator.num_processes
    saved = manifest.get("world_size", manifest.get("num_processes"))
    resharding = isinstance(accelerator.strategy, Engine)  # (it converts the engine's partitions: DeepSpeedStrategy.load_checkpoint)
    if saved is not None and int(saved) != world and (path / store.DEEPSPEED_DIR).is_dir() and not resharding:
        raise ValueError(
            f"checkpoint {str(path)!r} was written by strategy='deepspeed' on {saved} processes and this run has {world} "
            f"with strategy={accelerator.strategy.name!r}: DeepSpeed's ZeRO partitions of the optimizer states are loaded by "
            f"strategy='deepspeed'. Resume with it (on any number of processes), or start a new run from its weights "
            "(TrainModule.load_from_checkpoint(...), or strategies.checkpoint_io.load_weights)"
        )
    loaders = [loader for loader in accelerator.prepared.dataloaders if hasattr(loader, "resharded_position")]
    if loaders and (path / store.DATALOADERS).exists():
        positions = reader.read_json(store.DATALOADERS)
        for loader, state in zip(loaders, positions.get("dataloaders", []) if isinstance(positions, dict) else []):
            if isinstance(state, dict) and isinstance(state.get("batches_yielded"), int):
                loader.resharded_position(state)  # (raises, naming the batch size that keeps the global batch)


def load_state(
    accelerator: Accelerator,
    input_dir: str | os.PathLike | None = None,
    *,
    strict: bool = True,
    verify: bool = True,
    **_: Any,
) -> dict[str, Any]:
    """Restore a directory written by `save_state`; returns its ``extra_state``.

    Loads only safetensors, JSON and ``torch.load(weights_only=True)`` data, so a tampered checkpoint is
    refused with a `CheckpointError` (a `ValueError`) and nothing in it is executed. The names and sizes of the
    files are checked against the manifest first; then each file's digest (unless ``verify=False``) in the same
    pass that reads it, before any of it is used (`strategies.checkpoint_io.CheckpointReader`), each process
    checking what it reads and the processes agreeing at the end. A damaged file stops the load there (on every
    process), with what was read before it loaded.

    A checkpoint of another number of processes resumes on the samples the interrupted run would have seen (the
    loaders' positions are kept in samples of the epoch's order; sharded weights are resharded), provided each
    loader's global batch stays the same; the RNG states of processes the checkpoint has none for are derived from
    the saved ones (`derive_rng_state`). A DeepSpeed checkpoint of another process count is converted to DeepSpeed's
    universal format and resharded by `strategy='deepspeed'` (another strategy refuses it).
    """
    accelerator.checkpoints.wait()
    path = resolve_load_dir(accelerator, input_dir)
    share = (accelerator.process_index, accelerator.num_processes, accelerator.gather_object)
    reader = io.open_checkpoint(path, share=share, hashes=verify, what="load_state")  # (the same directory everywhere, too)
    manifest = reader.manifest
    store.check_resumable(path, manifest)
    _check_process_count(accelerator, reader, manifest)
    models = _run_load_hooks(accelerator, path)
    for kind, have in (("models", models), ("optimizers", accelerator.prepared.optimizers), ("schedulers", accelerator.prepared.schedulers)):
        if manifest.get(kind, len(have)) != len(have):
            raise ValueError(
                f"checkpoint {str(path)!r} holds {manifest.get(kind)} {kind} but {len(have)} were prepared; "
                "prepare the same objects as when it was saved"
            )
    parts = checkpoint_parts(accelerator)
    with reader.agreed():
        _load_files(accelerator, reader, manifest, parts, strict, models)
    config = accelerator.project_configuration
    if config.automatic_checkpoint_naming and (n := store.numbered_iteration(path)) is not None:
        config.iteration = n + 1
    extra = next((part.obj for part in parts if isinstance(part.obj, _Extra)), None)
    return extra.value if extra is not None else {}


def _load_files(
    accelerator: Accelerator, reader: io.CheckpointReader, manifest: dict[str, Any], parts: list[Part], strict: bool, models: list[Any],
) -> None:
    """Every file `load_state` restores, each read (and checked) once through `reader`; `models` load the weights files in order."""
    path = reader.directory
    accelerator.strategy.load_checkpoint(reader, models, [opt.optimizer for opt in accelerator.prepared.optimizers], strict=strict)
    for part in parts:
        if part.optional and not (path / part.file).exists():
            continue
        state = reader.torch_load(part.file) if part.kind == "torch" else reader.read_json(part.file)
        if part.kind == "json" and not isinstance(state, dict):
            raise io.CheckpointError(f"{path / part.file} is not a JSON object; the checkpoint was tampered with")
        part.obj.load_state_dict(state)
    _restore_rng(accelerator, reader, manifest)


def _restore_rng(accelerator: Accelerator, reader: io.CheckpointReader, manifest: dict[str, Any]) -> None:
    """This process's RNG states: its own, or for a process the checkpoint's run did not have, `derive_rng_state`."""
    path, rank = reader.directory, accelerator.process_index
    saved_world = int(manifest.get("world_size", manifest.get("num_processes", accelerator.num_processes)))
    source = store.rng_file(rank if rank < saved_world else rank % saved_world)
    if (path / source).exists():
        reader.load_rng_state(source)
        if rank >= saved_world:
            derive_rng_state(rank)
    elif manifest.get("rng_states", True):
        raise io.CheckpointError(
            f"checkpoint {str(path)!r} has no {source}: the RNG states of process {rank % saved_world} are missing, "
            "so the run would not continue as it would have; load an intact checkpoint"
        )


def derive_rng_state(rank: int) -> None:
    """Re-seed this process's generators (python, numpy, torch and CUDA) for process `rank` of a run with more processes
    than the checkpoint's (W): called after the saved states of process ``rank % W`` were restored, it seeds each of
    them with the first 63 bits of SHA-256(that torch CPU state, `rank`). Processes below W keep their own saved
    streams bit for bit; a new process gets a stream of its own (not a copy of another's), the same on every resume
    of the same checkpoint on the same number of processes.
    """
    digest = hashlib.sha256(torch.get_rng_state().numpy().tobytes() + rank.to_bytes(8, "little")).digest()
    seed = int.from_bytes(digest[:8], "little") >> 1
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # (CUDA's generators too)


def _full_weights(accelerator: Accelerator) -> bool:
    """Whether the strategy saves full state dicts of the models (the case where the state-hooks see and edit `weights`):
    it keeps the base class's own `collect_checkpoint`."""
    return type(accelerator.strategy).collect_checkpoint is Strategy.collect_checkpoint


def _collect_weights(accelerator: Accelerator, final: Path, manifest: dict[str, Any], staging: Staging | None) -> Write:
    """The models' and optimizers' write function, after the save-state pre-hooks (`Accelerator.register_save_state_pre_hook`).

    Without hooks the strategy collects everything. With hooks and full state dicts, the hooks get those state dicts
    and what they leave in the list is written, in order; under a sharded strategy they get an empty list.
    """
    strategy, models = accelerator.strategy, accelerator.prepared.models
    optimizers = [opt.optimizer for opt in accelerator.prepared.optimizers]
    hooks = accelerator.save_state_pre_hooks
    main = strategy.rank == 0
    if not hooks:
        return strategy.collect_checkpoint(models, optimizers, staging)
    if not _full_weights(accelerator):
        write_all = strategy.collect_checkpoint(models, optimizers, staging)
        added = _call_save_hooks(hooks, models, [], final)

        def write_sharded(writer: io.CheckpointWriter) -> None:
            write_all(writer)
            if main:
                writer.hash_written(added)

        return write_sharded
    weights = [strategy.module_state_dict(m) for m in models]
    added = _call_save_hooks(hooks, models, weights, final)
    bad = [type(w).__name__ for w in weights if not isinstance(w, dict)]
    if bad:
        raise TypeError(f"a save_state pre-hook left {bad} in `weights`; it may only remove state dicts or change them in place")
    manifest["models"] = len(weights)  # the load pairs them with the models the load hooks leave
    write_optimizers = strategy.collect_checkpoint([], optimizers, staging)
    if main and staging is not None:
        weights = staging.copy("hooked_models", weights)

    def write(writer: io.CheckpointWriter) -> None:
        for i, state in enumerate(weights if main else []):
            writer.save_safetensors(store.model_file(i), state)
        write_optimizers(writer)
        if main:
            writer.hash_written(added)

    return write


def _call_save_hooks(hooks: list[Any], models: list[Any], weights: list[Any], final: Path) -> list[str]:
    """Call each save-state pre-hook with the directory being written (it becomes `final` at the commit); the files the
    hooks added there (process 0 lists them in the manifest, so they are verified like the others when loading)."""
    output_dir = io.CheckpointWriter(final).staging

    def files() -> set[str]:
        return {p.relative_to(output_dir).as_posix() for p in output_dir.rglob("*") if p.is_file()}

    before = files()
    for hook in hooks:
        hook(list(models), weights, str(output_dir))
    return sorted(files() - before)


def _run_load_hooks(accelerator: Accelerator, path: Path) -> list[Any]:
    """Call the load-state pre-hooks (`Accelerator.register_load_state_pre_hook`); the models whose weights load from `path`."""
    hooks = accelerator.load_state_pre_hooks
    if not hooks:
        return list(accelerator.prepared.models)
    full = _full_weights(accelerator)
    models = list(accelerator.prepared.models) if full else []
    for hook in hooks:
        hook(models, str(path))
    return models if full else list(accelerator.prepared.models)
