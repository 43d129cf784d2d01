"""Weights & Biases tracker."""

from __future__ import annotations

from typing import Any

from callbacks.trackers.base import GeneralTracker, on_main_process, require_package, sanitize_config


class WandBTracker(GeneralTracker):
    """Log to a ``wandb`` run whose project is the run name.

    ``init_kwargs`` go to ``wandb.init`` (``entity``, ``name``, ``tags``, ``settings``, ...); when a
    logging directory is set and no ``dir`` is given, files go under it. For offline use set
    ``WANDB_MODE=offline`` in the environment before ``init_trackers``: the run is then written to
    ``wandb/offline-run-*/run-*.wandb`` for a later ``wandb sync``. `finish` also ends wandb's helper
    process (``wandb.teardown()``), so none outlives training. A dict value is handed to ``wandb.log`` nested, as
    Accelerate hands it (W&B shows ``{"eval": {"acc": 0.6}}`` as ``eval.acc``). Needs ``pip install wandb``.
    """

    name = "wandb"
    requires_logging_directory = False
    package = "wandb"
    pip_name = "wandb"

    @on_main_process
    def start(self) -> None:
        wandb = require_package("wandb", "wandb", self.name)
        kwargs = dict(self.init_kwargs)
        if self.logging_dir is not None:
            kwargs.setdefault("dir", self.logging_dir)
        kwargs.setdefault("project", self.run_name)
        self._run = wandb.init(**kwargs)

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self._run.config.update(sanitize_config(values), allow_val_change=True)

    @on_main_process
    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        prepared = self.prepare_tree(values)  # nested dicts as they are: wandb lays them out, as under Accelerate
        if prepared:
            self._run.log(prepared, step=step, **kwargs)

    @on_main_process
    def finish(self) -> None:
        import wandb

        if self._run is not None:
            self._run.finish()
        wandb.teardown()
