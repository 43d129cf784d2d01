"""Launch settings, the config file that stores them, and ``trainer config``.

A config file is flat YAML with the keys of `LaunchSettings`::

    num_processes: 2
    num_machines: 1
    cpu: true
    mixed_precision: bf16

Where it lives (the first that applies): the ``TRAINWRIGHT_CONFIG_FILE`` environment variable,
``$XDG_CONFIG_HOME/trainwright/default_config.yaml``, ``~/.config/trainwright/default_config.yaml``.
`load_config_file` also reads an Accelerate ``default_config.yaml`` (see `trainer.cli.accelerate_config`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TextIO

MIXED_PRECISION_ALIASES = {
    "no": "no",
    "32": "no",
    "32-true": "no",
    "fp32": "no",
    "fp16": "fp16",
    "16": "fp16",
    "16-mixed": "fp16",
    "bf16": "bf16",
    "bf16-mixed": "bf16",
    # true precision (strategies.precision holds the same names; a unit test keeps them in step)
    "bf16-true": "bf16-true",
    "fp16-true": "fp16-true",
    "16-true": "fp16-true",
    "fp64-true": "fp64-true",
    "64-true": "fp64-true",
    "64": "fp64-true",
    "fp64": "fp64-true",
    "double": "fp64-true",
}
RDZV_BACKENDS = ("static", "c10d", "etcd", "etcd-v2")
CONFIG_ENV_VAR = "TRAINWRIGHT_CONFIG_FILE"


@dataclass
class LaunchSettings:
    """Everything ``trainer launch`` needs to start a job; the keys of the config file.

    Attributes:
        num_processes: processes in total, over all machines (``None``: one per GPU, or 1 without GPUs).
        num_machines: machines (nodes) taking part.
        machine_rank: this machine's rank, ``0 <= machine_rank < num_machines``.
        main_process_ip: address of machine 0 (``None``: ``127.0.0.1``).
        main_process_port: port on machine 0 (``None``/``0``: a free port on one machine, 29500 on several).
        rdzv_backend: torchrun rendezvous backend: ``static``, ``c10d``, ``etcd`` or ``etcd-v2``.
        rdzv_join_timeout: seconds to wait for every machine to join before failing.
        max_restarts: times torchrun restarts the worker group after a failure.
        min_machines: elastic training: the fewest machines the job runs on (``None``: ``num_machines``). With
            ``max_machines`` it becomes torchrun's ``--nnodes MIN:MAX``; it needs a ``c10d`` or ``etcd`` rendezvous.
            After a machine is lost, torchrun restarts the survivors (``max_restarts``) once at least this many
            machines joined again; ``fit(ckpt_path="last")`` or ``load_state`` then resumes on the new number of
            processes (docs/elastic.md).
        max_machines: elastic training: the most machines the job runs on (``None``: ``num_machines``).
        monitor_interval: seconds between the elastic agent's looks at its workers (Accelerate's ``--monitor_interval``).
        rdzv_conf: more rendezvous settings for torchrun's ``--rdzv-conf``, ``key=value`` pairs separated by commas
            (Accelerate's ``--rdzv_conf``), e.g. ``last_call_timeout=10``; the join timeout is ``rdzv_join_timeout``.
        mixed_precision: ``no``, ``fp16``, ``bf16``, or true precision ``bf16-true``, ``fp16-true``, ``fp64-true``.
        strategy: strategy name (``auto``, ``single``, ``ddp``, ...).
        cpu: run on CPU even where GPUs exist.
        gradient_accumulation_steps: default gradient accumulation steps.
        process_group_timeout: process-group timeout in seconds (``None``: 300).
        gpu_ids: GPUs to use, e.g. ``"0,1"`` (``None``/``"all"``: all of them).
        deepspeed_plugin: `DeepSpeedPlugin` arguments for ``strategy: deepspeed`` (``zero_stage``,
            ``offload_optimizer_device``, ``gradient_clipping``, ``hf_ds_config`` (a DeepSpeed JSON file), ...);
            config files only.
        fsdp_plugin: `FullyShardedDataParallelPlugin` arguments for ``strategy: fsdp`` (an Accelerate config's
            ``fsdp_config``); config files only.
        dynamo_plugin: `TorchDynamoPlugin` arguments (an Accelerate config's ``dynamo_config``): the Accelerator
            compiles prepared models so; config files only.
    """

    num_processes: int | None = None
    num_machines: int = 1
    machine_rank: int = 0
    main_process_ip: str | None = None
    main_process_port: int | None = None
    rdzv_backend: str = "static"
    rdzv_join_timeout: int = 600
    max_restarts: int = 0
    min_machines: int | None = None
    max_machines: int | None = None
    monitor_interval: float = 0.1
    rdzv_conf: str | None = None
    mixed_precision: str = "no"
    strategy: str = "auto"
    cpu: bool = False
    gradient_accumulation_steps: int = 1
    process_group_timeout: float | None = None
    gpu_ids: str | None = None
    deepspeed_plugin: dict[str, Any] | None = None
    fsdp_plugin: dict[str, Any] | None = None
    dynamo_plugin: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check every value; raise `ValueError` naming the bad one and the fix."""
        _check_int(self, "num_processes", minimum=1, optional=True)
        _check_int(self, "num_machines", minimum=1)
        _check_int(self, "machine_rank", minimum=0)
        _check_int(self, "main_process_port", minimum=0, optional=True)
        _check_int(self, "rdzv_join_timeout", minimum=1)
        _check_int(self, "max_restarts", minimum=0)
        _check_int(self, "min_machines", minimum=1, optional=True)
        _check_int(self, "max_machines", minimum=1, optional=True)
        self._check_elastic()
        _check_int(self, "gradient_accumulation_steps", minimum=1)
        if self.machine_rank >= self.num_machines:
            raise ValueError(
                f"machine_rank={self.machine_rank} must be smaller than num_machines={self.num_machines}; "
                f"number the machines 0..{self.num_machines - 1}"
            )
        if self.main_process_port is not None and self.main_process_port > 65535:
            raise ValueError(f"main_process_port={self.main_process_port} is not a port; use 1..65535, or 0 for a free port")
        if self.num_processes is not None and self.num_processes % self.num_machines:
            raise ValueError(
                f"num_processes={self.num_processes} (the total over all machines) is not divisible by "
                f"num_machines={self.num_machines}; give every machine the same number of processes"
            )
        mp = str(self.mixed_precision).lower()
        if mp not in MIXED_PRECISION_ALIASES:
            raise ValueError(
                f"mixed_precision={self.mixed_precision!r} is not supported; choose one of 'no', 'fp16', 'bf16', 'fp16-true', "
                "'bf16-true', 'fp64-true' (or '32', '16-mixed', 'bf16-mixed', '16-true', '64-true', 'double')"
            )
        self.mixed_precision = MIXED_PRECISION_ALIASES[mp]
        if self.rdzv_backend not in RDZV_BACKENDS:
            raise ValueError(
                f"rdzv_backend={self.rdzv_backend!r} is not supported; choose one of {', '.join(RDZV_BACKENDS)}"
            )
        if not isinstance(self.cpu, bool):
            raise ValueError(f"cpu={self.cpu!r} must be true or false")
        if not isinstance(self.strategy, str) or not self.strategy:
            raise ValueError(f"strategy={self.strategy!r} must be a strategy name such as 'auto', 'ddp' or 'single'")
        # lazy: the CLI imports no torch (trainer.accelerator does)
        from trainer.accelerator.config import DeepSpeedPlugin, FullyShardedDataParallelPlugin, TorchDynamoPlugin

        _check_plugin("deepspeed_plugin", self.deepspeed_plugin, DeepSpeedPlugin, "e.g. {zero_stage: 3}")
        plugin = _check_plugin("fsdp_plugin", self.fsdp_plugin, FullyShardedDataParallelPlugin, "e.g. {fsdp_version: 2}")
        if plugin is not None:
            plugin.strategy_kwargs()  # its own checks of the values
        _check_plugin("dynamo_plugin", self.dynamo_plugin, TorchDynamoPlugin, "e.g. {backend: inductor}")
        if self.process_group_timeout is not None:
            if isinstance(self.process_group_timeout, bool) or not isinstance(self.process_group_timeout, (int, float)):
                raise ValueError(
                    f"process_group_timeout={self.process_group_timeout!r} must be a number of seconds, e.g. 300"
                )
            if self.process_group_timeout <= 0:
                raise ValueError(f"process_group_timeout={self.process_group_timeout!r} must be positive, e.g. 300")

    def machine_range(self) -> tuple[int, int]:
        """``(fewest, most)`` machines the job runs on (both ``num_machines`` unless elastic)."""
        return (self.min_machines or self.num_machines, self.max_machines or self.num_machines)

    def _check_elastic(self) -> None:
        low, high = self.machine_range()
        if not low <= self.num_machines <= high:
            raise ValueError(
                f"min_machines={low}, num_machines={self.num_machines}, max_machines={high}: the job starts on num_machines "
                "machines and may shrink to min_machines or grow to max_machines; give min_machines <= num_machines <= max_machines"
            )
        if low != high and self.rdzv_backend == "static":
            raise ValueError(
                f"min_machines={low} and max_machines={high} (elastic) need a rendezvous that machines can leave and join: "
                "pass --rdzv_backend c10d (or etcd), not static"
            )
        interval = self.monitor_interval
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not 0 < interval < float("inf"):
            raise ValueError(f"monitor_interval={interval!r} must be a number of seconds > 0, e.g. 0.1")
        if self.rdzv_conf is not None:
            pairs = [pair.partition("=") for pair in str(self.rdzv_conf).split(",") if pair.strip()]
            bad = [key + sep + value for key, sep, value in pairs if not (key.strip() and sep and value.strip())]
            if not isinstance(self.rdzv_conf, str) or bad:
                raise ValueError(f"rdzv_conf={self.rdzv_conf!r} must be key=value pairs separated by commas, e.g. 'last_call_timeout=10'")
            if any(key.strip() in ("join_timeout", "timeout") for key, _, _ in pairs):
                raise ValueError(f"rdzv_conf={self.rdzv_conf!r} sets the join timeout; pass it as --rdzv_join_timeout instead")

    def to_dict(self) -> dict[str, Any]:
        """The settings as a plain dict, in field order (what the config file holds)."""
        return dataclasses.asdict(self)

    def updated(self, **changes: Any) -> LaunchSettings:
        """A copy with ``changes`` applied (and validated); unknown names raise `ValueError`."""
        unknown = sorted(set(changes) - set(setting_names()))
        if unknown:
            raise ValueError(f"unknown launch setting(s) {unknown}; valid settings are {setting_names()}")
        return dataclasses.replace(self, **changes)


def _check_int(settings: LaunchSettings, name: str, *, minimum: int, optional: bool = False) -> None:
    value = getattr(settings, name)
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}={value!r} must be an integer >= {minimum}")


def setting_names() -> list[str]:
    """The valid keys of a Trainwright config file."""
    return [f.name for f in fields(LaunchSettings)]


def default_config_path(env: Mapping[str, str] | None = None) -> Path:
    """Where the config file lives: ``$TRAINWRIGHT_CONFIG_FILE``, else ``$XDG_CONFIG_HOME`` or ``~/.config``."""
    env = os.environ if env is None else env
    if env.get(CONFIG_ENV_VAR):
        return Path(env[CONFIG_ENV_VAR]).expanduser()
    base = env.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "trainwright" / "default_config.yaml"


def load_config_file(path: str | os.PathLike[str]) -> LaunchSettings:
    """Read a Trainwright or Accelerate config file.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: the file is not a YAML mapping, has unknown keys or bad values.
    """
    import yaml

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {str(path)!r} does not exist; create one with `trainer config`")
    with open(path, encoding="utf-8") as fh:
        try:
            data = yaml.safe_load(fh)
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            problem = getattr(err, "problem", None) or str(err).splitlines()[0]
            raise ValueError(
                f"config file {str(path)!r} is not valid YAML{where}: {problem}; fix that line or recreate the file with `trainer config`"
            ) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(f"config file {str(path)!r} must hold a YAML mapping of settings, got {type(data).__name__}")
    from trainer.cli.accelerate_config import is_accelerate_config, settings_from_accelerate  # lazy: import cycle (it imports this module)

    if is_accelerate_config(data):
        return settings_from_accelerate(data, source=str(path))
    unknown = sorted(set(data) - set(setting_names()))
    if unknown:
        raise ValueError(f"config file {str(path)!r} has unknown key(s) {unknown}; valid keys are {setting_names()}")
    return LaunchSettings(**data)


def save_config_file(settings: LaunchSettings, path: str | os.PathLike[str]) -> Path:
    """Write ``settings`` as YAML to ``path`` (creating its folder) and return the path."""
    import yaml

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        yaml.safe_dump(settings.to_dict(), fh, sort_keys=False)
    os.replace(tmp, path)
    return path


# ----------------------------------------------------------------------------- the questionnaire


def _parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("y", "yes", "true", "1"):
        return True
    if value in ("n", "no", "false", "0"):
        return False
    raise ValueError(f"{text!r} is not yes or no")


def _parse_int(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError(f"{text!r} is not a whole number") from None


def _parse_optional_int(text: str) -> int | None:
    return None if text.strip().lower() in ("", "none", "auto") else _parse_int(text)


def _choice(*options: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in options:
            raise ValueError(f"{text!r} is not one of {', '.join(options)}")
        return value

    return parse


class Questionnaire:
    """Asks one question per line of ``stdin``; an empty line (or the end of input) keeps the default."""

    def __init__(self, *, stdin: TextIO, stdout: TextIO, max_attempts: int = 3) -> None:
        self.stdin = stdin
        self.stdout = stdout
        self.max_attempts = max_attempts

    def ask(self, question: str, default: Any, parse: Callable[[str], Any]) -> Any:
        """Ask until the answer parses; raise `ValueError` after ``max_attempts`` bad answers."""
        shown = "auto" if default is None else ("yes" if default is True else "no" if default is False else default)
        for _ in range(self.max_attempts):
            self.stdout.write(f"{question} [{shown}]: ")
            self.stdout.flush()
            line = self.stdin.readline()
            answer = line.strip()
            if not self._interactive():  # echo piped answers so the transcript reads like a dialogue
                self.stdout.write(f"{answer}\n")
            if not answer:
                return default
            try:
                return parse(answer)
            except ValueError as err:
                self.stdout.write(f"  {err}; try again\n")
        raise ValueError(f"no valid answer to {question!r} after {self.max_attempts} attempts")

    def _interactive(self) -> bool:
        isatty = getattr(self.stdin, "isatty", None)
        return bool(isatty and isatty())


def ask_settings(q: Questionnaire, start: LaunchSettings) -> LaunchSettings:
    """Run the questionnaire, starting from ``start``'s values as defaults."""
    s = dataclasses.replace(start)
    s.num_machines = q.ask("How many machines (nodes) will take part?", s.num_machines, _parse_int)
    if s.num_machines > 1:
        s.machine_rank = q.ask("What is the rank of this machine (0 for the main one)?", s.machine_rank, _parse_int)
        s.main_process_ip = q.ask("What is the IP address of machine 0?", s.main_process_ip or "127.0.0.1", str.strip)
        s.main_process_port = q.ask("Which port on machine 0?", s.main_process_port or 29500, _parse_int)
        s.rdzv_backend = q.ask("Rendezvous backend (static, c10d, etcd, etcd-v2)?", s.rdzv_backend, _choice(*RDZV_BACKENDS))
        s.rdzv_join_timeout = q.ask("Seconds to wait for all machines to join?", s.rdzv_join_timeout, _parse_int)
    else:
        s.machine_rank, s.main_process_ip, s.main_process_port = 0, None, None
    s.cpu = q.ask("Run on CPU only, even if GPUs are available?", s.cpu, _parse_bool)
    s.num_processes = q.ask(
        "How many processes in total, over all machines ('auto': one per GPU)?", s.num_processes, _parse_optional_int
    )
    s.strategy = q.ask("Which strategy (auto, single, ddp, fsdp, deepspeed)?", s.strategy, str.strip)
    s.mixed_precision = q.ask("Mixed precision (no, fp16, bf16)?", s.mixed_precision, _choice(*MIXED_PRECISION_ALIASES))
    s.gradient_accumulation_steps = q.ask("Gradient accumulation steps?", s.gradient_accumulation_steps, _parse_int)
    s.validate()
    return s


# ----------------------------------------------------------------------------- `trainer config`


def add_setting_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one ``--<setting>`` flag per launch setting; every default is ``None`` (= not given)."""
    group = parser.add_argument_group("launch settings (flags > config file > defaults)")
    group.add_argument("--num_processes", type=int, help="processes in total over all machines")
    group.add_argument("--num_machines", type=int, help="machines (nodes) taking part")
    group.add_argument("--machine_rank", type=int, help="rank of this machine, 0..num_machines-1")
    group.add_argument("--main_process_ip", help="address of machine 0 (default 127.0.0.1)")
    group.add_argument("--main_process_port", type=int, help="port on machine 0 (0: pick a free port, one machine only)")
    group.add_argument("--rdzv_backend", help=f"rendezvous backend: {', '.join(RDZV_BACKENDS)}")
    group.add_argument(
        "--rdzv_join_timeout", type=int, help="seconds to wait for all machines to join (default 600)"
    )
    group.add_argument("--max_restarts", type=int, help="restarts of the worker group after a failure (default 0)")
    group.add_argument("--min_machines", type=int, help="elastic: the fewest machines the job goes on with (default num_machines)")
    group.add_argument("--max_machines", type=int, help="elastic: the most machines the job takes (default num_machines)")
    group.add_argument("--monitor_interval", type=float, help="seconds between the agent's looks at its workers (default 0.1)")
    group.add_argument("--rdzv_conf", help="more rendezvous settings, key=value pairs separated by commas")
    group.add_argument("--mixed_precision", help="no, fp16, bf16, or true precision bf16-true, fp16-true, fp64-true")
    group.add_argument("--strategy", help="strategy name: auto, single, ddp, ...")
    group.add_argument("--cpu", action="store_const", const=True, default=None, help="run on CPU even with GPUs")
    group.add_argument("--gradient_accumulation_steps", type=int, help="default gradient accumulation steps")
    group.add_argument("--process_group_timeout", type=float, help="process-group timeout in seconds (default 300)")
    group.add_argument("--gpu_ids", help="GPUs to use, e.g. 0,1 (default all)")


def flag_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given as flags (those not ``None``)."""
    return {name: getattr(args, name) for name in setting_names() if getattr(args, name, None) is not None}


def resolve_settings(args: argparse.Namespace) -> tuple[LaunchSettings, Path | None]:
    """Flags > config file (``--config_file`` or the default location, if it exists) > defaults."""
    path: Path | None = Path(args.config_file) if getattr(args, "config_file", None) else default_config_path()
    if path is not None and (getattr(args, "config_file", None) or path.is_file()):
        settings = load_config_file(path)
    else:
        settings, path = LaunchSettings(), None
    return settings.updated(**flag_overrides(args)), path


def add_config_parser(subparsers: Any) -> None:
    """Register ``trainer config``."""
    parser = subparsers.add_parser(
        "config",
        help="write the launch config file (questionnaire, or non-interactive with flags)",
        description="Without an action, ask questions (answers may be piped on stdin). "
        "'default' writes the defaults (plus any flags), 'show' prints the active config. "
        "Setting flags without an action update the file without asking.",
    )
    parser.add_argument("action", nargs="?", choices=["default", "show"], help="non-interactive action")
    parser.add_argument("--config_file", help=f"config file to write (default: {default_config_path()})")
    add_setting_arguments(parser)
    parser.set_defaults(func=config_command)


def config_command(args: argparse.Namespace) -> int:
    """Run ``trainer config``; return the exit code."""
    path = Path(args.config_file) if args.config_file else default_config_path()
    overrides = flag_overrides(args)
    if args.action == "show":
        import yaml

        settings = load_config_file(path) if path.is_file() else LaunchSettings()
        print(f"# {path}" + ("" if path.is_file() else " (does not exist: built-in defaults)"))
        print(yaml.safe_dump(settings.updated(**overrides).to_dict(), sort_keys=False), end="")
        return 0
    if args.action == "default":
        settings = LaunchSettings().updated(**overrides)
    else:
        start = load_config_file(path) if path.is_file() else LaunchSettings()
        start = start.updated(**overrides)
        settings = start if overrides else ask_settings(Questionnaire(stdin=sys.stdin, stdout=sys.stdout), start)
    save_config_file(settings, path)
    print(f"Configuration saved at {path}")
    return 0


def _check_plugin(name: str, value: Any, plugin: type, example: str) -> Any:
    """A plugin section of a launch config (a mapping of the plugin's fields) built once, so its own checks run now."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f"{name}={value!r} must be a mapping of {plugin.__name__} arguments, {example}")
    known = [f.name for f in fields(plugin)]
    unknown = sorted(set(value) - set(known))
    if unknown:
        raise ValueError(f"{name} has unknown key(s) {unknown}; known: {known}")
    return plugin(**value)
