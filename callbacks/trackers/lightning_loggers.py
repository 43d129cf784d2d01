"""Lightning's logger classes by their names and constructor arguments, backed by our trackers.

``from lightning.pytorch.loggers import CSVLogger`` becomes ``from callbacks.trackers import CSVLogger``, and
``Trainer(logger=CSVLogger("logs", name="exp"))`` writes where Lightning writes: ``logs/exp/version_0/metrics.csv``
(and ``hparams.yaml``); ``TensorBoardLogger`` writes its event files to ``<save_dir>/<name>/version_<n>``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from callbacks.trackers.csv_tracker import CSVTracker, _new_version_dir
from callbacks.trackers.tensorboard import TensorBoardTracker


def _version_dir(root: Path, version: int | str | None) -> Path:
    if version is None:
        return _new_version_dir(root)
    path = root / (version if isinstance(version, str) else f"version_{version}")
    path.mkdir(parents=True, exist_ok=True)
    return path


class CSVLogger(CSVTracker):
    """Lightning's ``CSVLogger(save_dir, name="lightning_logs", version=None, prefix="")``.

    Args:
        save_dir: the directory the run folder goes in.
        name: the experiment folder (``""`` or None: none).
        version: an int (``version_<n>``), a folder name, or None for the next free ``version_<n>``.
        prefix: added in front of every metric name, joined with ``-``.
        flush_logs_every_n_steps: accepted for compatibility; every row is flushed when it is written.
    """

    def __init__(
        self, save_dir: str | os.PathLike[str] = ".", name: str | None = "lightning_logs", version: int | str | None = None,
        prefix: str = "", flush_logs_every_n_steps: int = 100,
    ) -> None:
        super().__init__(run_name=name or "", logging_dir=save_dir)
        self.save_dir, self.version, self.prefix = os.fspath(save_dir), version, prefix

    def _make_run_dir(self) -> Path:
        root = Path(self.save_dir) / self.run_name if self.run_name else Path(self.save_dir)
        return _version_dir(root, self.version)

    @property
    def log_dir(self) -> str:
        """Lightning's ``logger.log_dir``: the run's folder (known once the run started)."""
        return str(self.run_dir) if self.run_dir is not None else str(Path(self.save_dir) / (self.run_name or ""))

    @property
    def experiment(self) -> Any:
        """Lightning's ``logger.experiment``: the run object."""
        return self.tracker

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        if self.prefix:
            values = {k if k == "epoch" else f"{self.prefix}-{k}": v for k, v in values.items()}
        super().log(values, step=step, **kwargs)


class TensorBoardLogger(TensorBoardTracker):
    """Lightning's ``TensorBoardLogger(save_dir, name="lightning_logs", version=None, prefix="", **kwargs)``.

    Event files (and the hyperparameters) go to ``<save_dir>/<name>/<version>``; `kwargs` go to ``SummaryWriter``.
    """

    def __init__(
        self, save_dir: str | os.PathLike[str] = ".", name: str | None = "lightning_logs", version: int | str | None = None,
        prefix: str = "", **kwargs: Any,
    ) -> None:
        super().__init__(run_name=name or "", logging_dir=save_dir, **kwargs)
        self.save_dir, self.version, self.prefix = os.fspath(save_dir), version, prefix
        self._log_dir: str | None = None

    @property
    def log_dir(self) -> str:
        if self._log_dir is None:
            root = Path(self.save_dir) / self.run_name if self.run_name else Path(self.save_dir)
            self._log_dir = str(_version_dir(root, self.version))
        return self._log_dir

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        if self.prefix:
            values = {k if k == "epoch" else f"{self.prefix}-{k}": v for k, v in values.items()}
        super().log(values, step=step, **kwargs)

    @property
    def experiment(self) -> Any:
        """Lightning's ``logger.experiment``: the ``SummaryWriter``."""
        return self.tracker
