"""`torch.distributed.checkpoint` file storage that hashes each file in the pass that writes it, and checks it in
the pass that reads it.

The files are DCP's own (``__<rank>_<n>.distcp``, ``.metadata``), byte for byte: a plain ``dcp.load`` reads them.
Only the file system object behind DCP's `FileSystemWriter` / `FileSystemReader` is ours: its write streams hash
what goes through them (`HashingFile`), and its read streams are the bytes of the whole file, read once and checked
against the manifest by the caller before DCP parses any of it: the whole file is mapped and hashed (the one
read from disk), then DCP copies its items out of the mapping.
"""

from __future__ import annotations

import contextlib
import io
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.planner import LoadPlan

from strategies.checkpoint_hash import HashingFile, MemoryFile

METADATA_NAME = ".metadata"
_BUFFER = 1 << 16


class _HashingFileSystem(FileSystem):
    """DCP's local file system, with every file it writes hashed on the way (`written`: path -> (size, digest)) and
    handed to `flush` (a duplicate of its descriptor, and its path) once written."""

    def __init__(self, algorithm: str, flush: Callable[[int, Path], None]) -> None:
        self.algorithm, self.flush = algorithm, flush
        self.written: dict[Path, tuple[int, str]] = {}
        self._lock = threading.Lock()  # DCP may write from several threads (thread_count > 1)

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[io.IOBase]:
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        with Path(path).open(mode) as fh:
            fd = os.dup(fh.fileno())  # DCP closes the stream itself, and renames .metadata.tmp after
            out = HashingFile(fh, self.algorithm)
            try:
                yield out  # type: ignore[misc]  # a file as far as DCP's writer goes
            except BaseException:
                os.close(fd)
                raise
        self.flush(fd, Path(path))
        with self._lock:
            self.written[Path(path)] = (out.size, out.hexdigest())

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        super().rename(path, new_path)  # ".metadata.tmp" -> ".metadata"
        with self._lock:
            if Path(path) in self.written:
                self.written[Path(new_path)] = self.written.pop(Path(path))


class HashingWriter(FileSystemWriter):
    """DCP's `FileSystemWriter` (one file per process), each file hashed as it is written (`written`) and handed to
    `flush(fd, path)` to be flushed to disk (DCP's own fsync, one file after another, is off)."""

    def __init__(self, path: str | os.PathLike[str], algorithm: str, flush: Callable[[int, Path], None]) -> None:
        super().__init__(path, sync_files=False)
        self._hashing = _HashingFileSystem(algorithm, flush)
        self.fs = self._hashing

    @property
    def written(self) -> dict[Path, tuple[int, str]]:
        """Absolute path -> (size, digest) of every file this process wrote."""
        return dict(self._hashing.written)


class _RecordingFileSystem(FileSystem):
    """DCP's local file system whose written files are not written here: each is kept as what `open_sink()` returned
    (`recorded`: path -> sink, in the order written), for the checkpoint writer process to write
    (`strategies.checkpoint_process`). Reads, folders and everything else are the disk's."""

    def __init__(self, open_sink: Callable[[], Any]) -> None:
        self.open_sink = open_sink
        self.recorded: dict[Path, Any] = {}
        self._lock = threading.Lock()  # DCP may write from several threads (thread_count > 1)

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[io.IOBase]:
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        sink = self.open_sink()
        yield sink
        with self._lock:
            self.recorded[Path(path)] = sink

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        with self._lock:  # ".metadata.tmp" -> ".metadata"
            if Path(path) in self.recorded:
                self.recorded[Path(new_path)] = self.recorded.pop(Path(path))
                return
        super().rename(path, new_path)

    def exists(self, path: str | os.PathLike[str]) -> bool:
        return Path(path) in self.recorded or super().exists(path)

    def rm_file(self, path: str | os.PathLike[str]) -> None:
        with self._lock:
            if self.recorded.pop(Path(path), None) is not None:
                return
        super().rm_file(path)


class RecordingWriter(FileSystemWriter):
    """DCP's `FileSystemWriter` (one file per process) whose files are kept as sinks (`recorded`) instead of written:
    DCP plans and agrees with the other processes here, the bytes are written elsewhere."""

    def __init__(self, path: str | os.PathLike[str], open_sink: Callable[[], Any]) -> None:
        super().__init__(path, sync_files=False)
        self._recording = _RecordingFileSystem(open_sink)
        self.fs = self._recording

    @property
    def recorded(self) -> dict[Path, Any]:
        """Absolute path -> sink of every file this process would have written, in the order written."""
        return dict(self._recording.recorded)


class _CheckingFileSystem(FileSystem):
    """DCP's local file system whose read streams are `open`'s: the whole file, checked (or raising) before it is read."""

    def __init__(self, open_checked: Callable[[Path], MemoryFile], opened: dict[Path, MemoryFile]) -> None:
        self.open_checked, self.opened = open_checked, opened

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[io.IOBase]:
        if "r" not in mode:
            raise ValueError(f"a checkpoint being loaded is read-only; DCP asked to open {str(path)!r} with mode {mode!r}")
        stream = self.opened.pop(Path(path), None) or self.open_checked(Path(path))
        # DCP reads each item as its own small zip (many small reads and seeks): served by a buffer in C
        yield io.BufferedReader(stream, buffer_size=_BUFFER)


class CheckingReader(FileSystemReader):
    """DCP's `FileSystemReader` that opens every file through `open_checked` (path -> the file's contents, checked
    against the manifest).

    `.metadata` is opened and checked here, before ``dcp.load`` starts: DCP would turn a damaged one into a
    warning and a generic error, and it is a pickle, which must not be parsed unchecked.
    """

    def __init__(
        self, path: str | os.PathLike[str], open_checked: Callable[[Path], MemoryFile],
        prefetch: Callable[[list[Path]], None] | None = None,
    ) -> None:
        super().__init__(path)
        metadata = Path(path) / METADATA_NAME
        self.fs = _CheckingFileSystem(open_checked, {metadata: open_checked(metadata)})
        self._prefetch = prefetch

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        """The files this process will read are known here: `prefetch` starts checking them while DCP agrees on the
        plan across the processes (waiting on the others), so the reads find them checked."""
        if self._prefetch is not None:
            files = dict.fromkeys(self.path / self.storage_data[item.storage_index].relative_path for item in plan.items)
            self._prefetch(list(files))
        return super().prepare_local_plan(plan)
