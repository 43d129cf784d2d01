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
    for fd, path, mode in ((0, stdin, os.O_RDONLY), (1, stdout, os.O_WRONLY), (2, stderr, os.O_WRONLY)):
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
               timeout: float = 120, input: str | None = None) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, input=input)`` for
    ``argv = [sys.executable, [-u], script | -m module | -c code, *args]``, in a process forked from the warm server.

    Raises `subprocess.TimeoutExpired` (after killing the process) as `subprocess.run` does.
    """
    if not argv or argv[0] != sys.executable:
        raise ValueError(f"run_python runs this interpreter's scripts: argv must start with sys.executable, got {argv[:2]}")
    workdir = str(Path(cwd) if cwd is not None else Path.cwd())
    environ = dict(os.environ if env is None else env)
    with tempfile.TemporaryDirectory(prefix="run-python-") as streams:
        paths = tuple(str(Path(streams, name)) for name in ("stdin", "stdout", "stderr"))
        Path(paths[0]).write_text(input or "")
        for path in paths[1:]:
            Path(path).touch()
        process = _CONTEXT.Process(target=_run_main, args=(argv[1:], workdir, environ, paths), name="script")
        process.start()
        process.join(timeout)
        out, err = (Path(p).read_text(errors="replace") for p in paths[1:])
        if process.exitcode is None:
            process.kill()
            process.join()
            raise subprocess.TimeoutExpired(argv, timeout, output=out, stderr=err)
    code: Any = process.exitcode
    return subprocess.CompletedProcess(argv, code, out, err)
