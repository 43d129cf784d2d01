"""SwanLab tracker."""

from __future__ import annotations

import os
from typing import Any

from callbacks.trackers.base import GeneralTracker, on_main_process, require_package, sanitize_config


class SwanLabTracker(GeneralTracker):
    """Log to a SwanLab run in the project named after the run name; local files in ``<logging_dir>/swanlog``.

    ``init_kwargs`` go to ``swanlab.init`` (``mode`` — ``"offline"``/``"local"`` for no network —
    ``workspace``, ``name``, ``settings``, ...). Without ``settings`` this tracker turns off SwanLab's
    probes (git, hardware, ``pip list``, system monitor) and its terminal capture, so ``init`` runs no
    subprocess and wraps no stream. Strings are logged as ``swanlab.Text``. Needs ``pip install swanlab``.
    """

    name = "swanlab"
    requires_logging_directory = True
    package = "swanlab"
    pip_name = "swanlab"

    @on_main_process
    def start(self) -> None:
        swanlab = require_package("swanlab", "swanlab", self.name)
        kwargs = dict(self.init_kwargs)
        kwargs.setdefault("project", self.run_name)
        kwargs.setdefault("log_dir", os.path.join(self.resolved_logging_dir(), "swanlog"))
        if "settings" not in kwargs:
            kwargs["settings"] = swanlab.Settings(
                interactive=False,
                probe={
                    "hardware": False,
                    "runtime": False,
                    "requirements": False,
                    "conda": False,
                    "git": False,
                    "swanlab": False,
                    "monitor": False,
                },
                terminal={"proxy_type": "none"},
            )
        self._run = swanlab.init(**kwargs)

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self._run.config.update(sanitize_config(values))

    @on_main_process
    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        data = _with_text(self.prepare_tree(values))  # nested dicts as they are (SwanLab: "a/b"), as under Accelerate
        if data:
            self._run.log(data, step=step, **kwargs)

    @on_main_process
    def finish(self) -> None:
        if self._run is not None:
            self._run.finish()


def _with_text(tree: dict[str, Any]) -> dict[str, Any]:
    """Strings (at any depth) as ``swanlab.Text``."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out[key] = _with_text(value)
        elif isinstance(value, str):
            import swanlab

            out[key] = swanlab.Text(value)
        else:
            out[key] = value
    return out
