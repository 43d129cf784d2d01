"""Aim tracker."""

from __future__ import annotations

from typing import Any

from callbacks.trackers.base import GeneralTracker, on_main_process, require_package, sanitize_config, split_text


class AimTracker(GeneralTracker):
    """Log to an Aim run in the repository at the logging directory, experiment = run name.

    Config goes to ``run["hparams"]``; numbers are tracked with ``run.track``; strings as
    ``aim.Text``. By default no system-metrics thread and no terminal capture are started
    (``system_tracking_interval=None``, ``log_system_params=False``, ``capture_terminal_logs=False``);
    ``init_kwargs`` for ``aim.Run`` override that. Needs ``pip install aim``.
    """

    name = "aim"
    requires_logging_directory = True
    package = "aim"
    pip_name = "aim"

    @on_main_process
    def start(self) -> None:
        aim = require_package("aim", "aim", self.name)
        kwargs: dict[str, Any] = {
            "repo": self.resolved_logging_dir(),
            "experiment": self.run_name,
            "system_tracking_interval": None,
            "log_system_params": False,
            "capture_terminal_logs": False,
            **self.init_kwargs,
        }
        self._run = aim.Run(**kwargs)

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self._run["hparams"] = sanitize_config(values)

    @on_main_process
    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        numbers, texts = split_text(self.prepare_values(values))
        for key, value in numbers.items():
            self._run.track(value, name=key, step=step, **kwargs)
        if texts:
            from aim import Text

            for key, text in texts.items():
                self._run.track(Text(text), name=key, step=step, **kwargs)

    @on_main_process
    def finish(self) -> None:
        if self._run is not None:
            self._run.close()
