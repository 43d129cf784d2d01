"""Comet ML tracker."""

from __future__ import annotations

import os
from typing import Any

from callbacks.trackers.base import GeneralTracker, flat_config, on_main_process, require_package, split_text


class CometMLTracker(GeneralTracker):
    """Log to a Comet experiment in the project named after the run.

    ``init_kwargs`` go to ``comet_ml.start`` (``workspace``, ``online``, ``experiment_config``, ...).
    Offline: ``{"comet_ml": {"online": False}}`` writes a ``.zip`` archive to the logging directory
    (or to ``experiment_config.offline_directory``) for a later ``comet upload``. Without an
    ``experiment_config`` the source-code upload is off (it would capture this module, not your
    script). Strings are logged
    with ``log_text``. A dict value's entries are logged as Accelerate logs them, with ``log_metrics(value)``: under
    their own names, without the dict's key (``{"eval": {"acc": 0.6}}`` is the metric ``acc``). Before importing ``comet_ml`` this tracker sets, unless already set,
    ``COMET_DISABLE_AUTO_LOGGING=1`` (metrics come from this framework, not from hooks into torch)
    and ``COMET_ERROR_TRACKING_ENABLE=false``. Needs ``pip install comet_ml``.
    """

    name = "comet_ml"
    requires_logging_directory = False
    package = "comet_ml"
    pip_name = "comet_ml"

    @on_main_process
    def start(self) -> None:
        os.environ.setdefault("COMET_DISABLE_AUTO_LOGGING", "1")
        os.environ.setdefault("COMET_ERROR_TRACKING_ENABLE", "false")
        comet_ml = require_package("comet_ml", "comet_ml", self.name)
        kwargs = dict(self.init_kwargs)
        kwargs.setdefault("project_name", self.run_name)
        if "experiment_config" not in kwargs:
            offline = kwargs.get("online") is False and self.logging_dir is not None
            directory = self.logging_dir if offline else None
            kwargs["experiment_config"] = comet_ml.ExperimentConfig(log_code=False, offline_directory=directory)
        self._run = comet_ml.start(**kwargs)

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self._run.log_parameters(flat_config(values))

    @on_main_process
    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        top, groups = self.prepare_groups(values)
        numbers, texts = split_text(top)
        if numbers:
            self._run.log_metrics(numbers, step=step, **kwargs)
        for key, group in groups.items():  # as Accelerate's tracker: the dict's entries under their own names
            group_numbers, group_texts = split_text(group)
            if group_numbers:
                self._run.log_metrics(group_numbers, step=step, **kwargs)
            texts.update({f"{key}/{sub}": text for sub, text in group_texts.items()})
        for key, text in texts.items():
            self._run.log_text(text, step=step, metadata={"name": key})

    @on_main_process
    def finish(self) -> None:
        if self._run is not None:
            self._run.end()
