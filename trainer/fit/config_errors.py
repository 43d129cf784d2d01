"""Where in the ``--config`` files a command line error comes from: `LightningCLI`'s messages name the file that
holds the bad key, or the file that is not valid YAML."""

from __future__ import annotations

import re
from typing import Any

import yaml

_KEY_IN_MESSAGE = re.compile(r"""(?:option|[Kk]ey) ['"]([\w.\-]+)['"]""")


def config_files_of(args: list[str]) -> list[str]:
    """The values of ``-c``/``--config`` in command line arguments."""
    files = []
    for i, arg in enumerate(args):
        if arg in ("-c", "--config") and i + 1 < len(args):
            files.append(args[i + 1])
        elif arg.startswith("--config="):
            files.append(arg.split("=", 1)[1])
    return files


def where_in_config_files(message: str, files: list[str]) -> str:
    """`` (in config file 'x.yaml')`` for the files that hold the key `message` names, or that are not valid YAML."""
    match = _KEY_IN_MESSAGE.search(message)
    key = match.group(1).split(".") if match else None
    found, broken = [], []
    for path in files:
        try:
            with open(path) as handle:
                data = yaml.safe_load(handle)
        except yaml.YAMLError as err:
            broken.append(f"\n  config file {path!r} is not valid YAML: {err}")
            continue
        except OSError:
            continue
        if key and isinstance(data, dict) and (_holds(data, key) or any(_holds(v, key) for v in data.values())):
            found.append(path)  # the key itself, or under a subcommand's section (fit: trainer: ...)
    if broken:
        return "".join(broken)
    if not found:
        return ""
    return f" (in config file {found[0]!r})" if len(found) == 1 else f" (in config file {found[-1]!r}, the last of {found} setting it)"


def _holds(node: Any, key: list[str]) -> bool:
    for part in key:
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True
