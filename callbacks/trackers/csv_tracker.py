"""The built-in CSV tracker: ``metrics.csv`` and ``hparams.yaml`` per run, no extra package."""

from __future__ import annotations

import csv
import os
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from callbacks.trackers.base import GeneralTracker, on_main_process, sanitize_config

if TYPE_CHECKING:
    from callbacks.view import TrainerView
    from trainer.fit.module import TrainModule


class CSVTracker(GeneralTracker):
    """Write metrics to ``<logging_dir>/logs/<run_name>/version_<n>/metrics.csv``.

    ``n`` is the next free version number. The file has a ``step`` column, an ``epoch`` column
    once a logged dict carries an ``epoch`` key, and one column per metric in order of first
    appearance; a metric that appears later rewrites the file with the wider header. Each `log`
    call is one row, written and flushed at once. The configuration goes to ``hparams.yaml``.

    Args:
        run_name: run name (``init_trackers``' project name, or the module's class name).
        logging_dir: the project directory; the current directory when unset.
        main_process_only: log from the main process only.
    """

    name = "csv"
    requires_logging_directory = True

    def __init__(
        self,
        run_name: str | None = None,
        logging_dir: str | os.PathLike[str] | None = None,
        *,
        main_process_only: bool = True,
    ) -> None:
        super().__init__(run_name, logging_dir, main_process_only=main_process_only)
        self.run_dir: Path | None = None
        self._fieldnames: list[str] = []
        self._file: IO[str] | None = None
        self._writer: Any = None  # a csv.writer: rows go out as lists in header order (the header is checked in log)
        self._config: dict[str, Any] = {}

    @property
    def tracker(self) -> CSVTracker:
        """The CSV tracker is its own run object."""
        return self

    @property
    def log_dir(self) -> str:
        """The run's folder, as Lightning's ``trainer.logger.log_dir`` (``<project_dir>/logs/<run_name>`` before the run starts)."""
        return str(self.run_dir) if self.run_dir is not None else str(Path(self.resolved_logging_dir()) / "logs" / (self.run_name or "default"))

    @property
    def metrics_file(self) -> Path | None:
        """Path of ``metrics.csv`` (``None`` before `start`)."""
        return None if self.run_dir is None else self.run_dir / "metrics.csv"

    @on_main_process
    def start(self) -> None:
        if self.run_dir is None or not self.continue_run:  # fit, then test: one run
            self._fieldnames, self._config = [], {}
            self.run_dir = self._make_run_dir()
        metrics = self.run_dir / "metrics.csv"
        if metrics.exists() and metrics.stat().st_size:
            with open(metrics, newline="") as handle:
                self._fieldnames = list(csv.DictReader(handle).fieldnames or [])
        self._open(append=True)

    def _make_run_dir(self) -> Path:
        """``<logging_dir>/logs/<run_name>/version_<n>`` (the next free n)."""
        return new_version_dir(Path(self.resolved_logging_dir()) / "logs" / (self.run_name or "default"))

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        import yaml

        self._config.update(sanitize_config(values))
        if self.run_dir is None:
            self.start()
        assert self.run_dir is not None
        with open(self.run_dir / "hparams.yaml", "w") as handle:
            yaml.safe_dump(self._config, handle, sort_keys=False)

    @on_main_process
    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        if self._writer is None:
            self.start()
        row: dict[str, Any] = {"step": "" if step is None else step}
        row.update(self.prepare_values(values))
        new = [key for key in row if key not in self._fieldnames]
        if new:
            self._widen_header(new)
        assert self._writer is not None and self._file is not None
        self._writer.writerow([row.get(name, "") for name in self._fieldnames])
        self._file.flush()

    @on_main_process
    def finish(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file = None
        self._writer = None

    def on_fit_end(self, trainer: TrainerView, module: TrainModule) -> None:
        if self.run_dir is not None and trainer.is_global_zero:
            print(f"Metrics and hyperparameters are in {self.run_dir}")

    def _open(self, *, append: bool) -> None:
        assert self.metrics_file is not None
        self._file = open(self.metrics_file, "a" if append else "w", newline="")  # noqa: SIM115 - open across log() calls, closed in finish()
        self._writer = csv.writer(self._file)

    def _widen_header(self, new: list[str]) -> None:
        """Add columns: ``step``, then ``epoch``, then metrics; rewrite the rows already written (a file with
        nothing written yet gets its header in place)."""
        rows: list[dict[str, str]] = []
        if self._file is not None and not self._fieldnames and self._file.tell() == 0:  # nothing written yet: no rewrite
            self._fieldnames = _header_order(new)
            assert self._writer is not None
            self._writer.writerow(self._fieldnames)
            return
        if self._file is not None:
            self._file.close()
            assert self.metrics_file is not None
            with open(self.metrics_file, newline="") as handle:
                rows = list(csv.DictReader(handle))
        self._fieldnames = _header_order(self._fieldnames + new)
        tmp = self.metrics_file.with_suffix(".csv.tmp")  # type: ignore[union-attr]
        with open(tmp, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=self._fieldnames, restval="")
            writer.writeheader()
            writer.writerows(rows)
        os.replace(tmp, self.metrics_file)  # type: ignore[arg-type]
        self._open(append=True)


def _header_order(names: list[str]) -> list[str]:
    """``step``, then ``epoch``, then the metrics in order of first appearance."""
    head = [name for name in ("step", "epoch") if name in names]
    return head + [name for name in names if name not in head]


def new_version_dir(root: Path) -> Path:
    """Create and return ``root/version_<n>`` with the next free ``n`` (safe against a concurrent run)."""
    root.mkdir(parents=True, exist_ok=True)
    taken = [
        int(entry.name[len("version_") :])
        for entry in root.iterdir()
        if entry.name.startswith("version_") and entry.name[len("version_") :].isdigit()
    ]
    version = max(taken, default=-1) + 1
    while True:
        path = root / f"version_{version}"
        try:
            path.mkdir()
            return path
        except FileExistsError:
            version += 1
