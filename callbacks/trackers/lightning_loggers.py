"""Lightning's logger classes by their names and constructor arguments, backed by our trackers.

``from lightning.pytorch.loggers import CSVLogger`` becomes ``from callbacks.trackers import CSVLogger``, and
``Trainer(logger=CSVLogger("logs", name="exp"))`` writes where Lightning writes: ``logs/exp/version_0/metrics.csv``
(and ``hparams.yaml``); ``TensorBoardLogger`` writes its event files to ``<save_dir>/<name>/version_<n>``;
``WandbLogger``, ``MLFlowLogger`` and ``CometLogger`` take Lightning's arguments and run our W&B, MLflow and Comet
trackers.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from callbacks.trackers.base import on_main_process, require_package
from callbacks.trackers.comet import CometMLTracker
from callbacks.trackers.csv_tracker import CSVTracker, new_version_dir
from callbacks.trackers.mlflow import MLflowTracker
from callbacks.trackers.tensorboard import TensorBoardTracker
from callbacks.trackers.wandb import WandBTracker


def _prefixed(values: dict[str, Any], prefix: str) -> dict[str, Any]:
    """Lightning's logger ``prefix``: in front of every metric name but ``epoch``, joined with ``-``."""
    return {k if k == "epoch" or not prefix else f"{prefix}-{k}": v for k, v in values.items()}


def _refuse(logger: str, **unsupported: Any) -> None:
    given = {name: value for name, value in unsupported.items() if value not in (None, False)}
    if given:
        raise ValueError(
            f"{logger} does not support {sorted(given)} (given {given}); leave them unset. Checkpoints are written by "
            "ModelCheckpoint into the checkpoint directory, not uploaded by the logger"
        )


def _version_dir(root: Path, version: int | str | None) -> Path:
    if version is None:
        return new_version_dir(root)
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
        super().log(_prefixed(values, self.prefix), step=step, **kwargs)


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
        super().log(_prefixed(values, self.prefix), step=step, **kwargs)

    @property
    def experiment(self) -> Any:
        """Lightning's ``logger.experiment``: the ``SummaryWriter``."""
        return self.tracker


class WandbLogger(WandBTracker):
    """Lightning's ``WandbLogger(name=None, save_dir=".", version=None, offline=False, dir=None, id=None,
    anonymous=None, project=None, log_model=False, experiment=None, prefix="", checkpoint_name=None, **kwargs)``.

    ``project`` (default ``"lightning_logs"``) is the W&B project, ``name`` the run's display name, ``id``/``version``
    the run id (to resume one), ``offline=True`` writes the run locally for a later ``wandb sync``; the files go under
    ``dir`` or ``save_dir``. ``kwargs`` go to ``wandb.init``. Uploading checkpoints (``log_model``) and wrapping an
    existing run (``experiment``) are refused.
    """

    def __init__(
        self, name: str | None = None, save_dir: str | os.PathLike[str] = ".", version: str | None = None, offline: bool = False,
        dir: str | os.PathLike[str] | None = None, id: str | None = None, anonymous: bool | None = None, project: str | None = None,
        log_model: bool | str = False, experiment: Any = None, prefix: str = "", checkpoint_name: str | None = None, **kwargs: Any,
    ) -> None:
        _refuse("WandbLogger", log_model=log_model, experiment=experiment, checkpoint_name=checkpoint_name)
        run_id = id or version
        init: dict[str, Any] = {k: v for k, v in {"name": name, "id": run_id, "anonymous": "allow" if anonymous else None,
                                                 "mode": "offline" if offline else None}.items() if v is not None}
        if run_id is not None:
            init["resume"] = "allow"
        super().__init__(project or "lightning_logs", os.fspath(dir if dir is not None else save_dir), **{**init, **kwargs})
        self.save_dir, self.prefix = os.fspath(dir if dir is not None else save_dir), prefix

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        super().log(_prefixed(values, self.prefix), step=step, **kwargs)

    @property
    def experiment(self) -> Any:
        """Lightning's ``logger.experiment``: the ``wandb`` run."""
        return self.tracker

    @property
    def version(self) -> str | None:
        return None if self.tracker is None else str(self.tracker.id)


class MLFlowLogger(MLflowTracker):
    """Lightning's ``MLFlowLogger(experiment_name="lightning_logs", run_name=None, tracking_uri=$MLFLOW_TRACKING_URI,
    tags=None, save_dir="./mlruns", log_model=False, prefix="", artifact_location=None, run_id=None, synchronous=None)``.

    Without a tracking URI the runs go to a local file store at ``save_dir``, as in Lightning. Uploading checkpoints
    (``log_model``) and a custom ``artifact_location`` are refused.
    """

    def __init__(
        self, experiment_name: str = "lightning_logs", run_name: str | None = None, tracking_uri: str | None = None,
        tags: dict[str, Any] | None = None, save_dir: str | os.PathLike[str] | None = "./mlruns", log_model: bool | str = False,
        prefix: str = "", artifact_location: str | None = None, run_id: str | None = None, synchronous: bool | None = None,
    ) -> None:
        # metrics are logged synchronously; asking for asynchronous logging is refused rather than ignored
        _refuse("MLFlowLogger", log_model=log_model, artifact_location=artifact_location, asynchronous=True if synchronous is False else None)
        uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if uri is None and save_dir is not None:
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            uri = Path(save_dir).absolute().as_uri()
        super().__init__(experiment_name, None, run_id=run_id, tags=tags, run_name=run_name, tracking_uri=uri)
        self.save_dir, self.prefix = None if save_dir is None else os.fspath(save_dir), prefix

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        super().log(_prefixed(values, self.prefix), step=step, **kwargs)

    @property
    def experiment(self) -> Any:
        """Lightning's ``logger.experiment``: an ``mlflow.MlflowClient`` on the tracking URI."""
        import mlflow

        return mlflow.MlflowClient()

    @property
    def run_id(self) -> str | None:
        return None if self.tracker is None else self._run_id


_COMET_MODES = (None, "get_or_create", "get", "create")
# Lightning's CometLogger before 2.5 took these names; 2.5 still accepts them (with a deprecation warning)
_COMET_OLD_NAMES = {"experiment_name": "name", "project_name": "project", "save_dir": "offline_directory", "offline": "online"}


class CometLogger(CometMLTracker):
    """Lightning's (2.5+) ``CometLogger(*, api_key=None, workspace=None, project=None, experiment_key=None, mode=None,
    online=None, prefix=None, **kwargs)``, backed by our Comet tracker.

    The arguments go to ``comet_ml.start``; `kwargs` go to ``comet_ml.ExperimentConfig`` (``name``,
    ``offline_directory``, ``tags``, ``log_code``, ...; ``log_code`` is off unless given: it would upload this module,
    not your script). ``online=False`` writes an offline archive (to ``offline_directory``) for a later
    ``comet upload``. Metrics go to Comet with their ``epoch`` as Comet's epoch and `prefix` joined by Comet (``_``),
    as Lightning's logger does. Lightning's older names are accepted: ``experiment_name`` (``name``), ``project_name``
    (``project``), ``save_dir`` (``offline_directory``) and ``offline`` (``online=not offline``).

    Raises:
        ValueError: `mode` is not one of Comet's, or an old name is given together with its new one.
    """

    def __init__(
        self, *, api_key: str | None = None, workspace: str | None = None, project: str | None = None,
        experiment_key: str | None = None, mode: str | None = None, online: bool | None = None, prefix: str | None = None,
        **kwargs: Any,
    ) -> None:
        if mode not in _COMET_MODES:
            raise ValueError(f"CometLogger(mode={mode!r}) is not a Comet mode; use 'get_or_create', 'get', 'create' or None")
        for old, new in _COMET_OLD_NAMES.items():
            if old not in kwargs:
                continue
            given_new = {"project": project, "online": online}.get(new, kwargs.get(new))
            if given_new is not None:
                raise ValueError(f"CometLogger got both {old}= and {new}=; pass only {new}= (Lightning's current name)")
            value = kwargs.pop(old)
            if new == "project":
                project = value
            elif new == "online":
                online = not value
            else:
                kwargs[new] = value
        start: dict[str, Any] = {"api_key": api_key, "workspace": workspace, "experiment_key": experiment_key, "mode": mode, "online": online}
        super().__init__(project, None, **{k: v for k, v in start.items() if v is not None})
        self.prefix, self._project, self._config_kwargs = prefix, project, {"log_code": False, **kwargs}

    @on_main_process
    def start(self) -> None:
        os.environ.setdefault("COMET_DISABLE_AUTO_LOGGING", "1")
        os.environ.setdefault("COMET_ERROR_TRACKING_ENABLE", "false")
        comet_ml = require_package("comet_ml", "comet_ml", self.name)
        config = comet_ml.ExperimentConfig(**self._config_kwargs)
        self._run = comet_ml.start(project=self._project, experiment_config=config, **self.init_kwargs)

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        values = dict(values)
        epoch = values.pop("epoch", None)
        super().log(values, step=step, epoch=epoch, prefix=self.prefix, **kwargs)

    @property
    def experiment(self) -> Any:
        """Lightning's ``logger.experiment``: the Comet experiment."""
        return self.tracker

    @property
    def version(self) -> str | None:
        """The experiment key, once the experiment started."""
        return None if self.tracker is None else str(self.tracker.get_key())

    @property
    def save_dir(self) -> str | None:
        """Where an offline experiment's archive goes (``offline_directory``)."""
        directory = self._config_kwargs.get("offline_directory")
        return None if directory is None else os.fspath(directory)
