"""The checkpoint writer process: the background part of an asynchronous save, off the training process.

A background thread that hashes and writes hundreds of megabytes competes with the training loop for the
interpreter lock: every write and hash call gives the lock up and takes it back, and the step waits each time
(measured: steps 1.2-2.4× as long while the thread writes). So the bytes are written by another process, one per
training process, started at the first asynchronous save and kept for the next ones (torchtitan's persistent
checkpoint process; PyTorch's ``AsyncCheckpointerType.PROCESS``), at the lowest CPU priority (`writer_niceness`):

* the step copies the state into shared memory (`strategies.checkpoint_staging.Staging` with ``shared=True``; the
  writer maps the same memory, so nothing is copied twice);
* the store's background thread runs the save's write function against a `Recorder`, which produces each file
  (``torch.save``, safetensors, JSON) into a `Sink`: the headers and pickles as bytes, each tensor's bytes as their
  place in the shared memory (what those writers write of a tensor is its memory itself, so nothing big is copied
  or hashed here). The list goes to the writer process as one job, and the thread waits for the reply without the
  interpreter lock;
* the writer process (no torch: only the standard library and the hash) writes each file from those pieces into
  the checkpoint's staging directory, hashing it on the way, flushes them to disk, and replies with their sizes
  and digests. The training process commits (manifest, rename) as before, only once every
  process's write succeeded; a writer never commits, so a dead trainer commits nothing.

The writer does not outlive its trainer: it is killed by the kernel when the thread that started it ends
(``PR_SET_PDEATHSIG``; that thread lives as long as the writer), and it watches a pipe whose far end only the
trainer holds (closed by the kernel when the trainer dies, however it dies). Its shared memory has no name, so
nothing stays in ``/dev/shm`` after either one is killed. If the writer dies, the save in flight fails with the
writer's exit status (raised by the next call, as any failed save) and the next save starts a new writer.

Sharded states (``torch.distributed.checkpoint``, FSDP): DCP plans and agrees across the processes in the background
thread (its steps are collective, over the save's own group), and the files it produces are written by the writer
like the others (`strategies.dcp_storage.RecordingWriter`): its shard files are ``torch.save``s of the staged shards.
"""

from __future__ import annotations

import atexit
import json
import os
import pickle
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from strategies.checkpoint_io import CheckpointWriter
    from strategies.checkpoint_staging import Staging

MODES = ("process", "thread")
_ENV = "TRAINWRIGHT_CHECKPOINT_WRITER"
_NICE_ENV = "TRAINWRIGHT_CHECKPOINT_WRITER_NICE"
_START_TIMEOUT = 300.0  # s: starting an interpreter on a loaded machine


def writer_mode() -> str:
    """Where asynchronous saves write: ``"process"`` (the default where shared memory can be handed to another
    process: Linux) or ``"thread"`` (a thread of the training process); ``$TRAINWRIGHT_CHECKPOINT_WRITER`` chooses.

    Raises:
        ValueError: the variable names neither.
    """
    from strategies.checkpoint_staging import shared_memory_available  # lazy: the writer process imports this module without torch

    chosen = os.environ.get(_ENV, "").strip().lower()
    if chosen and chosen not in MODES:
        raise ValueError(f"{_ENV}={os.environ[_ENV]!r} is not a checkpoint writer; choose one of {', '.join(map(repr, MODES))}")
    if chosen == "process" and not shared_memory_available():
        raise ValueError(f"{_ENV}='process' needs os.memfd_create (Linux); set it to 'thread' on this platform")
    return chosen or ("process" if shared_memory_available() else "thread")


def writer_niceness() -> int:
    """How much lower than the training process's the writer's CPU priority is: ``$TRAINWRIGHT_CHECKPOINT_WRITER_NICE``,
    0 to 19, default 19 (the lowest): the writer runs on the cores training leaves idle, and yields them to it when
    it wants them (on two busy cores: steps 1.05× normal while it writes, against 1.66× at 0). Where training keeps
    every core busy, the write then takes longer, and so may the wait of the next save for it.

    Raises:
        ValueError: the variable is not a whole number from 0 to 19.
    """
    text = os.environ.get(_NICE_ENV, "").strip()
    try:
        value = int(text) if text else 19
    except ValueError:
        value = -1
    if not 0 <= value <= 19:
        raise ValueError(f"{_NICE_ENV}={os.environ[_NICE_ENV]!r} is not a niceness; set a whole number from 0 (the "
                         "training process's priority) to 19 (the lowest, the default)")
    return value


# ------------------------------------------------------------------------------------------------ the recorder
_BY_PLACE = 1 << 16  # a write at least this large that lies in shared memory travels as its place there


class Sink:
    """A binary file (``write``, ``flush``, ``tell``) that keeps what is written to it as pieces: bytes, or the place
    (segment, offset, length) in a staging's shared memory of a large write that lies there: what ``torch.save``
    and `write_safetensors` write of a staged tensor is its memory itself, so a file's tensors are never copied here."""

    def __init__(self, staging: Staging) -> None:
        self.staging = staging
        self.pieces: list[bytes | tuple[int, int, int]] = []
        self.size = 0
        self._small: list[bytes] = []

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        place = self._place(view) if len(view) >= _BY_PLACE else None
        if place is None:
            self._small.append(bytes(view))
        else:
            self._flush_small()
            self.pieces.append(place)
        self.size += len(view)
        return len(view)

    def _place(self, view: memoryview) -> tuple[int, int, int] | None:
        import numpy as np

        found = self.staging.locate_bytes(int(np.frombuffer(view, dtype=np.uint8).ctypes.data), len(view))
        return None if found is None else (found[0], found[1], len(view))

    def _flush_small(self) -> None:
        if self._small:
            self.pieces.append(b"".join(self._small))
            self._small = []

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass

    def done(self) -> list[bytes | tuple[int, int, int]]:
        self._flush_small()
        return self.pieces


class Recorder:
    """Stands in for a `CheckpointWriter` while a save's write function runs: it produces each file's bytes as
    `Sink` pieces for the writer process (the tensors as their places in shared memory), and runs DCP's collective
    writes (`save_dcp`) on the real writer at once."""

    def __init__(self, writer: CheckpointWriter, staging: Staging) -> None:
        self.writer, self.staging_memory = writer, staging
        self.final, self.staging, self.algorithm, self.group = writer.final, writer.staging, writer.algorithm, writer.group
        self.jobs: list[tuple[str, Any, Any, int]] = []  # (kind, name(s), pieces or nothing, bytes)

    @property
    def files(self) -> dict[str, dict[str, Any]]:
        return self.writer.files

    def _file(self, name: str, produce: Any) -> None:
        sink = Sink(self.staging_memory)
        produce(sink)
        self.jobs.append(("file", name, sink.done(), sink.size))

    def save_safetensors(self, name: str, state: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
        from strategies.checkpoint_io import write_safetensors  # lazy: the writer process imports this module without torch

        self._file(name, lambda out: write_safetensors(out, state, metadata))

    def save_torch(self, name: str, obj: Any) -> None:
        import torch

        from strategies.checkpoint_io import without_zip_crc  # lazy: the writer process imports this module without torch

        def produce(out: Sink) -> None:
            with without_zip_crc():
                torch.save(obj, out)  # type: ignore[arg-type]  # (a file as far as torch.save goes)

        self._file(name, produce)

    def save_json(self, name: str, data: Any) -> None:
        self._file(name, lambda out: out.write(json.dumps(data, indent=1, sort_keys=True).encode()))

    def save_rng_state(self, name: str) -> None:
        from strategies.checkpoint_io import capture_rng_state  # lazy: the writer process imports this module without torch

        tensors, meta = capture_rng_state()  # (this process's generators, now)
        self.save_safetensors(name, tensors, metadata=meta)

    def save_dcp(self, name: str, state: dict[str, Any]) -> None:
        """DCP plans and agrees with the other processes here (collective, over the save's group); the files it
        produces (this process's shards, process 0's ``.metadata``) go to the writer process like the others."""
        import torch.distributed.checkpoint as dcp

        from strategies.checkpoint_io import without_zip_crc  # lazy: the writer process imports this module without torch
        from strategies.dcp_storage import RecordingWriter  # lazy: the writer process imports this module without torch

        storage = RecordingWriter(self.staging / name, lambda: Sink(self.staging_memory))
        with without_zip_crc():  # (DCP torch.saves each item into its shard file)
            dcp.save(state, storage_writer=storage, process_group=self.group)
        for path, sink in storage.recorded.items():
            self.jobs.append(("file", path.relative_to(self.staging).as_posix(), sink.done(), sink.size))

    def hash_written(self, names: list[str]) -> None:
        self.jobs.append(("written", names, None, 0))


# ------------------------------------------------------------------------------------------------ the trainer's side
class WriterProcess:
    """This training process's checkpoint writer (`writer_process` gives the one of this process). One job at a
    time; every call comes from a store's background thread."""

    def __init__(self) -> None:
        self.niceness = writer_niceness()
        self._lock = threading.Lock()
        self._sent: set[int] = set()  # the shared segments the writer maps
        self._released: list[int] = []  # segments it may unmap
        self.returncode: int | None = None
        self._exited = threading.Event()
        self._started = threading.Event()
        self._start_error: BaseException | None = None
        self.pid = 0
        self.sock, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        life_read, self._lifeline = os.pipe()  # the writer sees EOF on its end when this process is gone
        self._keeper = threading.Thread(target=self._keep, args=(child, life_read), name="checkpoint-writer-keeper", daemon=True)
        self._keeper.start()
        self._ready = False

    def _keep(self, child: socket.socket, life_read: int) -> None:
        """Start the writer and wait for it to end: the writer is killed when the thread that started it ends, so
        this thread lives exactly as long as the writer (and reaps it)."""
        package = str(Path(__file__).resolve().parent)  # (its modules alone, without the package's imports: no torch)
        code = (f"import sys, types; p = sys.modules['strategies'] = types.ModuleType('strategies'); p.__path__ = [{package!r}]; "
                f"from strategies.checkpoint_process import _writer_main; "
                f"_writer_main({child.fileno()}, {life_read}, {os.getpid()}, {self.niceness})")
        try:
            proc = subprocess.Popen([sys.executable, "-c", code], pass_fds=(child.fileno(), life_read), stdin=subprocess.DEVNULL)
        except BaseException as err:
            self._start_error = err
            self._exited.set()
            self._started.set()
            return
        finally:
            child.close()
            os.close(life_read)
        self.pid = proc.pid
        self._started.set()
        self.returncode = proc.wait()
        self._exited.set()

    @property
    def alive(self) -> bool:
        return not self._exited.is_set()

    def write(self, writer: CheckpointWriter, write: Any, staging: Staging) -> None:
        """Write this process's files of one save (`write(recorder)` names them) through the writer process, into
        `writer`'s staging directory, and add their entries to ``writer.files``.

        Raises:
            RuntimeError: the writer failed (its error), or ended (its exit status).
        """
        recorder = Recorder(writer, staging)
        write(recorder)
        if not recorder.jobs:
            return
        with self._lock:
            self._wait_ready()
            released, staging.released = [*self._released, *staging.released], []
            self._released.clear()
            self._sent.difference_update(released)
            new = [s for s in staging.segments.values() if s.ident not in self._sent]
            job = {"kind": "write", "final": str(writer.final), "staging": str(writer.staging), "algorithm": writer.algorithm,
                   "files": recorder.jobs, "segments": [(s.ident, s.nbytes) for s in new], "released": released}
            self._send(job, [s.fd for s in new])
            self._sent.update(s.ident for s in new)
            reply = self._receive()
        if "error" in reply:
            raise RuntimeError(f"the checkpoint writer process (pid {self.pid}): {reply['error']}")
        writer.files.update(reply["files"])

    def forget(self, staging: Staging) -> None:
        """`staging` was closed: the writer unmaps its segments with its next job."""
        with self._lock:
            self._released.extend(ident for ident in staging.released if ident in self._sent)
            staging.released.clear()

    def close(self, timeout: float = 10.0) -> None:
        """Ask the writer to end, and wait for it (killed if it does not end in `timeout` seconds)."""
        with self._lock:
            if self.alive and self._ready:
                try:
                    self._send({"kind": "quit"}, [])
                except OSError:
                    pass
            self._exited.wait(timeout if self._ready else 0)
            if self.alive and self.pid:
                try:
                    os.kill(self.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self._exited.wait(timeout)
            self.sock.close()
            try:
                os.close(self._lifeline)
            except OSError:
                pass

    # -------------------------------------------------------------------------------- the wire
    def _wait_ready(self) -> None:
        if self._ready:
            return
        self._started.wait()
        if self._start_error is not None:
            raise RuntimeError(f"could not start the checkpoint writer process: {self._start_error}") from self._start_error
        self.sock.settimeout(_START_TIMEOUT)
        try:
            hello = self._receive()
        finally:
            self.sock.settimeout(None)
        if hello.get("ready") != self.pid:
            raise RuntimeError(f"the checkpoint writer process (pid {self.pid}) answered {hello!r} instead of being ready")
        self._ready = True

    def _send(self, message: dict[str, Any], fds: list[int]) -> None:
        try:
            _send(self.sock, message, fds)
        except OSError as err:
            raise self._ended(err) from err

    def _receive(self) -> dict[str, Any]:
        try:
            message, _ = _receive(self.sock)
        except (OSError, EOFError) as err:
            raise self._ended(err) from err
        return message

    def _ended(self, err: BaseException) -> RuntimeError:
        self._exited.wait(5.0)
        code = self.returncode
        how = ("is still running" if code is None else f"was killed by signal {-code} ({signal.Signals(-code).name})" if code < 0
               else f"exited with status {code}")
        return RuntimeError(f"the checkpoint writer process (pid {self.pid}) ended while writing ({type(err).__name__}: {err}); "
                            f"it {how}. A new one starts with the next save")


_WRITERS: dict[int, WriterProcess] = {}
_WRITERS_LOCK = threading.Lock()


def writer_process() -> WriterProcess:
    """The checkpoint writer of this process, started now if there is none or it ended (a forked child starts its
    own). Starting returns at once; the first job waits for the writer to be ready."""
    with _WRITERS_LOCK:
        current = _WRITERS.get(os.getpid())
        if current is None or not current.alive:
            if current is not None:
                current.close(timeout=0)
            if not _WRITERS:
                atexit.register(close_writer_process)
            current = _WRITERS[os.getpid()] = WriterProcess()
        return current


def running_writer() -> WriterProcess | None:
    """This process's checkpoint writer, if one was started and has not ended (none is started here)."""
    current = _WRITERS.get(os.getpid())
    return current if current is not None and current.alive else None


def close_writer_process() -> None:
    """End this process's writer (at interpreter exit; also when a test wants a fresh one)."""
    with _WRITERS_LOCK:
        current = _WRITERS.pop(os.getpid(), None)
    if current is not None:
        current.close()


def _send(sock: socket.socket, message: dict[str, Any], fds: list[int]) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    header = struct.pack("<Q", len(data))
    if fds:
        socket.send_fds(sock, [header], fds)
    else:
        sock.sendall(header)
    sock.sendall(data)


def _receive(sock: socket.socket) -> tuple[dict[str, Any], list[int]]:
    header, fds, _, _ = socket.recv_fds(sock, 8, 256)
    while header and len(header) < 8:
        more = sock.recv(8 - len(header))
        if not more:
            break
        header += more
    if len(header) < 8:
        raise EOFError("the other end closed the connection")
    length = struct.unpack("<Q", header)[0]
    chunks, left = [], length
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise EOFError("the other end closed the connection mid-message")
        chunks.append(chunk)
        left -= len(chunk)
    message: dict[str, Any] = pickle.loads(b"".join(chunks))
    return message, fds


# ------------------------------------------------------------------------------------------------ the writer's side
def _writer_main(sock_fd: int, lifeline: int, parent: int, niceness: int) -> None:
    """The writer process (no torch: it starts in a fraction of a second): serve jobs until told to quit, or until
    the trainer is gone."""
    _die_with(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle; the writer ends with it
    threading.Thread(target=_watch, args=(lifeline, parent), name="trainer-watch", daemon=True).start()
    os.nice(niceness)  # the training process's threads first: the writer takes the cores they leave
    import mmap

    sock = socket.socket(fileno=sock_fd)
    _send(sock, {"ready": os.getpid()}, [])
    maps: dict[Any, mmap.mmap] = {}
    while True:
        try:
            job, fds = _receive(sock)
        except (OSError, EOFError):
            return
        if job["kind"] == "quit":
            return
        for key in job["released"]:
            released = maps.pop(key, None)
            if released is not None:
                released.close()
        for (key, nbytes), fd in zip(job["segments"], fds):
            maps[key] = mmap.mmap(fd, nbytes)
            os.close(fd)
        try:
            reply: dict[str, Any] = {"files": _run(job, maps)}
        except Exception as err:  # reported to the trainer, which fails the save
            reply = {"error": f"{type(err).__name__}: {err}"}
        _send(sock, reply, [])


def _run(job: dict[str, Any], maps: dict[Any, Any]) -> dict[str, Any]:
    from strategies.checkpoint_files import StagedFiles  # lazy: loaded in the writer process only, after its start

    files = StagedFiles(Path(job["staging"]), job["algorithm"], Path(job["final"]))
    for kind, name, pieces, nbytes in job["files"]:
        if kind == "written":
            files.hash_written(name)
            continue

        def produce(out: Any, pieces: Any = pieces) -> None:
            for piece in pieces:
                if isinstance(piece, bytes):
                    out.write(piece)
                else:
                    key, offset, length = piece
                    with memoryview(maps[key]) as view:
                        for begin in range(offset, offset + length, _SLICE):  # (hashed while in the cache)
                            out.write(view[begin : min(begin + _SLICE, offset + length)])

        files.write_file(name, produce, nbytes)
    files.sync()
    return files.files


_SLICE = 8 << 20


def _die_with(parent: int) -> None:
    """Have the kernel kill this process when the trainer's thread that started it ends (Linux)."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:  # the trainer died before that took effect
        os._exit(1)


def _watch(lifeline: int, parent: int) -> None:
    """End this process at once when the trainer is gone: its end of the pipe closed (the kernel closes it when the
    trainer dies), or this process was handed to another parent."""
    poller = select.poll()
    poller.register(lifeline, select.POLLIN | select.POLLHUP)
    while True:
        if poller.poll(1000) or os.getppid() != parent:
            os._exit(1)
