"""Run a Python script in a real process of its own without paying for an interpreter start and ``import torch``.

``run_python([sys.executable, "script.py", *args], cwd=..., env=...)`` returns what ``subprocess.run(...,
capture_output=True, text=True)`` would: the script runs as ``__main__`` in a new process with its own arguments,
environment, working directory, standard streams (files, read back when it ends) and exit status, and its exit
functions run when it ends. The process is forked from the fork server of `tests.helpers.multiprocess`, which imported
torch and the three packages once (before any computation, so forking is safe), instead of starting an interpreter
that imports them again: seconds a script, for the tests whose subject is what the script does. What only an
interpreter's start decides stays the fork server's (``PYTHONHASHSEED``, ``-X`` options): scripts that need them run
with `subprocess`; ``OMP_NUM_THREADS`` is applied with ``torch.set_num_threads``.

Tests whose subject is the launch itself (``trainer launch``, ``torchrun``, signals, kill -9, exit codes of a
launcher, import costs) start real interpreters with `subprocess` as before.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from multiprocessing import connection
from pathlib import Path
from typing import Any

from tests.helpers import multiprocess

_CONTEXT = multiprocess._CONTEXT


def _run_main(argv: list[str], cwd: str, env: dict[str, str], streams: tuple[str, str, str]) -> None:
    """In the new process: become ``python *argv`` in `cwd` with `env`, run the script, exit with its status."""
    import atexit
    import runpy
    import traceback
    import types

    import torch

    stdin, stdout, stderr = streams
    # (appending: the processes of one `run_python(..., nprocs=N)` share the files as torchrun's workers share its streams)
    for fd, path, mode in ((0, stdin, os.O_RDONLY), (1, stdout, os.O_WRONLY | os.O_APPEND), (2, stderr, os.O_WRONLY | os.O_APPEND)):
        opened = os.open(path, mode)
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115  (the process's own streams, as an interpreter opens them)
    sys.stdout = open(1, "w", closefd=False, buffering=1 if "-u" in argv[:2] else -1)  # noqa: SIM115
    sys.stderr = open(2, "w", closefd=False, buffering=1)  # noqa: SIM115
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    if "OMP_NUM_THREADS" in env:
        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    args = [a for a in argv if a != "-u"]
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    code = 0
    try:
        if args[0] == "-m":
            sys.argv = [args[1], *args[2:]]
            sys.path[:0] = [cwd, *extra]
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
        elif args[0] == "-c":
            sys.argv = ["-c", *args[2:]]
            sys.path[:0] = ["", *extra]
            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            exec(compile(args[1], "<string>", "exec"), main.__dict__)
        else:
            script = str(Path(cwd, args[0]).resolve())
            sys.argv = [args[0], *args[1:]]
            sys.path[:0] = [str(Path(script).parent), *extra]
            runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:
        if stop.code is None:
            code = 0
        elif isinstance(stop.code, int):
            code = stop.code
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(code)


def run_python(argv: list[str], *, cwd: str | os.PathLike[str] | None = None, env: dict[str, str] | None = None,
               timeout: float = 120, input: str | None = None, nprocs: int = 1) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, input=input)`` for
    ``argv = [sys.executable, [-u], script | -m module | -c code, *args]``, in a process forked from the warm server.

    With ``nprocs=N`` the script runs on N such processes as ``torchrun --nproc_per_node N`` starts its workers: each
    gets the variables torchrun sets (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT`` of a new
    port, ...) on top of `env`, they share the standard streams, and when one fails the others are stopped (SIGTERM,
    then SIGKILL) as torchrun's agent does; the exit status is the first failure's, else 0. For scripts whose subject
    is what they do on several processes; the launch itself (``trainer launch``, ``torchrun``) is tested by real ones.

    Raises `subprocess.TimeoutExpired` (after killing the processes) as `subprocess.run` does.
    """
    if not argv or argv[0] != sys.executable:
        raise ValueError(f"run_python runs this interpreter's scripts: argv must start with sys.executable, got {argv[:2]}")
    if nprocs < 1:
        raise ValueError(f"nprocs must be at least 1, got {nprocs}")
    workdir = str(Path(cwd) if cwd is not None else Path.cwd())
    environ = dict(os.environ if env is None else env)
    port = str(multiprocess.free_port())
    with tempfile.TemporaryDirectory(prefix="run-python-") as streams:
        paths = tuple(str(Path(streams, name)) for name in ("stdin", "stdout", "stderr"))
        Path(paths[0]).write_text(input or "")
        for path in paths[1:]:
            Path(path).touch()
        processes = []
        for rank in range(nprocs):
            rank_env = environ if nprocs == 1 else {"OMP_NUM_THREADS": "1", **environ, **_torchrun_variables(rank, nprocs, port)}
            processes.append(_CONTEXT.Process(target=_run_main, args=(argv[1:], workdir, rank_env, paths), name=f"script-{rank}"))
        for process in processes:
            process.start()
        finished, code = _wait_like_torchrun(processes, timeout)
        out, err = (Path(p).read_text(errors="replace") for p in paths[1:])
        if not finished:
            raise subprocess.TimeoutExpired(argv, timeout, output=out, stderr=err)
    return subprocess.CompletedProcess(argv, code, out, err)


def _torchrun_variables(rank: int, nprocs: int, port: str) -> dict[str, str]:
    """What ``torchrun --standalone --nproc_per_node nprocs`` sets for worker `rank` (one machine; the worker hosts the
    store, as there is no agent)."""
    size = str(nprocs)
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0", "ROLE_RANK": str(rank), "ROLE_NAME": "default",
            "WORLD_SIZE": size, "LOCAL_WORLD_SIZE": size, "ROLE_WORLD_SIZE": size, "GROUP_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "TORCHELASTIC_RESTART_COUNT": "0",
            "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": "none"}


def _wait_like_torchrun(processes: list[Any], timeout: float, grace: float = 5.0) -> tuple[bool, int]:
    """Wait for `processes`; once one fails, SIGTERM the rest and SIGKILL what is left after `grace` seconds. Returns
    whether they were all done within `timeout` seconds (else all are killed) and the first failure's exit code (0: none)."""
    deadline = time.monotonic() + timeout
    first_failure, stop_by = 0, None
    while any(p.exitcode is None for p in processes):
        now = time.monotonic()
        if now > deadline or (stop_by is not None and now > stop_by):
            for p in processes:
                if p.exitcode is None:
                    p.kill()
                    p.join()
            return now <= deadline, first_failure
        if stop_by is None and (failed := [p.exitcode for p in processes if p.exitcode not in (None, 0)]):
            first_failure, stop_by = failed[0], now + grace
            for p in processes:
                if p.exitcode is None:
                    p.terminate()
        connection.wait([p.sentinel for p in processes if p.exitcode is None], timeout=0.2)
    if not first_failure:
        first_failure = next((p.exitcode for p in processes if p.exitcode), 0)
    return True, first_failure


def launch_environment(*launch_args: str) -> dict[str, str]:
    """The ``TRAINWRIGHT_*`` variables ``trainer launch *launch_args script`` gives its workers, made by its own code
    (flags, the config file in ``HOME``, defaults), for `run_python(..., nprocs=N)` to start a script as it would. The
    launcher's PID is left out: these processes have no launcher to die with."""
    from trainer.cli import build_parser
    from trainer.cli.config import resolve_settings
    from trainer.cli.launch import worker_environment

    args = build_parser().parse_args(["launch", *launch_args, "script.py"])
    settings, _ = resolve_settings(args)
    return {k: v for k, v in worker_environment(settings).items() if k != "TRAINWRIGHT_LAUNCHER_PID"}
