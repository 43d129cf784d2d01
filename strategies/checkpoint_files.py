"""The files of one checkpoint's staging directory: each written and hashed in one pass, flushed to disk together.

No torch here (the standard library and the hash): the checkpoint writer process (`strategies.checkpoint_process`)
writes through this without importing torch, and `strategies.checkpoint_io.CheckpointWriter` builds on it.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from strategies.checkpoint_hash import HashingFile, hash_file


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class StagedFiles:
    """Writes files into the directory `staging`, each hashed in the pass that writes it (`files`: name -> size and
    digest), and flushes them to disk in the background (`sync` waits for that).

    Args:
        staging: the directory (it exists).
        algorithm: the hash, one of `strategies.checkpoint_hash.HASHES`.
        final: the checkpoint the files are for (named in errors).
    """

    def __init__(self, staging: Path, algorithm: str, final: Path) -> None:
        self.staging, self.algorithm, self.final = staging, algorithm, final
        self.files: dict[str, dict[str, Any]] = {}
        self._flushing: list[tuple[str, int, Future[None]]] = []  # (name, bytes, its fsync in the background)
        self._pool: ThreadPoolExecutor | None = None

    def write_file(self, name: str, produce: Callable[[HashingFile], Any], nbytes: int = 0) -> None:
        """Write the file `name`: `produce(out)` writes its bytes to `out`, which hashes them on the way."""
        path = self.staging / name
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "wb") as fh:
                out = HashingFile(fh, self.algorithm)
                produce(out)
                fh.flush()
                self.flush_later(os.dup(fh.fileno()), name, nbytes)
        except OSError as err:
            self.raise_if_full(err, name, nbytes)
            raise
        self.files[name] = {"size": out.size, "digest": out.hexdigest()}

    def hash_written(self, names: list[str]) -> None:
        """Record files a library wrote into the staging directory by itself: these are read back once to hash them."""
        for name in names:
            path = self.staging / name
            self.files[name] = {"size": path.stat().st_size, "digest": hash_file(path, self.algorithm)}
            self.flush_later(os.open(path, os.O_RDONLY), name, 0)  # (the library may not have flushed it)

    def raise_if_full(self, err: OSError, name: str, nbytes: int) -> None:
        """Turn a full disk into an error that says so (and remove the partial checkpoint); other errors pass."""
        if err.errno not in (errno.ENOSPC, errno.EDQUOT):
            return
        self.sync(raise_errors=False)
        free = shutil.disk_usage(self.staging.parent).free
        shutil.rmtree(self.staging, ignore_errors=True)
        raise OSError(
            err.errno,
            f"no space left to save checkpoint {str(self.final)!r}: writing {name} (about {nbytes / 1e6:.1f} MB) failed with "
            f"{free / 1e6:.1f} MB free on that device. The partial checkpoint was removed and earlier checkpoints are "
            "untouched; free space, lower ModelCheckpoint(save_top_k=...), or save to another directory",
        ) from err

    def flush_later(self, fd: int, name: str, nbytes: int) -> None:
        """fsync (and close) `fd`, a written file's, in the background: fsync waits on the disk, so the files of a
        checkpoint reach it together (one journal commit for many small files) while the next ones are written."""
        self._flushing.append((name, nbytes, self._fsync_pool().submit(_fsync_and_close, fd)))
        self.flush_folders(name)

    def flush_folders(self, name: str) -> None:
        """Flush, in the background too, the entry of `name` in each folder of the staging directory that holds it
        (the staging directory's own: the commit), beside the files' flushes: a journaling file system serves the
        waits that overlap with one commit."""
        for folder in (self.staging / name).parents:
            if self.staging in folder.parents:
                self._flushing.append((name, 0, self._fsync_pool().submit(fsync_dir, folder)))

    def _fsync_pool(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="checkpoint-fsync")
        return self._pool

    def sync(self, *, raise_errors: bool = True) -> None:
        """Wait until every file written here is on disk (before its entries go to the manifest)."""
        flushing, self._flushing = self._flushing, []
        for name, nbytes, future in flushing:
            try:
                future.result()
            except OSError as err:
                if raise_errors:
                    self.raise_if_full(err, name, nbytes)
                    raise
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None


def _fsync_and_close(fd: int) -> None:
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
