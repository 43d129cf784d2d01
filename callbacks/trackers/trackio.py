"""Trackio tracker."""

from __future__ import annotations

from typing import Any

from callbacks.trackers.base import GeneralTracker, on_main_process, require_package, sanitize_config


class TrackioTracker(GeneralTracker):
    """Log to a Trackio run in the project named after the run name, with the given ``step``.

    Runs are stored where Trackio keeps them: ``TRACKIO_DIR`` (set it before ``init_trackers``),
    by default ``~/.cache/huggingface/trackio``. ``init_kwargs`` go to ``trackio.init``
    (``name``, ``space_id``, ``group``, ...); by default no dashboard is embedded and no GPU/CPU
    monitor thread is started. Trackio saves the config with the first logged row, so a config
    stored after the first `log` cannot be recorded (a warning says so). A dict value is handed to Trackio nested,
    as Accelerate hands it (stored nested in the row's JSON). Needs ``pip install trackio``.
    """

    name = "trackio"
    requires_logging_directory = False
    package = "trackio"
    pip_name = "trackio"

    @on_main_process
    def start(self) -> None:
        trackio = require_package("trackio", "trackio", self.name)
        kwargs: dict[str, Any] = {"embed": False, "auto_log_gpu": False, "auto_log_cpu": False, **self.init_kwargs}
        kwargs.setdefault("project", self.run_name or "default")
        self._run = trackio.init(**kwargs)

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        if getattr(self._run, "_config_logged", False):
            self.warn_once("late-config", "Trackio stores the config with the first logged row; this config is lost")
        self._run.config.update(sanitize_config(values))

    @on_main_process
    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        prepared = self.prepare_tree(values)  # nested dicts as they are, as under Accelerate
        if prepared:
            self._run.log(prepared, step=step, **kwargs)

    @on_main_process
    def finish(self) -> None:
        if self._run is None:
            return
        from trackio import context_vars

        self._run.finish()
        if context_vars.current_run.get() is self._run:
            context_vars.current_run.set(None)
