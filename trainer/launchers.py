"""Start distributed work from Python: `notebook_launcher`, `debug_launcher`, `launch_current_script`.

All three run on torch's elastic agent (``torch.distributed.launcher.api.elastic_launch``), the engine behind
``torchrun`` and ``trainer launch``, and pass the ``TRAINWRIGHT_*`` variables so an ``Accelerator`` created
inside the workers is distributed. Unlike Accelerate's, `notebook_launcher` can be called again in the same
process: it keeps no global state and moves to a free port when the requested one is still taken.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from trainer.cli.launch import describe_failure, launch_settings, patched_environ, stopped_by_agent, worker_environment
from trainer.cli.settings import LaunchSettings


def _refuse_inside_workers(caller: str) -> None:
    from strategies.environment import detect_environment  # lazy: `from trainer import notebook_launcher` imports no torch

    cluster = detect_environment()
    if cluster.is_distributed or os.environ.get("TRAINWRIGHT_LAUNCHED") == "1":
        raise RuntimeError(
            f"{caller}() was called inside an already launched process (source={cluster.source}, "
            f"world_size={cluster.world_size}); call it from the plain Python process that should start the "
            "workers, or run the code directly under the existing launcher"
        )


def port_is_free(port: int, host: str = "") -> bool:
    """Whether a TCP server could bind ``port`` on ``host`` right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port that is free at the time of the call."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def _start_method() -> str:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        raise RuntimeError(
            "CUDA was initialized in this process before notebook_launcher(): the workers cannot be forked. "
            "Restart the kernel and move every CUDA call (model.cuda(), torch.cuda.*) into the launched function"
        )
    return "fork"


def _launch_function(
    function: Callable[..., Any],
    args: Sequence[Any],
    *,
    nproc_per_node: int,
    env: dict[str, str],
    rdzv: dict[str, Any],
    **config: Any,
) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    launch_config = LaunchConfig(
        nproc_per_node=nproc_per_node, start_method=_start_method(), **rdzv, **config
    )
    if nproc_per_node > 1 and "OMP_NUM_THREADS" not in os.environ:
        env = {**env, "OMP_NUM_THREADS": "1"}
    with tempfile.TemporaryDirectory(prefix="trainwright-failures-") as failures, patched_environ(env):
        try:
            elastic_launch(config=launch_config, entrypoint=_recording(function, failures))(*args)
        except ChildFailedError as err:
            raise RuntimeError(_failure_message(function, err, failures)) from None


def _recording(function: Callable[..., Any], folder: str) -> Callable[..., Any]:
    """``function``, writing the time and error of a failure to ``folder/<rank>.json`` before re-raising.

    The agent's own failure record has one-second timestamps and may list a rank that only failed because its
    peer died first; these records tell which rank failed first.
    """

    @functools.wraps(function)
    def run(*args: Any) -> Any:
        try:
            return function(*args)
        except BaseException as err:
            record = {"time": time.time(), "error": f"{type(err).__name__}: {err}"}
            with open(os.path.join(folder, f"{os.environ.get('RANK', '0')}.json"), "w", encoding="utf-8") as fh:
                json.dump(record, fh)
            raise

    return run


def _failure_message(function: Callable[..., Any], err: Any, folder: str) -> str:
    records = {}
    for name in os.listdir(folder):
        with open(os.path.join(folder, name), encoding="utf-8") as fh:
            records[int(name.split(".")[0])] = json.load(fh)
    name = getattr(function, "__qualname__", None) or repr(function)
    silent = [r for r, f in err.failures.items() if r not in records and not stopped_by_agent(f.exitcode)]
    if not records or silent:  # a rank that died without a Python exception (os._exit, a signal) is the cause
        return describe_failure(err, prefer=silent)[1].replace("trainer launch:", f"{name}:", 1)
    rank = min(records, key=lambda r: (records[r]["time"], r))
    others = ", ".join(f"rank {r}" for r in sorted(records) if r != rank)
    lines = [f"{name}: rank {rank} failed first: {records[rank]['error']}"]
    if others:
        lines.append(f"  then failed: {others}")
    lines.append("  the other ranks were stopped; see the traceback of the failing rank above")
    return "\n".join(lines)


def _local_rdzv(master_addr: str, port: int) -> dict[str, Any]:
    if not port_is_free(port):
        new = free_port()
        print(f"Port {port} is in use; launching on port {new} instead.", file=sys.stderr)
        port = new
    return {
        "min_nodes": 1,
        "max_nodes": 1,
        "rdzv_backend": "static",
        "rdzv_endpoint": f"{master_addr}:{port}",
        "rdzv_configs": {"rank": 0},
    }


def _multi_node_rdzv(
    num_nodes: int, node_rank: int, backend: str, endpoint: str, conf: dict[str, Any] | None
) -> dict[str, Any]:
    configs = dict(conf or {})
    if backend == "static":
        configs["rank"] = node_rank
    return {
        "min_nodes": num_nodes,
        "max_nodes": num_nodes,
        "rdzv_backend": backend,
        "rdzv_endpoint": endpoint,
        "rdzv_configs": configs,
    }


def _xla_worker(index: int, function: Callable[..., Any], args: tuple[Any, ...]) -> None:
    function(*args)


def notebook_launcher(
    function: Callable[..., Any],
    args: Sequence[Any] = (),
    num_processes: int | None = None,
    mixed_precision: str = "no",
    use_port: str = "29500",
    master_addr: str = "127.0.0.1",
    node_rank: int = 0,
    num_nodes: int = 1,
    rdzv_backend: str = "static",
    rdzv_endpoint: str = "",
    rdzv_conf: dict[str, Any] | None = None,
    rdzv_id: str = "none",
    max_restarts: int = 0,
    monitor_interval: float = 0.1,
    log_line_prefix_template: str | None = None,
) -> None:
    """Run ``function(*args)`` on ``num_processes`` processes per node (Accelerate's signature).

    With one process (the default without GPUs) ``function`` runs in this process. Otherwise the workers are
    forked by torch's elastic agent; every ``Accelerator`` created inside sees ``num_processes`` processes.

    Args:
        function: the training function; it must create the ``Accelerator`` itself.
        args: positional arguments for ``function``.
        num_processes: processes per node (``None``: one per GPU, or 1 without GPUs).
        mixed_precision: ``"no"``, ``"fp16"`` or ``"bf16"`` for the ``Accelerator`` inside.
        use_port: port of the rendezvous on one node; a free port is used when it is taken.
        master_addr: address of node 0.
        node_rank: rank of this node (static rendezvous).
        num_nodes: number of nodes.
        rdzv_backend: ``"static"``, ``"c10d"``, ...
        rdzv_endpoint: ``host:port`` of the rendezvous (default ``master_addr:use_port``).
        rdzv_conf: extra rendezvous options, e.g. ``{"join_timeout": 60}``.
        rdzv_id: id shared by all nodes of the job.
        max_restarts: restarts of the worker group after a failure.
        monitor_interval: seconds between checks of the workers.
        log_line_prefix_template: torchrun's log line prefix template.

    Raises:
        RuntimeError: a worker failed (the message names its rank), or CUDA was initialized before the call.
        ValueError: a bad argument.
    """
    _refuse_inside_workers("notebook_launcher")
    settings = LaunchSettings(num_processes=num_processes, mixed_precision=mixed_precision)  # per node here
    env = worker_environment(settings)
    from strategies.xla import check_xla_processes, xla_device_present  # lazy: `from trainer import notebook_launcher` imports no torch

    if xla_device_present():  # a TPU notebook (Colab, Kaggle, a TPU VM): torch_xla's own launcher, as Accelerate
        check_xla_processes(num_processes, os.environ.get("PJRT_DEVICE"))
        import torch_xla.distributed.xla_multiprocessing as xmp

        env = {k: v for k, v in env.items() if k != "TRAINWRIGHT_LAUNCHED"} | {"TRAINWRIGHT_STRATEGY": "xla"}
        with patched_environ(env):
            xmp.spawn(_xla_worker, args=(function, tuple(args)), nprocs=1 if num_processes == 1 else None, start_method="fork")
        return
    if num_processes is None:
        import torch

        num_processes = torch.cuda.device_count() if torch.cuda.is_available() else 1
    if num_processes <= 1 and num_nodes == 1:
        with patched_environ({k: v for k, v in env.items() if k != "TRAINWRIGHT_LAUNCHED"}):
            function(*args)
        return
    if num_nodes == 1 and rdzv_backend == "static" and not rdzv_endpoint:
        rdzv = _local_rdzv(master_addr, int(use_port))
    else:
        endpoint = rdzv_endpoint or f"{master_addr}:{use_port}"
        rdzv = _multi_node_rdzv(num_nodes, node_rank, rdzv_backend, endpoint, rdzv_conf)
    _launch_function(
        function,
        args,
        nproc_per_node=num_processes,
        env=env,
        rdzv=rdzv,
        run_id=rdzv_id,
        max_restarts=max_restarts,
        monitor_interval=monitor_interval,
        log_line_prefix_template=log_line_prefix_template,
    )


def debug_launcher(function: Callable[..., Any], args: Sequence[Any] = (), num_processes: int = 2) -> None:
    """Run ``function(*args)`` on ``num_processes`` CPU processes (for tests and debugging).

    Raises:
        RuntimeError: a worker failed; the message names its rank.
    """
    _refuse_inside_workers("debug_launcher")
    settings = LaunchSettings(num_processes=num_processes, cpu=True)
    _launch_function(
        function,
        args,
        nproc_per_node=num_processes,
        env=worker_environment(settings),
        rdzv=_local_rdzv("127.0.0.1", free_port()),
        run_id="debug",
    )


def _current_command() -> tuple[str, bool, list[str]]:
    """(script or module, is_module, arguments) that re-run this process's program."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and spec.name not in ("__main__", ""):
        name = spec.name[: -len(".__main__")] if spec.name.endswith(".__main__") else spec.name
        return name, True, sys.argv[1:]
    path = getattr(main, "__file__", None) or (sys.argv[0] if sys.argv else "")
    if not path or not os.path.isfile(path):
        raise RuntimeError(
            "launch_current_script() re-runs the current script, but this process was not started from a script "
            "file (interactive session or notebook); use notebook_launcher(function, num_processes=N) instead"
        )
    return os.path.abspath(path), False, sys.argv[1:]


def can_rerun_current_script() -> bool:
    """Whether `launch_current_script` has a script (or module) to re-run: False in a notebook or a REPL."""
    try:
        _current_command()
    except RuntimeError:
        return False
    return True


def launch_current_script(num_processes: int, **settings: Any) -> NoReturn:
    """Re-run the current ``python script.py ...`` on ``num_processes`` workers and exit with the job's code.

    Args:
        num_processes: processes in total.
        **settings: other launch settings (`trainer.cli.settings.LaunchSettings` fields), e.g.
            ``cpu=True, mixed_precision="bf16", strategy="ddp"``.

    Raises:
        RuntimeError: called inside an already launched process, or without a script to re-run.
        ValueError: a bad or unknown setting.
    """
    _refuse_inside_workers("launch_current_script")
    launch = LaunchSettings().updated(num_processes=num_processes, **settings)
    script, module, script_args = _current_command()
    sys.stdout.flush()
    sys.exit(launch_settings(launch, script, script_args, module=module))
