"""The hash of checkpoint files: which algorithm, hashing while writing, and reading a file once while hashing it.

Two algorithms, recorded per checkpoint in its manifest (``"hash"``, and a ``"digest"`` per file):

* ``xxh3_128`` (the default; the ``xxhash`` package): about 10 GB/s on one core here, ten times what the disk
  writes, so hashing costs little next to the write. It detects accidental damage — bit rot, a truncated, half
  copied or overwritten file — but it is no cryptographic hash: whoever can change a file can make it match.
* ``sha256``: about 1.4 GB/s, as slow as a fast disk. It also detects deliberate tampering by someone who can
  change the files but not the manifest (say, one kept or signed elsewhere).

A save uses ``TRAINWRIGHT_CHECKPOINT_HASH`` when set (the same on every process), else ``xxh3_128``. Manifests of
format 2 have no ``"hash"`` and a ``"sha256"`` per file; they are read as ``sha256``.
"""

from __future__ import annotations

import hashlib
import io
import mmap
import os
from pathlib import Path
from typing import Any

HASH_ENV = "TRAINWRIGHT_CHECKPOINT_HASH"
DEFAULT_HASH = "xxh3_128"
HASHES = ("xxh3_128", "sha256")
LEGACY_HASH = "sha256"  # format 2: a "sha256" per file, no "hash" in the manifest
_CHUNK = 1 << 22
_SLICE = 1 << 20  # hashed right after it is copied, while it is in the cache


def choose_hash(name: str | None = None) -> str:
    """The algorithm a save uses: `name`, else ``$TRAINWRIGHT_CHECKPOINT_HASH``, else ``xxh3_128``."""
    choice = name or os.environ.get(HASH_ENV) or DEFAULT_HASH
    if choice not in HASHES:
        source = f"{HASH_ENV}={choice!r}" if name is None else f"hash={choice!r}"
        raise ValueError(f"{source} is not a checkpoint hash; choose one of {', '.join(map(repr, HASHES))}")
    return choice


def new_hasher(algorithm: str) -> Any:
    """A fresh hash object (``update``, ``hexdigest``) of `algorithm`, one of `HASHES`."""
    if algorithm == "xxh3_128":
        import xxhash

        return xxhash.xxh3_128()
    if algorithm == "sha256":
        return hashlib.sha256()
    raise ValueError(f"unknown checkpoint hash {algorithm!r}; this Trainwright reads {', '.join(map(repr, HASHES))}")


class HashingFile:
    """A binary file that hashes and counts what is written through it: the one pass that writes a file also hashes it.

    Enough of a file for ``torch.save``, DCP's writer and ``write_safetensors``: `write`, `tell`, `flush`, `fileno`.
    """

    def __init__(self, fh: Any, algorithm: str) -> None:
        self.fh, self.digest, self.size = fh, new_hasher(algorithm), 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.digest.update(view)
        self.size += len(view)
        written: int = self.fh.write(view)
        return written

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        self.fh.flush()

    def fileno(self) -> int:
        fileno: int = self.fh.fileno()
        return fileno

    def close(self) -> None:
        self.fh.close()

    def hexdigest(self) -> str:
        digest: str = self.digest.hexdigest()
        return digest


def hash_file(path: Path, algorithm: str) -> str:
    """The digest of the file at `path` (one read)."""
    hasher = new_hasher(algorithm)
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            hasher.update(chunk)
    digest: str = hasher.hexdigest()
    return digest


def map_file(path: Path, algorithm: str | None = None) -> tuple[Any, str | None]:
    """The bytes of the file at `path`, mapped (no copy: the page cache's, read once as they are used), and their
    digest when an `algorithm` is given: the hash is the one pass that reads them from disk, so parsing the mapping
    afterwards reads from memory.

    The mapping is private (copy-on-write): tensors can view it, writable, without changing the file.
    """
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        data: Any = mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_COPY) if size else b""
    return data, None if algorithm is None else digest_of(data, algorithm)


def digest_of(data: Any, algorithm: str) -> str:
    """The digest of the buffer `data` (releases the GIL while hashing: another thread may parse the same buffer)."""
    hasher = new_hasher(algorithm)
    hasher.update(data)
    digest: str = hasher.hexdigest()
    return digest


class MemoryFile(io.RawIOBase):
    """A read-only binary file over a buffer (a mapped file): what ``torch.load`` and DCP's reader read from, no copy."""

    def __init__(self, buffer: Any) -> None:
        super().__init__()
        self._view, self._pos = memoryview(buffer).cast("B"), 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        out = memoryview(b).cast("B")
        n = max(0, min(len(out), len(self._view) - self._pos))
        out[:n] = self._view[self._pos : self._pos + n]
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos


class HashingReadFile(io.RawIOBase):
    """A read-only binary file that hashes what is read through it, in the pass that reads it: each slice the
    kernel copies into the reader's buffer (for ``torch.load``, a new tensor's storage) is hashed right after, while
    it is in the cache. No mapping (whose page faults made a copy out of it slower than a read) and no second pass.

    Reads that go on from where hashing stands (a parser reading the file front to back) are hashed on the way;
    small skips ahead are read and hashed on the way; `finish` hashes the rest (what was read out of order or never)
    from the file: the digest is always that of the whole file, in order.

    Args:
        fh: the file, opened unbuffered (``open(path, "rb", buffering=0)``); read with its own position.
        algorithm: the hash (`HASHES`).
    """

    def __init__(self, fh: Any, algorithm: str) -> None:
        super().__init__()
        self._fh, self._size, self._pos = fh, os.fstat(fh.fileno()).st_size, 0
        self._hasher, self._hashed = new_hasher(algorithm), 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def _read_at(self, out: memoryview, offset: int) -> int:
        self._fh.seek(offset)
        n: int = self._fh.readinto(out) or 0
        return n

    def _hash_to(self, end: int | None) -> None:
        """Hash the file's bytes from where hashing stands to `end` (None: the file's end), read again."""
        stop = self._size if end is None else end
        scratch = memoryview(bytearray(min(_CHUNK, max(1 << 16, stop - self._hashed))))
        while end is None or self._hashed < end:
            n = self._read_at(scratch if end is None else scratch[: min(len(scratch), end - self._hashed)], self._hashed)
            if n <= 0:
                break
            self._hasher.update(scratch[:n])
            self._hashed += n

    def readinto(self, b: Any) -> int:
        out = memoryview(b).cast("B")
        start = self._pos
        want = max(0, min(len(out), self._size - start))
        if want and self._hashed < start <= self._hashed + _SLICE:  # a small skip (a zip's names, alignment): hashed here
            self._hash_to(start)
        got = 0
        while got < want:
            n = self._read_at(out[got : min(want, got + _SLICE)], start + got)
            if n <= 0:
                break
            if start + got == self._hashed:
                self._hasher.update(out[got : got + n])
                self._hashed += n
            got += n
        self._pos = start + got
        return got

    def finish(self) -> tuple[int, str]:
        """The size and digest of the whole file (hashing what the reads did not)."""
        self._hash_to(None)
        digest: str = self._hasher.hexdigest()
        return self._hashed, digest
