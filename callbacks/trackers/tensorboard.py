"""TensorBoard tracker: event files under ``<logging_dir>/<run_name>``."""

from __future__ import annotations

import os
from typing import Any

from callbacks.trackers.base import GeneralTracker, flat_config, on_main_process, require_package, sanitize_config, split_text


class TensorBoardTracker(GeneralTracker):
    """Log scalars (``add_scalar``), strings (``add_text``), dicts of scalars (``add_scalars``) and the config
    (``add_hparams``).

    As Accelerate's tracker: a dict value ``{"eval": {"acc": 0.6, "f1": 0.5}}`` goes to ``add_scalars("eval", ...)``,
    which writes each entry to a sub-run folder ``<run>/eval_acc``, ``<run>/eval_f1``, under the tag ``eval``
    (TensorBoard draws them as lines of one chart); a string inside it is text under ``eval/<key>``.

    Event files go to ``<logging_dir>/<run_name>``; the hyperparameters land in the same folder, in the
    event file and, as Accelerate writes them, in ``hparams.yml``.
    ``init_kwargs`` go to ``torch.utils.tensorboard.SummaryWriter`` (e.g. ``flush_secs``).
    Needs ``pip install tensorboard``.
    """

    name = "tensorboard"
    requires_logging_directory = True
    package = "tensorboard"
    pip_name = "tensorboard"

    @property
    def log_dir(self) -> str:
        """The folder holding this run's event files."""
        return os.path.join(self.resolved_logging_dir(), self.run_name or "default")

    @on_main_process
    def start(self) -> None:
        require_package("tensorboard", "tensorboard", self.name)
        from torch.utils.tensorboard import SummaryWriter

        self._run = SummaryWriter(log_dir=self.log_dir, **self.init_kwargs)

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        config = flat_config(values)
        if config:
            self._run.add_hparams(config, metric_dict={}, run_name=".")
            self._run.flush()
        import yaml

        with open(os.path.join(self.log_dir, "hparams.yml"), "w", encoding="utf-8") as file:
            yaml.safe_dump(sanitize_config(values), file, sort_keys=False)

    @on_main_process
    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        top, groups = self.prepare_groups(values)
        numbers, texts = split_text(top)
        for key, value in numbers.items():
            self._run.add_scalar(key, value, global_step=step, **kwargs)
        for key, group in groups.items():
            group_numbers, group_texts = split_text(group)
            if group_numbers:
                self._run.add_scalars(key, group_numbers, global_step=step, **kwargs)
            texts.update({f"{key}/{sub}": text for sub, text in group_texts.items()})
        for key, text in texts.items():
            self._run.add_text(key, text, global_step=step, **kwargs)
        self._run.flush()

    @on_main_process
    def finish(self) -> None:
        if self._run is not None:
            self._run.close()
