"""The checkpoint store: the one owner of a run's checkpoints on disk.

It alone knows the layout: the names of the files inside a checkpoint directory, where a save goes by default
(``<project_dir>/checkpoints``, numbered ``checkpoint_<n>`` directories for Accelerate's automatic naming), which
checkpoint is the newest or ``last`` (``last.json``, and the ``last.ckpt`` link Lightning scripts open), which kind a
checkpoint is (full, or the weights alone: ``ModelCheckpoint(save_weights_only=True)``, which no resume picks), and what
is removed when (``total_limit``, ``save_top_k``).
It runs every save of both faces (`CheckpointStore.save`): now, or in the background (``async_save=True``), at
most one in flight.

A save, on every process:

1. waits for the save in flight, if any (its error is raised here, naming its checkpoint);
2. copies what it saves out of the training state — for an asynchronous save into reusable host buffers
   (`strategies.checkpoint_staging`), the one part the step waits for;
3. writes its files into the hidden staging directory ``.<name>.partial`` (`strategies.checkpoint_io.CheckpointWriter`,
   hashed while written), in the background for an asynchronous save: by this process's checkpoint writer process
   (`strategies.checkpoint_process`), which reads the staged copy from shared memory;
4. the processes gather their file entries, process 0 writes ``manifest.json`` and renames the directory into place
   (only when every process's write succeeded), then runs what was queued behind the save (``last.json``, pruning).

A crash before step 4 finishes leaves the previous checkpoint as the newest complete one; the next save removes the
staging left behind. The background part talks over its own gloo process group, so it never interleaves with the
training's collectives.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import threading
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from strategies import checkpoint_io as io
from strategies.checkpoint_files import fsync_dir
from strategies.checkpoint_process import running_writer, writer_mode, writer_niceness, writer_process
from strategies.checkpoint_staging import Staging

if TYPE_CHECKING:
    from strategies.base import Strategy

# ------------------------------------------------------------------------------------------------ the layout
MANIFEST = io.MANIFEST_NAME
LAST_POINTER = "last.json"
LAST_LINK = "last.ckpt"  # a symbolic link to the checkpoint last.json names (Lightning's file name), replaced atomically
WEIGHTS_ONLY = "weights"  # the manifest's "kind" of a checkpoint holding the model weights alone
DEFAULT_DIRNAME = "checkpoints"
SHARDED_DIR = io.SHARDED_DIR  # model and optimizer shards, torch.distributed.checkpoint (FSDP)
DEEPSPEED_DIR = io.DEEPSPEED_DIR  # the DeepSpeed engine's own files
SCALER = "scaler.bin"
DATALOADERS = "dataloaders.json"
EXTRA_STATE = "extra_state.json"  # the Trainer's state (loop progress, callbacks, logging, datamodule), or the user's
HPARAMS = "hparams.json"
_NUMBERED = re.compile(r"^checkpoint_(\d+)$")


def model_file(i: int) -> str:
    """``model.safetensors``, ``model_1.safetensors``, ...: the full weights of the `i`-th prepared model."""
    return io.indexed("model", i, "safetensors")


def optimizer_file(i: int) -> str:
    return io.indexed("optimizer", i, "bin")


def scheduler_file(i: int) -> str:
    return io.indexed("scheduler", i, "bin")


def custom_file(i: int) -> str:
    """The `i`-th object given to ``register_for_checkpointing``."""
    return f"custom_checkpoint_{i}.bin"


def rng_file(rank: int) -> str:
    return f"random_states_{rank}.safetensors"


def default_dir(project_dir: str | os.PathLike[str]) -> Path:
    """``<project_dir>/checkpoints``, absolute: where checkpoints go unless told otherwise (both faces)."""
    return Path(project_dir).absolute() / DEFAULT_DIRNAME


def numbered_dir(folder: Path, iteration: int) -> Path:
    """Accelerate's automatic naming: ``<folder>/checkpoint_<iteration>``."""
    return folder / f"checkpoint_{iteration}"


def numbered_iteration(path: Path) -> int | None:
    m = _NUMBERED.match(Path(path).name)
    return int(m.group(1)) if m else None


def numbered_checkpoints(folder: Path) -> list[Path]:
    """Complete ``checkpoint_<n>`` directories in `folder`, oldest first."""
    if not folder.is_dir():
        return []
    found = [(n, p) for p in folder.iterdir() if (n := numbered_iteration(p)) is not None and io.is_complete(p)]
    return [p for _, p in sorted(found)]


def write_last_pointer(folder: Path, checkpoint: Path) -> None:
    """Make ``<folder>/last.json`` and the link ``<folder>/last.ckpt`` name `checkpoint` (a directory inside `folder`),
    each atomically: a reader sees the previous checkpoint or the new one, never none."""
    io.write_json_durably(Path(folder) / LAST_POINTER, {"format": io.FORMAT_NAME, "last": Path(checkpoint).name})
    link_last(Path(folder), Path(checkpoint).name)


def link_last(folder: Path, name: str) -> None:
    """Point the symbolic link ``<folder>/last.ckpt`` at ``name`` (relative, so the folder can move), replacing the
    old link in one rename. A ``last.ckpt`` that is not a link (a user's file or directory) is left alone, with a
    warning, as is a filesystem without symbolic links (``last.json`` and ``ckpt_path="last"`` still work)."""
    link = folder / LAST_LINK
    if link.exists() and not link.is_symlink():
        warnings.warn(f"{str(link)!r} exists and is not a link this store made; it is left alone, so it does not name the "
                      f"newest checkpoint {name!r} (last.json does): remove it to get the link", stacklevel=3)
        return
    tmp = folder / f".{LAST_LINK}.{os.getpid()}.tmp"
    try:
        tmp.unlink(missing_ok=True)
        os.symlink(name, tmp, target_is_directory=True)
        os.replace(tmp, link)
        fsync_dir(folder)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        warnings.warn(f"could not link {str(link)!r} to the newest checkpoint {name!r} ({err}); open it through last.json "
                      "or ckpt_path='last' instead", stacklevel=3)


def is_last_link(path: Path) -> bool:
    """True for ``<folder>/last.ckpt`` when it is the link `link_last` keeps."""
    return path.name == LAST_LINK and path.is_symlink()


def read_last_pointer(folder: str | os.PathLike[str]) -> Path | None:
    """The checkpoint that ``<folder>/last.json`` names, if it is a complete checkpoint inside `folder`."""
    folder = Path(folder)
    try:
        data = json.loads((folder / LAST_POINTER).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    name = data.get("last") if isinstance(data, dict) else None
    if not isinstance(name, str) or not name or name in (".", "..") or "/" in name or "\\" in name or name.startswith("."):
        return None
    candidate = folder / name
    return candidate if io.is_complete(candidate) else None


def is_weights_only(manifest: dict[str, Any]) -> bool:
    """Whether a checkpoint (its manifest) holds the model weights alone (``ModelCheckpoint(save_weights_only=True)``)."""
    return manifest.get("kind") == WEIGHTS_ONLY


def _resumable(checkpoint: Path) -> bool:
    return not is_weights_only(io.read_manifest(checkpoint))


def check_resumable(path: Path, manifest: dict[str, Any]) -> None:
    """Refuse to resume training from a checkpoint of the weights alone (as Lightning refuses), saying what to do.

    Raises:
        ValueError: `manifest` is a weights-only checkpoint's.
    """
    if is_weights_only(manifest):
        raise ValueError(
            f"checkpoint {str(path)!r} holds the model weights only (ModelCheckpoint(save_weights_only=True)), so training "
            "cannot resume from it: it has no optimizer, scheduler or loop state. Resume from a full checkpoint, or start a "
            "new run from these weights: module = MyModule.load_from_checkpoint(path); trainer.fit(module) without ckpt_path"
        )


def _recency(checkpoint: Path) -> tuple[float, float]:
    manifest = io.read_manifest(checkpoint)
    return float(manifest.get("global_step", -1)), float(manifest.get("created", 0.0))


def newest_in(folder: str | os.PathLike[str], *, resumable: bool = False) -> Path | None:
    """The newest complete checkpoint in `folder`: the one ``last.json`` names, else the highest step saved (then the
    latest written). Staging directories of saves that did not finish are never candidates, nor the ``last.ckpt`` link
    (it names one of the others). A checkpoint whose replacement under the same name was cut short between its two
    renames (``.<name>.old`` with no ``<name>``) is found under its hidden name. `resumable`: only checkpoints training
    can resume from (not the weights-only ones)."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    pointed = read_last_pointer(folder)
    if pointed is not None and (not resumable or _resumable(pointed)):
        return pointed
    complete = [child for child in folder.iterdir() if _candidate(folder, child) and io.is_complete(child)]
    if resumable:
        complete = [child for child in complete if _resumable(child)]
    return max(complete, key=_recency, default=None)


def _candidate(folder: Path, child: Path) -> bool:
    if child.is_symlink() or not child.is_dir():
        return False
    if child.name.startswith("."):  # only a replaced checkpoint whose successor never arrived
        return child.name.endswith(".old") and not (folder / child.name[1:-4]).exists()
    return True


def newest_of(folders: list[Path], *, resumable: bool = False) -> Path | None:
    """The newest complete checkpoint over several folders (each folder's `newest_in`, the highest step wins)."""
    found = [c for c in (newest_in(folder, resumable=resumable) for folder in folders) if c is not None]
    return max(found, key=_recency, default=None)


def remove_checkpoint(path: Path) -> None:
    """Delete the complete checkpoint directory `path` (a directory that is not one, or a link, is left alone)."""
    if not path.is_symlink() and io.is_complete(path):
        shutil.rmtree(path, ignore_errors=True)


# ------------------------------------------------------------------------------------------------ saving
class CheckpointSaveError(RuntimeError):
    """A background save failed; raised by the next call that waits for it (naming its checkpoint)."""


Write = Callable[[io.CheckpointWriter], None]


class PendingSave:
    """The handle of an asynchronous save (``save_state(..., async_save=True)``).

    ``done()`` says whether it finished (committed or failed); ``result()`` waits and returns the checkpoint's path,
    or raises `CheckpointSaveError` when any process's write failed (then no manifest was written and the previous
    checkpoint stays the newest).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._finished = threading.Event()
        self._error: str | None = None
        self._thread: threading.Thread | None = None
        self.reported = False  # the error was raised to the user once

    def done(self) -> bool:
        return self._finished.is_set()

    def result(self, timeout: float | None = None) -> str:
        if not self._finished.wait(timeout):
            raise TimeoutError(f"the background save of {str(self.path)!r} has not finished after {timeout} s")
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            self.reported = True
            raise CheckpointSaveError(
                f"the background save of checkpoint {str(self.path)!r} failed, so it was not committed (the previous "
                f"checkpoint is still the newest complete one): {self._error}"
            )
        return str(self.path)

    def __fspath__(self) -> str:  # so a script that treats save_state's return as a path keeps working
        return self.result()

    def __str__(self) -> str:
        return str(self.path)

    def __repr__(self) -> str:
        state = "failed" if self._error is not None else "done" if self.done() else "writing"
        return f"PendingSave({str(self.path)!r}, {state})"


class CheckpointStore:
    """Runs the saves of one run (one per `Accelerator`; the Trainer saves through its accelerator's) and keeps the
    one in flight. Every process makes its own store; every save is collective."""

    def __init__(self, strategy: Strategy) -> None:
        self.strategy = strategy
        self.in_process = writer_mode() == "process"  # the background write: in the writer process, or a thread here
        if self.in_process:
            writer_niceness()  # (a wrong setting is refused here, not at the first save)
        self.staging = Staging(shared=self.in_process)
        self._pending: PendingSave | None = None
        self._after: list[Callable[[], None]] = []  # process 0: what runs once the save in flight committed
        self._group: Any = None  # the background saves' own process group

    # ----------------------------------------------------------------------------------- the save in flight
    @property
    def in_flight(self) -> PendingSave | None:
        return self._pending if self._pending is not None and not self._pending.done() else None

    def wait(self) -> None:
        """Wait for the save in flight (every process calls it where its order is agreed: before the next save,
        `end_training`, `fit`'s end, a load). Its error, if any, is raised here once, naming the checkpoint."""
        pending, self._pending = self._pending, None
        if pending is not None and not pending.reported:
            pending.result()

    def after_commit(self, action: Callable[[], None]) -> None:
        """Run `action` (process 0's bookkeeping: ``last.json``, removing checkpoints that dropped out) once the save in
        flight committed, in the order given, or now when none is in flight. Skipped if that save failed, so nothing
        is removed in favour of a checkpoint that does not exist."""
        if self._pending is not None and not self._pending.done():
            with _LOCK:
                if not self._pending.done():
                    self._after.append(action)
                    return
        if self._pending is None or self._pending._error is None:
            action()

    # ----------------------------------------------------------------------------------- one save
    def save(
        self, final: Path, collect: Callable[[Staging | None], Write], meta: dict[str, Any], *, async_save: bool = False,
    ) -> PendingSave | str:
        """Save one checkpoint to `final` (collective).

        `collect(staging)` runs on every process in step with the others: it reads the training state (a copy in
        `staging` for an asynchronous save, else the live tensors) and returns the function that writes this
        process's files with a `CheckpointWriter`. `meta` goes into the manifest.

        Returns:
            The checkpoint's path, or for ``async_save`` a `PendingSave` as soon as the state is copied.
        """
        self.wait()
        strategy, main = self.strategy, self.strategy.rank == 0
        group = self._background_group() if async_save else None
        writer = io.CheckpointWriter(final)
        if main:
            writer.clear_staging()
        self._same_directory(writer)  # (also the wait for process 0's clearing)
        writer.staging.mkdir(parents=True, exist_ok=True)  # nodes without a shared filesystem
        if not async_save:
            collect(None)(writer)
            writer.sync()  # this process's files are on disk before the manifest lists them
            entries = strategy.all_gather_object(writer.files) if strategy.world_size > 1 else [writer.files]
            if main:
                writer.commit(meta, entries)
            strategy.barrier()
            return str(writer.final)
        self.staging.begin()
        process = writer_process() if self.in_process else None  # (started now; the background thread waits for it)
        write = collect(self.staging)
        self.staging.finish()
        pending = PendingSave(writer.final)
        writer.group = group
        thread = threading.Thread(target=self._write_in_background, args=(pending, writer, write, meta, group, process),
                                  name="checkpoint-save", daemon=False)
        pending._thread = thread
        self._pending = pending
        thread.start()
        return pending

    def _write_in_background(
        self, pending: PendingSave, writer: io.CheckpointWriter, write: Write, meta: dict[str, Any], group: Any, process: Any,
    ) -> None:
        rank = self.strategy.rank
        error: str | None = None
        try:
            if process is not None:  # the files go to the writer process (DCP's collective writes stay here)
                process.write(writer, write, self.staging)
            else:
                write(writer)
            writer.sync()
        except BaseException as err:
            error = f"process {rank}: {type(err).__name__}: {err}"
            if os.environ.get("TRAINWRIGHT_DEBUG_CHECKPOINT"):
                traceback.print_exc()
        try:
            errors = self._agree(writer, meta, error, group)
        except BaseException as err:  # a process is gone: nothing can be agreed, and the caller must not wait forever
            errors = [f"process {rank} could not reach the other processes to agree on the save ({type(err).__name__}: {err})"]
        pending._error = "; ".join(errors) if errors else None
        while True:  # the queued bookkeeping runs here, in order, before the save counts as done
            with _LOCK:
                after, self._after = self._after, []
                if not after:
                    pending._finished.set()
                    return
            if rank == 0 and not errors:
                for action in after:
                    try:
                        action()
                    except BaseException as err:  # (the checkpoint is committed; what failed after it is reported)
                        pending._error = f"process 0 after committing: {type(err).__name__}: {err}"

    def _agree(self, writer: io.CheckpointWriter, meta: dict[str, Any], error: str | None, group: Any) -> list[str]:
        """Every process's write error (none: process 0 commits), the same list on every process."""
        rank, world = self.strategy.rank, self.strategy.world_size
        everyone = _gather((writer.files, error), world, group)
        errors = [e for _, e in everyone if e is not None]
        if rank == 0 and not errors:
            try:
                writer.commit(meta, [files for files, _ in everyone])
            except BaseException as err:
                errors.append(f"process 0 committing: {type(err).__name__}: {err}")
        return list(_broadcast(errors, world, group))

    def _same_directory(self, writer: io.CheckpointWriter) -> None:
        """Every process waits here until process 0 cleared the staging, and all refuse a checkpoint directory that
        differs between them (`checkpoint_io.check_same_directory`), before any of them writes: one collective."""
        if self.strategy.world_size == 1:
            return
        try:
            io.check_same_directory(self.strategy.all_gather_object(str(writer.final)), "save_state")
        except ValueError:
            if self.strategy.rank == 0:  # nothing stays behind of a save that never began
                shutil.rmtree(writer.staging, ignore_errors=True)
            raise

    def _background_group(self) -> Any:
        """A gloo group of all processes for the background part (created once, by every process in step)."""
        if self.strategy.world_size == 1:
            return None
        if self._group is None:
            import torch.distributed as dist

            if not dist.is_initialized():
                raise NotImplementedError(
                    f"async_save=True needs torch.distributed for its background commit; strategy {self.strategy.name!r} "
                    "runs its processes without it. Save synchronously (async_save=False)"
                )
            timeout = self.strategy.timeout  # the run's (a new group gets the backend's default: 30 minutes for gloo)
            self._group = dist.new_group(backend="gloo", timeout=None if timeout is None else datetime.timedelta(seconds=timeout))
        return self._group

    def close(self) -> None:
        """Wait for the save in flight and release the background group (before the process group goes) and the
        staging memory."""
        try:
            self.wait()
        finally:
            self.staging.close()
            if self.in_process and (process := running_writer()) is not None:
                process.forget(self.staging)
            if self._group is not None:
                import torch.distributed as dist

                if dist.is_initialized():
                    dist.destroy_process_group(self._group)
                self._group = None


_LOCK = threading.Lock()


def _gather(obj: Any, world: int, group: Any) -> list[Any]:
    if world == 1:
        return [obj]
    import torch.distributed as dist

    out: list[Any] = [None] * world
    dist.all_gather_object(out, obj, group=group)
    return out


def _broadcast(obj: Any, world: int, group: Any) -> Any:
    if world == 1:
        return obj
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]
