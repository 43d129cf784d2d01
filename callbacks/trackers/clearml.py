"""ClearML tracker."""

from __future__ import annotations

from typing import Any

from callbacks.trackers.base import GeneralTracker, on_main_process, require_package, sanitize_config, split_text


class ClearMLTracker(GeneralTracker):
    """Log to a ClearML task: project = run name, task name = ``init_kwargs["task_name"]`` or the run name.

    A key ``"a/b"`` is reported as title ``"a"``, series ``"b"`` (a key without ``/`` is both).
    Config goes to ``task.connect_configuration``; strings to ``report_text``. By default ClearML's
    framework hooks, argument-parser capture, stream capture and resource monitor are off (the
    framework reports metrics itself); ``init_kwargs`` for ``Task.init`` override that, and
    ``{"clearml": {"offline": True}}`` (or ``CLEARML_OFFLINE_MODE=1``) logs to
    ``$CLEARML_CACHE_DIR/offline`` without a server. Needs ``pip install clearml``.
    """

    name = "clearml"
    requires_logging_directory = False
    package = "clearml"
    pip_name = "clearml"

    @on_main_process
    def start(self) -> None:
        clearml = require_package("clearml", "clearml", self.name)
        kwargs: dict[str, Any] = {
            "auto_connect_frameworks": False,
            "auto_connect_arg_parser": False,
            "auto_connect_streams": False,
            "auto_resource_monitoring": False,
            **self.init_kwargs,
        }
        if kwargs.pop("offline", False):
            clearml.Task.set_offline(True)  # process-wide; stays on (going back online would connect)
        kwargs.setdefault("project_name", self.run_name)
        kwargs.setdefault("task_name", self.run_name)
        self._run = clearml.Task.init(**kwargs)

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self._run.connect_configuration(sanitize_config(values))

    @on_main_process
    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        numbers, texts = split_text(self.prepare_values(values))
        logger = self._run.get_logger()
        for key, value in numbers.items():
            title, _, series = key.rpartition("/")
            if step is None:
                logger.report_single_value(name=key, value=value)
            else:
                logger.report_scalar(title=title or key, series=series, value=value, iteration=step, **kwargs)
        for key, text in texts.items():
            logger.report_text(f"{key}: {text}", iteration=step, print_console=False)

    @on_main_process
    def finish(self) -> None:
        if self._run is not None:
            self._run.close()

