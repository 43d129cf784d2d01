"""``trainer env``: what a bug report needs — versions, platform, hardware and the active launch config.

Integrations are looked up with `importlib.metadata` only: nothing optional is imported.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
from importlib import metadata
from typing import Any

from trainer.cli.config import default_config_path, load_config_file

# distribution names, in the order they are shown; alternatives separated by "|"
INTEGRATIONS = (
    "numpy",
    "safetensors",
    "pyyaml",
    "tqdm",
    "torchmetrics",
    "tensorboard",
    "wandb",
    "comet_ml|comet-ml",
    "aim",
    "mlflow|mlflow-skinny",
    "clearml",
    "dvclive",
    "trackio",
    "swanlab",
    "deepspeed",
    "torch_xla|torch-xla",
    "accelerate",
    "lightning|pytorch-lightning",
)


def package_version(names: str) -> str | None:
    """The installed version of the first distribution of ``names`` ("a|b") that is installed, else ``None``."""
    for name in names.split("|"):
        try:
            return f"{metadata.version(name)}" + ("" if name == names.split("|")[0] else f" ({name})")
        except metadata.PackageNotFoundError:
            continue
    return None


def _hardware() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "CPU": platform.processor() or platform.machine(),
        "CPU cores": os.cpu_count(),
        "CUDA available": torch.cuda.is_available(),
    }
    if torch.cuda.is_available():
        info["CUDA version"] = torch.version.cuda
        info["GPUs"] = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
        info["NCCL available"] = torch.distributed.is_nccl_available()
    info["gloo available"] = torch.distributed.is_gloo_available()
    mps = getattr(torch.backends, "mps", None)
    info["MPS available"] = bool(mps and mps.is_available())
    return info


def collect_environment() -> dict[str, Any]:
    """Everything ``trainer env`` prints, as sections of name -> value."""
    versions: dict[str, Any] = {
        "trainwright": package_version("trainwright") or "not installed (running from source)",
        "Python": sys.version.split()[0],
        "torch": package_version("torch"),
    }
    integrations = {names.split("|")[0]: package_version(names) or "not installed" for names in INTEGRATIONS}
    system = {"platform": platform.platform(), "Python executable": sys.executable}
    path = default_config_path()
    config: dict[str, Any] = {"config file": str(path)}
    if path.is_file():
        try:
            config.update(load_config_file(path).to_dict())
        except (ValueError, OSError) as err:
            config["error"] = str(err)
    else:
        config["config file"] += " (does not exist: built-in defaults)"
    env_vars = {k: v for k, v in sorted(os.environ.items()) if k.startswith("TRAINWRIGHT_")}
    return {
        "Versions": versions,
        "Integrations": integrations,
        "System": system,
        "Hardware": _hardware(),
        "Launch config": config,
        "TRAINWRIGHT_* environment": env_vars or {"(none set)": ""},
    }


def format_environment(sections: dict[str, dict[str, Any]]) -> str:
    """Markdown-ish text, ready to paste into a bug report."""
    lines = ["Copy-and-paste the text below into your bug report.", ""]
    for title, values in sections.items():
        lines.append(f"## {title}")
        lines.extend(f"- {name}: {value}".rstrip(": ") for name, value in values.items())
        lines.append("")
    return "\n".join(lines)


def add_env_parser(subparsers: Any) -> None:
    """Register ``trainer env``."""
    parser = subparsers.add_parser("env", help="print versions, hardware and the active config for bug reports")
    parser.set_defaults(func=env_command)


def env_command(args: argparse.Namespace) -> int:
    """Run ``trainer env``."""
    print(format_environment(collect_environment()))
    return 0
