"""Checkpoint files: one directory per checkpoint, written atomically, read without unpickling arbitrary objects.

The names are the checkpoint store's (`strategies.checkpoint_store`, which runs every save and knows where checkpoints
go); this module writes and reads the files. A checkpoint directory (`Accelerator.save_state`; a `Trainer` adds
``hparams.json`` and its state in ``extra_state.json``)::

    model.safetensors / model_1.safetensors ...     full state dicts, unwrapped keys (single, DDP)
    optimizer.bin / optimizer_1.bin ...             torch.save, loaded with weights_only=True (single, DDP)
    sharded/                                        FSDP: model and optimizer shards, torch.distributed.checkpoint
    scheduler.bin / scheduler_1.bin ...             torch.save, loaded with weights_only=True
    scaler.bin                                      fp16 loss scaler (when used)
    custom_checkpoint_0.bin ...                     objects given to register_for_checkpointing
    random_states_<rank>.safetensors                torch/cuda RNG tensors; python/numpy states in its metadata
    dataloaders.json, extra_state.json              JSON
    manifest.json                                   written last: size and hash of every file, metadata

`CheckpointWriter` stages it in ``.<name>.partial`` and hashes each file in the pass that writes it (DCP's shard
files too); `CheckpointReader` checks each file against the manifest in the pass that reads it, before any of it
is used (a ``torch.save`` file is parsed into new memory while it is hashed, and returned only once checked). The hash (xxh3-128 by default, SHA-256 as an option) is `strategies.checkpoint_hash`'s.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from strategies.checkpoint_files import StagedFiles
from strategies.checkpoint_formats import (
    CheckpointError,
    capture_rng_state,
    indexed,
    load_safetensors,
    move_into_place,
    parse_safetensors,
    read_json,
    restore_rng_state,
    save_safetensors,
    tensor_bytes,
    torch_load,
    torch_save,
    without_zip_crc,
    write_json_durably,
    write_safetensors,
)
from strategies.checkpoint_hash import (
    HASHES,
    LEGACY_HASH,
    HashingReadFile,
    MemoryFile,
    choose_hash,
    digest_of,
    hash_file,
    map_file,
)
from strategies.materialize import is_sharded_module, load_safetensors_slices

# RNG states -----------------------------------------------------------------------------------------------


# One checkpoint directory: staged, hashed while written, one manifest written last -------------------------

MANIFEST_NAME = "manifest.json"
FORMAT_NAME = "trainwright-checkpoint"
FORMAT_VERSION = 3  # 3: the manifest names its hash ("hash", a "digest" per file); 2: a "sha256" per file
LEGACY_MARKER = "checkpoint.json"  # format 1: an Accelerator directory marked complete by this file, without hashes


class CheckpointWriter(StagedFiles):
    """Writes one checkpoint directory: every file goes into the hidden ``.<name>.partial`` sibling, hashed in
    the pass that writes it (no file is read back), and `commit` writes ``manifest.json`` (sizes, digests,
    metadata) last, flushes, and renames the directory into place. A crash at any point leaves ``<name>`` as it was.

    Every process makes its own writer for the same directory; rank 0 `commit`s with the others' entries.

    Args:
        final: the checkpoint directory.
        algorithm: the hash, ``"xxh3_128"`` or ``"sha256"`` (see `strategies.checkpoint_hash`); default
            ``$TRAINWRIGHT_CHECKPOINT_HASH``, else ``"xxh3_128"``. Every process must use the same.
    """

    def __init__(self, final: str | os.PathLike[str], *, algorithm: str | None = None) -> None:
        final = Path(final).absolute()
        super().__init__(final.parent / f".{final.name}.partial", choose_hash(algorithm), final)
        self.group: Any = None  # the process group of sharded writes (None: the default; a background save's own)

    def clear_staging(self) -> None:
        """Remove what crashed saves left next to the target (rank 0, before the others write), then make the staging directory."""
        if self.final.exists() and not self.final.is_dir():
            raise FileExistsError(f"cannot save a checkpoint to {str(self.final)!r}: it is a file; pass a directory path")
        if self.final.parent.is_dir():
            for stale in self.final.parent.iterdir():
                if stale.name.startswith(".") and stale.name.endswith((".partial", ".partial.tmp")) and stale.is_dir():
                    shutil.rmtree(stale, ignore_errors=True)
        self.staging.mkdir(parents=True)

    def save_safetensors(self, name: str, state: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
        self.write_file(name, lambda out: write_safetensors(out, state, metadata), tensor_bytes(state))

    def save_torch(self, name: str, obj: Any) -> None:
        def produce(out: Any) -> None:  # (a HashingFile)
            with without_zip_crc():
                torch.save(obj, out)

        self.write_file(name, produce, tensor_bytes(obj))

    def save_json(self, name: str, data: Any) -> None:
        self.write_file(name, lambda out: out.write(json.dumps(data, indent=1, sort_keys=True).encode()))

    def save_rng_state(self, name: str) -> None:
        tensors, meta = capture_rng_state()
        self.save_safetensors(name, tensors, metadata=meta)

    def save_dcp(self, name: str, state: dict[str, Any]) -> None:
        """Every process writes its part of `state` into the folder `name` with `torch.distributed.checkpoint`
        (collective; DCP's own files, loadable by a plain ``dcp.load``), each file hashed as it is written."""
        import torch.distributed.checkpoint as dcp

        from strategies.dcp_storage import HashingWriter  # lazy: torch.distributed.checkpoint takes a second to import

        def flush(fd: int, path: Path) -> None:
            self.flush_later(fd, path.relative_to(self.staging).as_posix(), path.stat().st_size)

        storage = HashingWriter(self.staging / name, self.algorithm, flush=flush)
        with without_zip_crc():  # (DCP torch.saves each item into its shard file)
            dcp.save(state, storage_writer=storage, process_group=self.group)
        for path, (size, digest) in storage.written.items():
            self.files[path.relative_to(self.staging).as_posix()] = {"size": size, "digest": digest}
        self.flush_folders(f"{name}/.metadata")  # (DCP renamed its .metadata after that file was flushed)

    def commit(self, meta: dict[str, Any], others: Sequence[dict[str, dict[str, Any]]] = ()) -> Path:
        """Write the manifest (this rank's files plus `others`, which each process `sync`ed), flush, and move the
        directory into place."""
        self.sync()
        files = dict(self.files)
        for entries in others:
            files.update(entries)
        manifest = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, **meta, "hash": self.algorithm,
                    "files": dict(sorted(files.items()))}
        write_json_durably(self.staging / MANIFEST_NAME, manifest, folder=self.staging)  # (and the staging directory)
        move_into_place(self.staging, self.final, flushed=True)
        return self.final


# Reading: the manifest first (names and sizes), then each file checked in the pass that reads it -----------


def read_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate the manifest of a checkpoint directory (no file contents are checked).

    Format-1 Accelerator directories (``checkpoint.json``, no hashes) are read too, as a manifest without
    ``files``.

    Raises:
        FileNotFoundError: `directory` does not exist.
        CheckpointError (a ValueError): it is not a complete checkpoint.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"checkpoint {str(directory)!r} does not exist; pass a checkpoint directory (or 'last'/'best')")
    path = directory / MANIFEST_NAME
    if not path.is_file():
        if (directory / LEGACY_MARKER).is_file():
            legacy = read_json(directory / LEGACY_MARKER)
            if isinstance(legacy, dict):
                return legacy
        raise CheckpointError(
            f"{str(directory)!r} is not a complete checkpoint: it has no {MANIFEST_NAME} (the file written last, so the "
            "save was interrupted or this is not a checkpoint directory); pass a directory written by "
            "Trainer.save_checkpoint, ModelCheckpoint or Accelerator.save_state, or ckpt_path='last'"
        )
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"checkpoint {str(directory)!r} has an unreadable {MANIFEST_NAME}: {err}") from err
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME or not isinstance(manifest.get("files"), dict):
        raise CheckpointError(f"{str(path)!r} is not a {FORMAT_NAME} manifest; the checkpoint is damaged or was not written by Trainwright")
    version = manifest.get("format_version", 0)
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {str(directory)!r} has format version {version!r}, newer than this Trainwright reads "
            f"({FORMAT_VERSION}); upgrade Trainwright to load it"
        )
    if manifest.get("hash", LEGACY_HASH) not in HASHES:
        raise CheckpointError(
            f"checkpoint {str(directory)!r} is hashed with {manifest['hash']!r}, which this Trainwright does not know (it "
            f"knows {', '.join(map(repr, HASHES))}); upgrade Trainwright to load it"
        )
    return manifest


def _digest(manifest: dict[str, Any], entry: Any) -> Any:
    """The digest a manifest records for one file: ``digest`` (format 3), or ``sha256`` (format 2, no ``hash``)."""
    return entry.get("digest" if "hash" in manifest else LEGACY_HASH) if isinstance(entry, dict) else None


def _refusal(directory: Path, problems: Sequence[str]) -> CheckpointError:
    return CheckpointError(
        f"refusing to load checkpoint {str(directory)!r}: its files do not match its manifest ({'; '.join(problems)}). "
        "It was damaged or tampered with after saving; load an intact checkpoint"
    )


def _split(share: tuple[int, int, Any] | None) -> tuple[int, int, Any]:
    """``(rank, world_size, all_gather_object)``, or ``(0, 1, None)`` for one process."""
    return share if share is not None and share[1] > 1 else (0, 1, None)


def verify_checkpoint(
    directory: str | os.PathLike[str], *, share: tuple[int, int, Any] | None = None, hashes: bool = True,
    what: str = "verify_checkpoint",
) -> dict[str, Any]:
    """Check that every file of the checkpoint matches its manifest; return the manifest.

    A load does not need this first read: `open_checkpoint` checks names and sizes, and its `CheckpointReader`
    checks each file's digest in the pass that reads it.

    Args:
        directory: the checkpoint directory.
        hashes: compare digests (reads every file once); False compares only names and sizes.
        share: ``(rank, world_size, all_gather_object)`` to split the hashing across the processes (each
            hashes every ``world_size``-th file) and agree on the result, in one collective that also checks that
            every process names the same directory; every process must then call it.
        what: the caller named in the error when the processes pass different directories.

    Raises:
        CheckpointError (a ValueError): a file was changed, added or removed since the checkpoint was written
            (on every process, when shared).
        ValueError: the processes passed different directories (on every process).
    """
    directory = Path(directory)
    rank, world, gather = _split(share)
    if gather is None:
        manifest, problems = _check_files(directory, hashes, rank, world)
    else:
        failure: Exception | None = None
        try:
            manifest, problems = _check_files(directory, hashes, rank, world)
        except (OSError, ValueError) as err:  # raised on every process below, not here alone (the others would wait)
            manifest, problems, failure = {}, [], err
        everyone = gather((str(directory.absolute()), tuple(problems), None if failure is None else str(failure)))
        check_same_directory([path for path, _, _ in everyone], what)
        if failure is not None:
            raise failure
        failed = [(r, error) for r, (_, _, error) in enumerate(everyone) if error is not None]
        if failed:
            raise CheckpointError(f"process {failed[0][0]} cannot open checkpoint {str(directory)!r}: {failed[0][1]}")
        problems = sorted({problem for _, found, _ in everyone for problem in found})
    if problems:
        raise _refusal(directory, problems)
    return manifest


def _check_files(directory: Path, hashes: bool, rank: int, world: int) -> tuple[dict[str, Any], list[str]]:
    """The manifest, and what this process finds wrong with the names, sizes (its share) and digests (if `hashes`)."""
    manifest = read_manifest(directory)
    expected = manifest.get("files")
    if expected is None:  # format 1 Accelerator directory: complete, but without hashes to check
        return manifest, []
    present = {p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file()} - {MANIFEST_NAME}
    problems = [f"{name} is missing" for name in sorted(set(expected) - present)]
    problems += [f"{name} was added" for name in sorted(present - set(expected))]
    algorithm = manifest.get("hash", LEGACY_HASH)
    for name in sorted(present & set(expected))[rank::world]:
        entry, path = expected[name], directory / name
        if not isinstance(entry, dict) or path.stat().st_size != entry.get("size") or (
            hashes and hash_file(path, algorithm) != _digest(manifest, entry)
        ):
            problems.append(f"{name} was modified")
    return manifest, problems


def check_same_directory(paths: Sequence[str], what: str) -> None:
    """Refuse (on every process: each calls it with every process's path) a checkpoint directory that differs
    between the processes: a checkpoint is one directory each process writes its part into (with
    ``manifest.json``, written last by the main process), so the others' directories would stay incomplete.
    Accelerate's own data-loop test gives each process its own ``tempfile.TemporaryDirectory()``; the other process
    then failed in ``load_state`` ("no manifest.json") and this one in a collective with gloo's "Connection reset by
    peer"."""
    normalized = [os.path.normpath(path) for path in paths]
    if len(set(normalized)) > 1:
        listed = ", ".join(f"rank {rank} {given!r}" for rank, given in enumerate(normalized))
        raise ValueError(
            f"{what}() got a different directory on each process ({listed}); a checkpoint is one directory that every "
            "process writes its part into (on several machines: the same path on each). Pass the same path on every "
            "process: a tempfile.TemporaryDirectory() made on each process is not; make it on the main process and share "
            "its name (accelerator.gather_object([name])[0] or broadcast_object_list), or use "
            "ProjectConfiguration(automatic_checkpoint_naming=True)"
        )


def open_checkpoint(
    directory: str | os.PathLike[str], *, share: tuple[int, int, Any] | None = None, hashes: bool = True,
    what: str = "load_state",
) -> CheckpointReader:
    """Read the manifest of a checkpoint, check the names and sizes of its files (no file is read), and return the
    `CheckpointReader` that checks each file's digest as a load reads it.

    Args:
        directory: the checkpoint directory.
        share: ``(rank, world_size, all_gather_object)``: the processes agree on every check (each stats every
            ``world_size``-th file here; see `CheckpointReader.agreed` for the rest) and on the directory, in one
            collective; every process must call it.
        hashes: False reads the files without checking their digests (names and sizes are still checked).
        what: the caller named in the error when the processes pass different directories.

    Raises:
        CheckpointError (a ValueError): a file is missing, was added or changed size (on every process, when shared).
        ValueError: the processes passed different directories (on every process).
    """
    manifest = verify_checkpoint(directory, share=share, hashes=False, what=what)
    return CheckpointReader(directory, manifest, hashes=hashes, share=share)


class CheckpointReader:
    """Reads the files of one checkpoint directory, each checked against the manifest in the pass that reads it.

    Each file a load reads comes through a method here: mapped, hashed (the one pass that reads it from disk),
    compared with its manifest digest, and only then parsed from memory, so a damaged file is refused with a
    `CheckpointError` naming it before any of its bytes are used (`torch_load` parses into new memory while the
    file is hashed, and returns nothing before the check). What a load applied from the files it read before stays
    applied. Inside `agreed()` the processes finish together: a file no process read is hashed then (split across
    the processes), and a problem any process found is raised on every process.

    A reader made from a bare directory (``CheckpointReader(path)``) checks nothing: no manifest, no digests.
    """

    def __init__(
        self, directory: str | os.PathLike[str], manifest: dict[str, Any] | None = None, *, hashes: bool = True,
        share: tuple[int, int, Any] | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.manifest = manifest or {}
        self.expected: dict[str, Any] | None = self.manifest.get("files")  # None: nothing to check (format 1, bare)
        self.algorithm = self.manifest.get("hash", LEGACY_HASH)
        self.hashes = hashes and self.expected is not None
        self.share = share
        self.checked: set[str] = set()  # the files this process read and found intact
        self._ahead: dict[str, tuple[Any, Future[str]]] = {}  # files mapped, and hashed ahead of their use

    def path(self, name: str) -> Path:
        return self.directory / name

    def prefetch(self, names: Sequence[str]) -> None:
        """Map the files `names` and hash them ahead, in this order, on a helper thread (the hash releases the GIL)
        while the load waits on the other processes or parses and copies the files before them: `read` then waits
        only for a file's own check, and nothing of a file is used before it. Each file is still read once."""
        if not self.hashes:
            return
        for name in names:
            if name not in self._ahead and name in (self.expected or {}):
                self._ahead[name] = self._hash_ahead(name)

    def _hash_ahead(self, name: str) -> tuple[Any, Future[str]]:
        data = map_file(self.directory / name)[0]
        return data, _hashers().submit(digest_of, data, self.algorithm)

    def close(self, *, check: bool = True) -> None:
        """Stop hashing ahead: files not started are dropped; those hashed already are checked (a file read is a file
        checked, whether or not the load used it), raising `CheckpointError` for a damaged one (unless not `check`)."""
        ahead, self._ahead = self._ahead, {}
        for _, future in ahead.values():
            future.cancel()
        for name, (data, future) in ahead.items():
            if not future.cancelled():
                future.exception()  # (waits: no file stays mapped by a helper past the load)
            if check and not future.cancelled() and future.exception() is None:
                self._check(name, len(data), future.result())

    def _check(self, name: str, size: int, digest: str) -> None:
        entry = (self.expected or {}).get(name)
        if entry is None:
            raise _refusal(self.directory, [f"{name} is not in its manifest"])
        if size != entry.get("size") or digest != _digest(self.manifest, entry):
            raise _refusal(self.directory, [f"{name} was modified"])
        self.checked.add(name)

    def read(self, name: str) -> Any:
        """The bytes of the file `name` (relative to the checkpoint directory), checked: a buffer mapping the file,
        hashed in the pass that reads it from disk (`map_file`), so parsing it afterwards reads memory."""
        if not self.hashes:
            return map_file(self.directory / name)[0]
        ahead = self._ahead.pop(name, None)
        data, digest = (ahead[0], ahead[1].result()) if ahead is not None else map_file(self.directory / name, self.algorithm)
        self._check(name, len(data), str(digest))
        return data

    def _prefetch_paths(self, paths: list[Path]) -> None:
        self.prefetch([path.relative_to(self.directory).as_posix() for path in paths])

    def _open(self, path: Path) -> MemoryFile:
        return MemoryFile(self.read(path.relative_to(self.directory).as_posix()))

    def torch_load(self, name: str, map_location: Any = "cpu", *, allowed: Sequence[type] = ()) -> Any:
        """`torch_load` of the file `name` (tensors, plain containers and the `allowed` classes), returned once the
        file is checked.

        Parsed into new memory without executing anything (``weights_only``) while it is hashed: on the helper
        thread when the file was `prefetch`ed (a free core hashes it meanwhile), else in the pass that reads it
        (`HashingReadFile`: each slice hashed right after it is read into the new tensor, while in the cache).
        Nothing parsed is returned before the digest matched, and a parse that failed on a damaged file is reported
        as the damage.
        """
        if not self.hashes:
            return torch_load(self.path(name), map_location=map_location, allowed=allowed)
        if name not in (self.expected or {}):
            raise _refusal(self.directory, [f"{name} is not in its manifest"])
        ahead = self._ahead.pop(name, None)
        with contextlib.ExitStack() as stack:
            if ahead is None:
                stream = HashingReadFile(stack.enter_context(open(self.path(name), "rb", buffering=0)), self.algorithm)
                finish = stream.finish
            else:
                stream = None
                finish = lambda: (len(ahead[0]), ahead[1].result())  # noqa: E731
            try:
                state = torch_load(self.path(name), map_location=map_location, data=stream, allowed=allowed)
            except Exception:
                self._check(name, *finish())  # (damage explains the failure: refuse as damaged)
                raise
            self._check(name, *finish())
        return state

    def read_json(self, name: str) -> Any:
        data = bytes(self.read(name))
        try:
            return json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise CheckpointError(f"cannot read {self.path(name)}: {err}; the checkpoint is damaged or was tampered with") from err

    def safetensors(self, name: str) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
        """The tensors (on the CPU, views of one buffer) and metadata of the safetensors file `name`, checked first."""
        data = self.read(name)
        return parse_safetensors(torch.frombuffer(data, dtype=torch.uint8) if len(data) else torch.empty(0, dtype=torch.uint8), self.path(name))

    def load_safetensors(self, name: str, device: Any = "cpu") -> dict[str, torch.Tensor]:
        tensors, _ = self.safetensors(name)
        if torch.device(device).type != "cpu":
            tensors = {key: tensor.to(device) for key, tensor in tensors.items()}
        return tensors

    def load_rng_state(self, name: str) -> None:
        restore_rng_state(*self.safetensors(name), self.path(name))

    def dcp_reader(self, name: str) -> Any:
        """A `torch.distributed.checkpoint` storage reader for the folder `name` that checks each file it reads
        (its ``.metadata`` at once, before DCP unpickles it; each shard file before DCP parses any of it)."""
        import torch.distributed.checkpoint as dcp

        from strategies.dcp_storage import CheckingReader  # lazy: torch.distributed.checkpoint takes a second to import

        if not self.hashes:
            return dcp.FileSystemReader(self.directory / name)
        return CheckingReader(self.directory / name, self._open, self._prefetch_paths)

    def _check_split(self, names: list[str]) -> None:
        rank, world, gather = _split(self.share)
        problems = [f"{name} was modified" for name in names[rank::world]
                    if hash_file(self.directory / name, self.algorithm) != _digest(self.manifest, self.expected[name])]  # type: ignore[index]
        if gather is not None:  # (a tuple: a gather joins lists into one)
            problems = sorted({problem for found in gather(tuple(problems)) for problem in found})
        if problems:
            raise _refusal(self.directory, problems)
        self.checked.update(names)

    @contextlib.contextmanager
    def agreed(self) -> Iterator[CheckpointReader]:
        """Load inside this block (every process): at its end, the files no process read are checked, split across
        the processes, and a `CheckpointError` one process met inside it is raised on every process.

        Raises:
            CheckpointError: a file was damaged (on every process, when shared).
        """
        _, _, gather = _split(self.share)
        failure: CheckpointError | None = None
        try:
            yield self
            self.close()  # (what was hashed ahead and not read is checked too)
        except CheckpointError as err:
            self.close(check=False)
            if gather is None:
                raise
            failure = err
        except BaseException:
            self.close(check=False)
            raise
        checked = set(self.checked)
        if gather is not None:
            order = sorted(self.expected or {})  # (the same on every process: names travel as their places in it)
            mine = tuple(i for i, name in enumerate(order) if name in self.checked)
            everyone = gather((str(failure) if failure is not None else None, mine))
            errors = [error for error, _ in everyone if error is not None]
            if failure is not None:
                raise failure
            if errors:
                raise CheckpointError(errors[0])
            checked = {order[i] for _, places in everyone for i in places}
        unread = sorted(set(self.expected or {}) - checked)  # the same on every process
        if self.hashes and unread:
            self._check_split(unread)


_HASHERS: dict[int, ThreadPoolExecutor] = {}


def _hashers() -> ThreadPoolExecutor:
    """The thread that hashes files ahead of a load (`CheckpointReader.prefetch`), made once per process (a forked
    child makes its own)."""
    pid = os.getpid()
    if pid not in _HASHERS:
        _HASHERS[pid] = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-hash")
    return _HASHERS[pid]


def core_to_spare() -> bool:
    """Whether a core is idle now: the threads runnable on the machine at this instant, this one included, at least
    one below the cores this process may use (where the system does not say, the load average of the last minute).
    Hashing on the helper thread then runs beside the parse instead of after it; without one, hashing in the pass
    that reads a file costs the least CPU. (The instant, not the minute's average: a load follows what ran before it,
    a job's setup or its other processes' startup, by seconds, and the average still counts them for a minute.)"""
    try:
        cores = len(os.sched_getaffinity(0))
        runnable = runnable_now()
        return (runnable if runnable is not None else os.getloadavg()[0]) <= cores - 1
    except (AttributeError, OSError):  # (no affinity or load average on this platform)
        return False


def runnable_now() -> int | None:
    """The threads runnable on the machine at this instant, the calling one included (Linux's ``/proc/loadavg``,
    its fourth field's first number); None where the system does not say."""
    try:
        with open("/proc/loadavg") as stats:
            return int(stats.read().split()[3].split("/")[0])
    except (OSError, IndexError, ValueError):
        return None


def is_complete(directory: str | os.PathLike[str]) -> bool:
    """True when `directory` holds a finished checkpoint (its manifest exists and lists files that exist)."""
    try:
        manifest = read_manifest(directory)
    except (OSError, ValueError):
        return False
    return all((Path(directory) / name).is_file() for name in manifest.get("files") or {})


# --------------------------------------------------------------------------------------------- exported weights
def save_model_weights(
    state: dict[str, torch.Tensor], directory: Path, *, max_shard_size: int | str = "10GB", safe_serialization: bool = True,
    weights_name: str = "model.safetensors",
) -> list[str]:
    """Save a state dict, sharded by `max_shard_size` with a ``*.index.json`` when it does not fit one file."""
    limit = parse_size(max_shard_size)
    directory.mkdir(parents=True, exist_ok=True)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for key, tensor in state.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > limit:
            shards.append({})
            size = 0
        shards[-1][key] = tensor
        size += nbytes
    if not safe_serialization:
        weights_name = weights_name.replace(".safetensors", ".bin")
    stem, ext = weights_name.rsplit(".", 1)
    names = [weights_name] if len(shards) == 1 else [f"{stem}-{i + 1:05d}-of-{len(shards):05d}.{ext}" for i in range(len(shards))]
    for name, shard in zip(names, shards):
        if safe_serialization:
            save_safetensors(shard, directory / name)
        else:
            torch_save(shard, directory / name)
    if len(shards) > 1:
        index = {
            "metadata": {"total_size": sum(t.numel() * t.element_size() for t in state.values())},
            "weight_map": {key: name for name, shard in zip(names, shards) for key in shard},
        }
        write_json_durably(directory / f"{weights_name}.index.json", index)
    return names


def parse_size(size: int | str) -> int:
    """``"5GB"`` → bytes (also KB/MB/GB/TB, KiB/MiB/GiB); ints pass through."""
    if isinstance(size, int):
        if size <= 0:
            raise ValueError(f"max_shard_size={size} must be positive")
        return size
    text = str(size).strip().upper()
    units = {"TIB": 2**40, "GIB": 2**30, "MIB": 2**20, "KIB": 2**10, "TB": 10**12, "GB": 10**9, "MB": 10**6, "KB": 10**3, "B": 1}
    for unit, factor in units.items():
        if text.endswith(unit):
            try:
                return int(float(text[: -len(unit)]) * factor)
            except ValueError:
                break
    raise ValueError(f"max_shard_size={size!r} is not a size; write it like '5GB', '500MB' or an int number of bytes")


# Sharded states (torch.distributed.checkpoint) ------------------------------------------------------------

SHARDED_DIR = "sharded"
DEEPSPEED_DIR = "deepspeed"  # the DeepSpeed engine's own checkpoint (strategies.deepspeed), next to model.safetensors


def no_exported_weights(directory: Path, name: str) -> str:
    """Why a DeepSpeed checkpoint saved with ``export_weights=False`` has no weights to load alone, and what to do."""
    return (
        f"checkpoint {str(directory)!r} has no {name}: it was saved by DeepSpeedStrategy(export_weights=False), so it "
        "holds only DeepSpeed's engine files. Resume it with strategy='deepspeed' (which loads those), recover the "
        f"weights with DeepSpeed's {DEEPSPEED_DIR}/zero_to_fp32.py, or save with export_weights=True"
    )


def is_sharded(directory: Path) -> bool:
    """True when `directory` holds its model and optimizer states as a DCP checkpoint (one file per process)."""
    return (Path(directory) / SHARDED_DIR / ".metadata").is_file()


def _distributed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def _owner(models: list[Any], optimizer: torch.optim.Optimizer) -> Any:
    """The model whose parameters `optimizer` steps."""
    params = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for model in models:
        if any(id(p) in params for p in model.parameters()):
            return model
    raise ValueError("an optimizer steps parameters of none of the prepared models; prepare the model it optimizes")


def sharded_state(models: list[Any], optimizers: list[torch.optim.Optimizer], *, flatten: bool = False) -> dict[str, Any]:
    """The models' and optimizers' states as `torch.distributed.checkpoint` saves and loads them (this process's shards).

    `flatten`: each optimizer's state and hyperparameters keyed by parameter name (pipeline stages: processes holding
    different parameters must not share one ``param_groups`` object, which DCP would write once for all of them)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict, get_state_dict

    options = StateDictOptions(flatten_optimizer_state_dict=True) if flatten else None
    if _one_pair(models, optimizers):  # (one call: torch checks the model's options once)
        model_state, optimizer_state = get_state_dict(models[0], optimizers[0], options=options)
        return {"model_0": model_state, "optimizer_0": optimizer_state}
    state: dict[str, Any] = {f"model_{i}": get_model_state_dict(m) for i, m in enumerate(models)}
    for i, opt in enumerate(optimizers):
        state[f"optimizer_{i}"] = get_optimizer_state_dict(_owner(models, opt), opt, options=options)
    return state


def _one_pair(models: list[Any], optimizers: list[torch.optim.Optimizer]) -> bool:
    """One model and the one optimizer that steps it."""
    return len(models) == 1 and len(optimizers) == 1 and _owner(models, optimizers[0]) is models[0]


def load_sharded(
    reader: CheckpointReader, models: list[Any], optimizers: list[torch.optim.Optimizer], *, strict: bool = True, flatten: bool = False,
) -> None:
    """Load a sharded (`sharded_state`) checkpoint into these models and optimizers, resharding to this run's processes.

    Each process checks the shard files it reads as it reads them (`CheckpointReader.dcp_reader`). Works for any
    number of processes, also a plain single process without a process group.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict, set_state_dict

    reader.prefetch(_own_shards(reader))  # checked while the states are gathered and DCP agrees on its plan
    state = sharded_state(models, optimizers, flatten=flatten)
    directory = reader.path(SHARDED_DIR)
    storage = reader.dcp_reader(SHARDED_DIR)  # checks .metadata now
    try:
        dcp.load(state, storage_reader=storage, no_dist=not _distributed())
    except CheckpointException as err:  # (a BaseException) what failed on any process, on every process
        damaged = [exc for exc, _trace in err.failures.values() if isinstance(exc, CheckpointError)]
        if damaged:
            raise CheckpointError(str(damaged[0])) from err
        raise CheckpointError(f"cannot load the sharded states in {directory}: {err}") from err
    except Exception as err:  # missing keys, mismatched shapes
        raise CheckpointError(f"cannot load the sharded states in {directory}: {err}") from err
    if _one_pair(models, optimizers):
        set_state_dict(models[0], optimizers[0], model_state_dict=state["model_0"], optim_state_dict=state["optimizer_0"],
                       options=StateDictOptions(strict=strict, flatten_optimizer_state_dict=flatten))
        return
    for i, model in enumerate(models):
        set_model_state_dict(model, state[f"model_{i}"], options=StateDictOptions(strict=strict))
    for i, opt in enumerate(optimizers):
        set_optimizer_state_dict(_owner(models, opt), opt, state[f"optimizer_{i}"],
                                 options=StateDictOptions(flatten_optimizer_state_dict=flatten))


def _own_shards(reader: CheckpointReader) -> list[str]:
    """The shard files this process wrote, when as many processes saved the checkpoint as this run has: the ones DCP
    plans for this process to read while the layout is unchanged (the plan itself says so only later)."""
    import torch.distributed as dist

    rank, world = (dist.get_rank(), dist.get_world_size()) if _distributed() else (0, 1)
    if reader.manifest.get("world_size") != world:
        return []
    prefix = f"{SHARDED_DIR}/__{rank}_"
    return [name for name in reader.expected or {} if name.startswith(prefix) and name.endswith(".distcp")]


def safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """The tensor shapes a safetensors file holds, read from its header (no tensor is loaded)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}  # noqa: SIM118  (safe_open is no dict)
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"cannot read {path} as safetensors: {err}; the file is damaged or was tampered with") from err


def check_state_fits(shapes: Mapping[str, Sequence[int]], module: torch.nn.Module, source: Path, *, strict: bool = True) -> None:
    """Raise `CheckpointError` before anything is loaded when the tensors of `source` (name -> shape) do not fit `module`.

    Torch's own error comes after the matching tensors were already copied in; this check keeps the model as it
    was and says which checkpoint and which model disagree.
    """
    own = module.state_dict(keep_vars=True)
    # ds_shape: the full shape of a DeepSpeed ZeRO-3 partitioned parameter (its own shape is empty)
    own_shapes = {key: tuple(getattr(value, "ds_shape", value.shape)) for key, value in own.items() if hasattr(value, "shape")}
    saved = {key: tuple(shape) for key, shape in shapes.items()}
    differ = [f"{key}: {saved[key]} in the checkpoint, {own_shapes[key]} in the model"
              for key in sorted(saved) if key in own_shapes and saved[key] != own_shapes[key]]
    problems = differ[:5]
    if strict and set(own) - set(saved):
        problems.append(f"missing in the checkpoint: {_listed(set(own) - set(saved))}")
    if strict and set(saved) - set(own):
        problems.append(f"not in the model: {_listed(set(saved) - set(own))}")
    if problems:
        fix = "" if differ else ", or pass strict=False to load only the keys both have"
        raise CheckpointError(
            f"{str(source)!r} holds the weights of another model than this {type(module).__name__}: " + "; ".join(problems)
            + f". Nothing was loaded. Build the model the checkpoint was saved from{fix}"
        )


def _listed(keys: set[str]) -> str:
    names = sorted(keys)
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def load_weights(
    directory: Path, module: torch.nn.Module, *, device: Any = "cpu", strict: bool = True, index: int = 0, load_full: Any = None
) -> None:
    """Load the weights of model `index` of a checkpoint directory into `module` (full or sharded format).

    `load_full(module, state, strict)` loads a full state dict (default: ``module.load_state_dict``; a sharding
    strategy passes its `load_module_state_dict`).

    The one weights loader of both faces: evaluation from a checkpoint, ``TrainModule.load_from_checkpoint``
    and resuming all read weights through it.
    """
    directory = Path(directory)
    if is_sharded(directory):
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

        state = {f"model_{index}": get_model_state_dict(module)}
        try:
            dcp.load(state, checkpoint_id=str(directory / SHARDED_DIR), no_dist=not _distributed())
        except Exception as err:
            raise CheckpointError(f"cannot load the sharded weights in {directory}: {err}") from err
        set_model_state_dict(module, state[f"model_{index}"], options=StateDictOptions(strict=strict))
        return
    name = indexed("model", index, "safetensors")  # (strategies.checkpoint_store.model_file)
    weights = directory / name
    if not weights.is_file():
        if (directory / DEEPSPEED_DIR).is_dir():
            raise FileNotFoundError(no_exported_weights(directory, name))
        raise FileNotFoundError(
            f"checkpoint {str(directory)!r} has no {name} and no sharded states; pass a directory written by "
            "Trainer.save_checkpoint or Accelerator.save_state"
        )
    if is_sharded_module(module):  # each process reads only its slices of the file
        check_state_fits(safetensors_shapes(weights), module, weights, strict=strict)
        load_safetensors_slices(weights, module)
        return
    full = load_safetensors(weights, device=str(torch.device(device)))
    if load_full is None:
        check_state_fits({k: v.shape for k, v in full.items()}, module, weights, strict=strict)  # `load_full` sees through wrappers
        module.load_state_dict(full, strict=strict)
    else:
        load_full(module, full, strict=strict)
