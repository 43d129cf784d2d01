"""The config file that stores the launch settings (`trainer.cli.settings.LaunchSettings`), and ``trainer config``.

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
from pathlib import Path
from typing import Any, TextIO

from trainer.cli.accelerate_config import is_accelerate_config, settings_from_accelerate
from trainer.cli.settings import MIXED_PRECISION_ALIASES, RDZV_BACKENDS, LaunchSettings, setting_names

CONFIG_ENV_VAR = "TRAINWRIGHT_CONFIG_FILE"


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
