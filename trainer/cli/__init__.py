"""The ``trainer`` command: ``trainer launch | config | env | test | convert-checkpoint | estimate-memory``.

Each subcommand lives in its own module and registers itself with ``add_*_parser``. Bad input (a bad
setting, a missing file) prints one ``trainer <command>: error: ...`` line and exits with code 2.

The config-driven CLI of a training script, Lightning's ``lightning.pytorch.cli`` (``LightningCLI``, ...), is
``trainer.cli.LightningCLI``: an attribute loaded from `trainer.fit.cli` on first use, so the ``trainer`` command does
not import jsonargparse or the Trainer.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from trainer.cli.config import add_config_parser
from trainer.cli.convert import add_convert_parser
from trainer.cli.env import add_env_parser
from trainer.cli.estimate import add_estimate_parser
from trainer.cli.launch import add_launch_parser
from trainer.cli.selftest import add_test_parser

_CONFIG_CLI_NAMES = frozenset({
    "ArgsType", "LRSchedulerCallable", "LRSchedulerType", "LRSchedulerTypeTuple", "LRSchedulerTypeUnion", "LightningArgumentParser",
    "LightningCLI", "OptimizerCallable", "ReduceLROnPlateau", "SaveConfigCallback", "instantiate_class",
})


def __getattr__(name: str) -> Any:
    if name not in _CONFIG_CLI_NAMES:
        raise AttributeError(f"module 'trainer.cli' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module("trainer.fit.cli"), name)
    globals()[name] = value
    return value


def build_parser() -> argparse.ArgumentParser:
    """The ``trainer`` argument parser with all subcommands."""
    parser = argparse.ArgumentParser(
        prog="trainer", description="Trainwright command line: launch, configure, inspect, self-test, estimate memory."
    )
    subparsers = parser.add_subparsers(dest="command", metavar="{launch,config,env,test,convert-checkpoint,estimate-memory}")
    add_launch_parser(subparsers)
    add_config_parser(subparsers)
    add_env_parser(subparsers)
    add_test_parser(subparsers)
    add_convert_parser(subparsers)
    add_estimate_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``trainer`` command line and return its exit code.

    Args:
        argv: the arguments without the program name (``sys.argv[1:]`` when ``None``).
    """
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return int(args.func(args))
    except (ValueError, FileNotFoundError) as err:
        print(f"trainer {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"trainer {args.command}: interrupted", file=sys.stderr)
        return 130
