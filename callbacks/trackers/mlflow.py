"""MLflow tracker."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from callbacks.trackers.base import GeneralTracker, flat_config, on_main_process, require_package, split_text


class MLflowTracker(GeneralTracker):
    """Log to an MLflow run in the experiment named after the run name.

    The tracking URI is, in order: ``init_kwargs["tracking_uri"]``, ``MLFLOW_TRACKING_URI``, else a
    local file store at ``<logging_dir>/mlruns`` (this sets ``MLFLOW_ALLOW_FILE_STORE=true``).
    Other ``init_kwargs`` (``run_name``, ``run_id``, ``tags``, ``nested``, ``description``) go to
    ``mlflow.start_run``. Config values become params (strings, truncated to MLflow's limit); strings
    logged as values become run tags, since MLflow metrics are numbers only. Unless set,
    ``MLFLOW_DISABLE_TELEMETRY=true``. Needs ``pip install mlflow-skinny`` (or ``mlflow``).
    """

    name = "mlflow"
    requires_logging_directory = True
    package = "mlflow"
    pip_name = "mlflow-skinny"

    def __init__(
        self,
        experiment_name: str | None = None,
        logging_dir: str | os.PathLike[str] | None = None,
        run_id: str | None = None,
        tags: dict[str, Any] | str | None = None,
        nested_run: bool | None = False,
        run_name: str | None = None,
        description: str | None = None,
        **init_kwargs: Any,
    ) -> None:
        """Accelerate's signature; its environment variables win, as in Accelerate (``MLFLOW_EXPERIMENT_NAME``,
        ``MLFLOW_RUN_ID``, ``MLFLOW_TAGS`` as JSON, ``MLFLOW_NESTED_RUN``, ``MLFLOW_RUN_NAME``)."""
        import json

        experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME", experiment_name)
        run_id = os.environ.get("MLFLOW_RUN_ID", run_id)
        raw_tags: Any = os.environ.get("MLFLOW_TAGS", tags)
        tags = json.loads(raw_tags) if isinstance(raw_tags, str) else raw_tags
        nested = os.environ.get("MLFLOW_NESTED_RUN", str(nested_run)).lower() in ("1", "true")
        run_name = os.environ.get("MLFLOW_RUN_NAME", run_name)
        extra: dict[str, Any] = {"run_id": run_id, "tags": tags, "nested": nested or None, "run_name": run_name, "description": description}
        main_process_only = init_kwargs.pop("main_process_only", True)
        super().__init__(experiment_name, logging_dir, main_process_only=main_process_only)
        self.init_kwargs.update({**{k: v for k, v in extra.items() if v is not None}, **init_kwargs})  # start_run's

    @on_main_process
    def start(self) -> None:
        os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
        kwargs = dict(self.init_kwargs)
        uri = kwargs.pop("tracking_uri", None) or os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            uri = (Path(self.resolved_logging_dir()) / "mlruns").absolute().as_uri()
        mlflow = require_package("mlflow", "mlflow-skinny", self.name)
        mlflow.set_tracking_uri(uri)
        experiment = mlflow.set_experiment(kwargs.pop("experiment_name", self.run_name or "Default"))
        self._run = mlflow.start_run(experiment_id=experiment.experiment_id, **kwargs)

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        import mlflow
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH

        params = {key: str(value)[:MAX_PARAM_VAL_LENGTH] for key, value in flat_config(values).items()}
        items = list(params.items())
        for begin in range(0, len(items), MAX_PARAMS_TAGS_PER_BATCH):
            mlflow.log_params(dict(items[begin : begin + MAX_PARAMS_TAGS_PER_BATCH]), run_id=self._run_id)

    @on_main_process
    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        import mlflow

        numbers, texts = split_text(self.prepare_values(values))
        if numbers:
            metrics = {key: float(value) for key, value in numbers.items()}
            mlflow.log_metrics(metrics, step=step, run_id=self._run_id, **kwargs)
        if texts:
            mlflow.set_tags(texts)

    @on_main_process
    def finish(self) -> None:
        import mlflow

        if self._run is not None:
            mlflow.end_run()

    @property
    def _run_id(self) -> str:
        return str(self._run.info.run_id)
