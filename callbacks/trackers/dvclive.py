"""DVCLive tracker."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from callbacks.trackers.base import GeneralTracker, on_main_process, require_package, sanitize_config, split_text


class DVCLiveTracker(GeneralTracker):
    """Log with ``dvclive.Live`` into ``<logging_dir>/dvclive`` (``params.yaml``, ``plots/metrics``).

    ``init_kwargs`` go to ``dvclive.Live`` (``dir``, ``save_dvc_exp``, ``dvcyaml``, ``report``, ...).
    Unlike a bare ``Live()``, this tracker never runs ``dvc init``: in a Git repository that has no
    DVC project it only writes its files. Where DVC is set up, DVCLive's usual experiment handling
    applies. Strings cannot be DVCLive metrics and are skipped with a warning.
    Needs ``pip install dvclive``.
    """

    name = "dvclive"
    requires_logging_directory = True
    package = "dvclive"
    pip_name = "dvclive"

    @on_main_process
    def start(self) -> None:
        os.environ.setdefault("DVC_NO_ANALYTICS", "1")
        dvclive = require_package("dvclive", "dvclive", self.name)
        kwargs = {"dir": os.path.join(self.resolved_logging_dir(), "dvclive"), **self.init_kwargs}
        with _no_dvc_init():
            self._run = dvclive.Live(**kwargs)

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self._run.log_params(sanitize_config(values))

    @on_main_process
    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        numbers, texts = split_text(self.prepare_values(values))
        for key in texts:
            self.warn_once(f"text:{key}", f"DVCLive metrics are numbers only; the string value of {key!r} is skipped")
        if not numbers:
            return
        if step is not None:
            self._run.step = step
        for key, value in numbers.items():
            self._run.log_metric(key, value, **kwargs)
        self._run.next_step()

    @on_main_process
    def finish(self) -> None:
        if self._run is not None:
            self._run.end()


@contextlib.contextmanager
def _no_dvc_init() -> Iterator[None]:
    """While ``Live`` is built, find an existing DVC repository but never create one."""
    import dvclive.live

    def existing_dvc_repo() -> Any:
        from dvc.exceptions import NotDvcRepoError
        from dvc.repo import Repo
        from dvc.scm import SCMError

        try:
            return Repo()
        except (NotDvcRepoError, SCMError):
            return None

    original = dvclive.live.get_dvc_repo
    dvclive.live.get_dvc_repo = existing_dvc_repo
    try:
        yield
    finally:
        dvclive.live.get_dvc_repo = original
