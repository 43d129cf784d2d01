"""``trainer launch``: run a script on N processes with ``torch.distributed.run`` (torchrun's elastic agent).

The settings become torchrun arguments (parsed by torchrun's own parser and turned into a `LaunchConfig` by its
``config_from_args``) plus the ``TRAINWRIGHT_*`` environment variables the ``Accelerator`` and ``Trainer`` read.
When a rank fails, the agent stops the others and we report the failing rank and return its exit code.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import uuid
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import Any

from trainer.cli.config import add_setting_arguments, default_config_path, resolve_settings
from trainer.cli.rounds import tokens_per_round
from trainer.cli.settings import LaunchSettings

DEFAULT_MULTI_NODE_PORT = 29500
RDZV_FAILURE_EXIT_CODE = 1


def worker_environment(settings: LaunchSettings) -> dict[str, str]:
    """The ``TRAINWRIGHT_*`` variables (and ``CUDA_VISIBLE_DEVICES`` for ``gpu_ids``) every worker gets."""
    env = {
        "TRAINWRIGHT_LAUNCHED": "1",
        "TRAINWRIGHT_STRATEGY": settings.strategy,
        "TRAINWRIGHT_MIXED_PRECISION": settings.mixed_precision,
        "TRAINWRIGHT_CPU": "true" if settings.cpu else "false",
        "TRAINWRIGHT_GRADIENT_ACCUMULATION_STEPS": str(settings.gradient_accumulation_steps),
        "TRAINWRIGHT_LAUNCHER_PID": str(os.getpid()),  # workers ask to die with it (strategies.process_group)
    }
    if settings.process_group_timeout is not None:
        env["TRAINWRIGHT_PG_TIMEOUT"] = str(settings.process_group_timeout)
    if settings.deepspeed_plugin:
        env["TRAINWRIGHT_DEEPSPEED_PLUGIN"] = json.dumps(settings.deepspeed_plugin)  # read by the Accelerator
    if settings.fsdp_plugin:
        env["TRAINWRIGHT_FSDP_PLUGIN"] = json.dumps(settings.fsdp_plugin)  # read by the Accelerator
    if settings.dynamo_plugin:
        env["TRAINWRIGHT_DYNAMO_PLUGIN"] = json.dumps(settings.dynamo_plugin)  # read by the Accelerator
    if settings.gpu_ids not in (None, "", "all") and not settings.cpu:
        env["CUDA_VISIBLE_DEVICES"] = str(settings.gpu_ids)
    return env


@contextlib.contextmanager
def patched_environ(values: Mapping[str, str]) -> Iterator[None]:
    """Set ``values`` in ``os.environ`` for the duration of the block, then restore what was there."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


def total_processes(settings: LaunchSettings) -> int:
    """``num_processes``, or one per visible GPU (1 without GPUs or with ``cpu``) when it is ``None``."""
    if settings.num_processes is not None:
        return settings.num_processes
    import torch

    if not settings.cpu and torch.cuda.is_available():
        return max(1, torch.cuda.device_count()) * settings.num_machines
    return settings.num_machines


def rendezvous_arguments(settings: LaunchSettings) -> list[str]:
    """torchrun's rendezvous flags for ``settings``.

    One machine without a port (and no more to come): a c10d store on a free loopback port (like ``torchrun
    --standalone``). Otherwise ``static`` (``--master-addr/--master-port/--node-rank``) or c10d/etcd at ``ip:port``; the join
    timeout is ``rdzv_join_timeout`` either way, followed by ``rdzv_conf``.
    """
    port = settings.main_process_port
    ip = settings.main_process_ip or "127.0.0.1"
    extra = [settings.rdzv_conf] if settings.rdzv_conf else []
    high = settings.machine_range()[1]
    if high > 1 and settings.num_machines == 1 and not port:
        raise ValueError(
            f"max_machines={high}: the machines that join later find this one's rendezvous at a known port; pass "
            f"--main_process_port (e.g. {DEFAULT_MULTI_NODE_PORT}) and --main_process_ip"
        )
    if high == 1 and not port:
        return [
            "--rdzv-backend", "c10d",
            "--rdzv-endpoint", "127.0.0.1:0",
            "--rdzv-id", uuid.uuid4().hex,
            "--rdzv-conf", ",".join([f"join_timeout={settings.rdzv_join_timeout}", *extra]),
        ]  # fmt: skip
    if port == 0:
        raise ValueError(
            f"main_process_port=0 (pick a free port) only works on one machine, but num_machines="
            f"{settings.num_machines}; give every machine the same port, e.g. --main_process_port {DEFAULT_MULTI_NODE_PORT}"
        )
    port = port or DEFAULT_MULTI_NODE_PORT
    if settings.rdzv_backend == "static":
        return [
            "--rdzv-backend", "static",
            "--master-addr", ip,
            "--master-port", str(port),
            "--node-rank", str(settings.machine_rank),
            "--rdzv-conf", ",".join([f"timeout={settings.rdzv_join_timeout}", *extra]),
        ]  # fmt: skip
    return [
        "--rdzv-backend", settings.rdzv_backend,
        "--rdzv-endpoint", f"{ip}:{port}",
        "--rdzv-id", "trainwright",
        "--rdzv-conf", ",".join([f"join_timeout={settings.rdzv_join_timeout}", *extra]),
    ]  # fmt: skip


def torchrun_arguments(
    settings: LaunchSettings, script: str, script_args: Sequence[str], *, module: bool = False
) -> list[str]:
    """The full ``torch.distributed.run`` command line for ``settings`` (without the program name)."""
    total = total_processes(settings)
    if total % settings.num_machines:
        raise ValueError(
            f"num_processes={total} is not divisible by num_machines={settings.num_machines}; "
            "give every machine the same number of processes"
        )
    low, high = settings.machine_range()
    args = [
        "--nnodes", str(settings.num_machines) if low == high else f"{low}:{high}",
        "--nproc-per-node", str(total // settings.num_machines),
        "--max-restarts", str(settings.max_restarts),
        "--monitor-interval", str(settings.monitor_interval),
        *rendezvous_arguments(settings),
    ]  # fmt: skip
    if module:
        args.append("--module")
    return [*args, script, *script_args]


def describe_failure(error: Any, prefer: Collection[int] = (), hung: Sequence[Mapping[str, Any]] = ()) -> tuple[int, str]:
    """Exit code and message for a ``ChildFailedError``, naming the rank that caused it.

    The cause is chosen in this order: ranks a waiting rank reported as never reaching its collective
    (`hung`, from ``strategies.process_group``); ranks in ``prefer``; ranks that exited on their own before
    ranks the agent stopped (SIGTERM/SIGKILL); the earliest failure; the lowest rank. The exit code is the
    first failure's own.
    """
    failures = error.failures
    report = next((r for r in hung if r.get("missing")), None)
    if report is not None:
        # a missing rank that had already ended with a failure when the waiting rank looked (a signal, an exception)
        # did not hang: it died, and the others failed because it left
        dead = [r for r in report["missing"] if r in report.get("gone", ()) and r in failures]
        return _describe_death(failures, dead[0], report) if dead else _describe_hang(failures, report)

    def order(item: tuple[int, Any]) -> tuple[bool, bool, bool, int, int]:
        rank, failure = item
        # the agent stops the others with SIGTERM (SIGKILL only after a grace period): a SIGKILL is more likely the cause
        return (rank not in prefer, stopped_by_agent(failure.exitcode), failure.exitcode == -_sigterm(), failure.timestamp, rank)

    rank, first = min(failures.items(), key=order)
    code, lines = _first_lines(rank, first)
    others = [f"rank {r} ({_exit_code(f.exitcode)[1]})" for r, f in sorted(failures.items()) if r != rank]
    if others:
        lines.append("  also failed: " + ", ".join(others))
    lines.append("  the other ranks were stopped")
    return code, "\n".join(lines)


# What a worker's death by a signal usually means, and what to do about it.
_OOM_ADVICE = (
    "look for 'Out of memory: Killed process <pid>' in `dmesg` (or the container's OOMKilled status); use less memory "
    "(a smaller batch size, fewer DataLoader workers) and resume from the last checkpoint"
)
_SIGNAL_CAUSES = {
    "SIGKILL": ("often the out-of-memory killer", _OOM_ADVICE),
    "SIGSEGV": ("a crash in native code", "run it again with PYTHONFAULTHANDLER=1 to see the Python stack of the crash"),
    "SIGBUS": ("often a full /dev/shm (the DataLoader workers' shared memory)", "give the job more shared memory (docker --shm-size) or use DataLoader(num_workers=0)"),
    "SIGABRT": ("an abort in native code", "the native error (e.g. 'terminate called ...') is printed above"),
}


def _first_lines(rank: int, failure: Any) -> tuple[int, list[str]]:
    """The job's exit code and the first lines of its summary: which rank, what happened to it, and what to do."""
    code, how = _exit_code(failure.exitcode)
    reason, advice = _SIGNAL_CAUSES.get(how.rsplit(" ", 1)[-1], ("", "see the traceback of the failing rank above"))
    lines = [f"trainer launch: rank {rank} (local rank {failure.local_rank}, pid {failure.pid}) {how}{', ' + reason if reason else ''}"]
    if failure.error_file != "<N/A>" and failure.message:
        lines.append(f"  error: {failure.message}")
    lines.append(f"  what to do: {advice}")
    return code, lines


def _describe_death(failures: Mapping[int, Any], rank: int, report: Mapping[str, Any]) -> tuple[int, str]:
    """A rank that ended (a signal, an exception) while the others were in a collective: it is the cause, not a hang;
    the job's exit code is its own (137 for SIGKILL, as a shell reports it)."""
    code, lines = _first_lines(rank, failures[rank])
    lines[0] += f"; rank {report['waiting']} failed in the collective it was in because of it"
    others = [f"rank {r} ({_exit_code(f.exitcode)[1]})" for r, f in sorted(failures.items()) if r != rank]
    if others:
        lines.append("  also failed: " + ", ".join(others))
    return code, "\n".join(lines)


def _describe_hang(failures: Mapping[int, Any], report: Mapping[str, Any]) -> tuple[int, str]:
    missing, waiting = report["missing"], report["waiting"]
    culprit = failures.get(missing[0])
    code = _exit_code(failures[waiting].exitcode)[0] if waiting in failures else 1
    one_sided = "call each collective (reduce, gather, wait_for_everyone, ...) on every rank; TRAINWRIGHT_DEBUG_COLLECTIVES=1 names the ranks whose calls differ"
    if report.get("alive"):
        state, advice = "it was still running (its Python stack is printed above)", f"see where rank {missing[0]} was stuck in its stack above; {one_sided}"
    elif report.get("gone"):
        state, advice = "it had already exited (a collective called on some ranks only?)", one_sided
    else:
        state, advice = "it ran on another machine", f"see rank {missing[0]}'s Python stack in its machine's log; {one_sided}"
    pid = "" if culprit is None else f" (pid {culprit.pid})"
    if report.get("timed_out", True):
        first = (f"trainer launch: rank {missing[0]}{pid} never reached the collective rank {waiting} waited in for "
                 f"{report['timeout']:g} s (the process-group timeout); {state}")
    else:  # the waiting rank failed at once: a rank it needed had left the group (it ended without an error)
        first = (f"trainer launch: rank {missing[0]}{pid} had ended when rank {waiting} called a collective, which failed at "
                 "once: a collective called on some ranks only?")
    lines = [first, f"  what to do: {advice}"]
    if len(missing) > 1:
        lines.append(f"  also missing from it: {', '.join(f'rank {r}' for r in missing[1:])}")
    lines.append("  failed: " + ", ".join(f"rank {r} ({_exit_code(f.exitcode)[1]})" for r, f in sorted(failures.items())))
    if report.get("timed_out", True):
        lines.append(f"  the wait is TRAINWRIGHT_PG_TIMEOUT / --process_group_timeout; see rank {waiting}'s report above")
    return code, "\n".join(lines)


def stopped_by_agent(exitcode: int) -> bool:
    """Whether a worker's exit code is the agent's own stop signal (SIGTERM or SIGKILL)."""
    import signal

    return exitcode in (-signal.SIGTERM, -signal.SIGKILL)


def _sigterm() -> int:
    import signal

    return int(signal.SIGTERM)


def _child_pids() -> list[int]:
    """The processes this one started (the workers), from /proc; empty where there is no /proc."""
    me, found = os.getpid(), []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == me:
            found.append(int(entry))
    return found


@contextlib.contextmanager
def forwarding_user_signals() -> Iterator[None]:
    """Pass SIGUSR1/SIGUSR2 (SLURM's preemption warning, user-defined) on to the workers instead of dying of them.

    torchrun's agent handles SIGTERM, SIGINT, SIGHUP and SIGQUIT itself (it stops the workers and exits); a
    signal it does not handle would kill the launcher and leave the workers running unsupervised.
    """
    import signal

    wanted = [s for s in (getattr(signal, "SIGUSR1", None), getattr(signal, "SIGUSR2", None)) if s is not None]

    def forward(signum: int, frame: Any) -> None:
        for pid in _child_pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    previous = {s: signal.signal(s, forward) for s in wanted}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _exit_code(exitcode: int) -> tuple[int, str]:
    if exitcode < 0:
        import signal

        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        return 128 - exitcode, f"was killed by {name}"
    return exitcode, f"failed with exit code {exitcode}"


def run_elastic(settings: LaunchSettings, torchrun_args: Sequence[str]) -> int:
    """Run ``torch.distributed.run`` with ``torchrun_args`` and the settings' environment; return the exit code."""
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous import RendezvousError

    from strategies.process_group import read_hung_reports  # lazy: the CLI imports no torch (strategies does)

    reports = tempfile.TemporaryDirectory(prefix="trainwright-faults-")
    env = {**worker_environment(settings), "TRAINWRIGHT_FAULT_DIR": reports.name}  # workers leave hang reports there
    with reports, patched_environ(env), forwarding_user_signals(), tokens_per_round():
        config, cmd, cmd_args = torchrun.config_from_args(torchrun.parse_args(list(torchrun_args)))
        try:
            from torch.distributed.launcher.api import elastic_launch

            elastic_launch(config=config, entrypoint=cmd)(*cmd_args)
        except ChildFailedError as err:
            code, message = describe_failure(err, hung=read_hung_reports(reports.name))
            print(message, file=sys.stderr, flush=True)
            return code
        except SignalException as err:
            print(f"trainer launch: stopped by signal {err.sigval.name}; the workers were stopped", file=sys.stderr)
            return 128 + int(err.sigval)
        except (RendezvousError, RuntimeError) as err:
            if not _is_rendezvous_failure(err):
                raise
            print(_rendezvous_message(settings, err), file=sys.stderr, flush=True)
            return RDZV_FAILURE_EXIT_CODE
    return 0


def _is_rendezvous_failure(err: BaseException) -> bool:
    from torch.distributed import DistStoreError
    from torch.distributed.elastic.rendezvous import RendezvousError

    return isinstance(err, (RendezvousError, DistStoreError))


def _rendezvous_message(settings: LaunchSettings, err: BaseException) -> str:
    where = f"{settings.main_process_ip or '127.0.0.1'}:{settings.main_process_port or DEFAULT_MULTI_NODE_PORT}"
    return (
        f"trainer launch: rendezvous failed: not all {settings.num_machines} machine(s) joined at {where} "
        f"(backend {settings.rdzv_backend}) within rdzv_join_timeout={settings.rdzv_join_timeout} s: "
        f"{type(err).__name__}{': ' + str(err) if str(err) else ''}\n"
        "  start `trainer launch` on every machine with the same --num_machines, --main_process_ip and "
        "--main_process_port and a distinct --machine_rank, or raise --rdzv_join_timeout"
    )


def check_strategy_name(name: str) -> str:
    """The registry name ``name`` stands for (``"tpu"`` -> ``"xla"``); a `ValueError` unless it is in the strategy
    registry (checked before starting processes)."""
    from strategies.registry import REGISTRY  # lazy: the CLI imports no torch (strategies does)

    if name.lower() not in REGISTRY:
        raise ValueError(f"strategy={name!r} is not known; choose one of {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name.lower()].name


def launch_settings(settings: LaunchSettings, script: str, script_args: Sequence[str] = (), *, module: bool = False) -> int:
    """Launch ``script`` (or module) under ``settings``; return the job's exit code."""
    if check_strategy_name(settings.strategy) == "xla":
        return run_xla(settings, script, script_args, module=module)
    total = total_processes(settings)
    where = "CPU" if settings.cpu else "auto device"
    print(
        f"trainer launch: {total} process(es) on {settings.num_machines} machine(s) [{where}, "
        f"strategy={settings.strategy}, mixed_precision={settings.mixed_precision}]",
        file=sys.stderr,
        flush=True,
    )
    return run_elastic(settings, torchrun_arguments(settings, script, script_args, module=module))


def run_xla(settings: LaunchSettings, script: str, script_args: Sequence[str] = (), *, module: bool = False) -> int:
    """XLA devices start through torch_xla's own launcher (``xmp.spawn``): one process per local device (or one
    with ``--num_processes 1``), each running the script as ``__main__``. On a multi-host pod, run the same
    command on every host; torch_xla's runtime joins them."""
    from strategies.xla import check_xla_processes, import_xla  # lazy: the CLI imports no torch (strategies does)

    check_xla_processes(settings.num_processes, os.environ.get("PJRT_DEVICE", "TPU"))  # before any process starts
    import_xla()  # an ImportError naming the fix when torch_xla is missing or built for another torch
    import torch_xla.distributed.xla_multiprocessing as xmp

    if settings.num_machines > 1:
        raise ValueError(
            f"--num_machines {settings.num_machines} with strategy='xla': run the same `trainer launch` on every host of "
            "the TPU pod instead; torch_xla's runtime joins the hosts"
        )
    env = {k: v for k, v in worker_environment(settings).items() if k != "TRAINWRIGHT_LAUNCHED"}
    env["PJRT_DEVICE"] = os.environ.get("PJRT_DEVICE", "TPU")
    print(f"trainer launch: torch_xla launcher [strategy=xla, mixed_precision={settings.mixed_precision}]", file=sys.stderr, flush=True)
    with patched_environ(env):
        xmp.spawn(_run_as_main, args=(script, list(script_args), module), nprocs=1 if settings.num_processes == 1 else None)
    return 0


def _run_as_main(index: int, script: str, script_args: list[str], module: bool) -> None:
    """One XLA worker: the script (or module) as ``__main__`` with its arguments."""
    import runpy

    sys.argv = [script, *script_args]
    if module:
        runpy.run_module(script, run_name="__main__", alter_sys=True)
    else:
        runpy.run_path(script, run_name="__main__")


def add_launch_parser(subparsers: Any) -> None:
    """Register ``trainer launch``."""
    parser = subparsers.add_parser(
        "launch",
        help="run a training script on several processes / machines (torchrun underneath)",
        description="Launch a script with torch.distributed.run. Settings: flags > config file > defaults. "
        f"Default config file: {default_config_path()}",
    )
    parser.add_argument("--config_file", help="config file (Trainwright or Accelerate YAML) to read settings from")
    parser.add_argument("-m", "--module", action="store_true", help="run the script argument as a module (python -m)")
    add_setting_arguments(parser)
    parser.add_argument("training_script", help="the script (or module, with -m) to run")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER, help="arguments for the script")
    parser.set_defaults(func=launch_command)


def launch_command(args: argparse.Namespace) -> int:
    """Run ``trainer launch``; return the job's exit code."""
    settings, _ = resolve_settings(args)
    script = args.training_script
    if not args.module and not os.path.isfile(script):
        raise FileNotFoundError(f"training script {script!r} does not exist; pass a path to a .py file or use -m module")
    return launch_settings(settings, script, args.training_script_args, module=args.module)
