"""The tracker API exactly as Accelerate's guide writes it, with only the import renamed."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from trainer import Accelerator
from trainer.tracking import GeneralTracker, TensorBoardTracker, on_main_process, register_tracker_class
from trainer.utils import LoggerType


class MyCustomTracker(GeneralTracker):
    """The guide's custom tracker: a positional run name, no super().__init__(), decorated methods."""

    name = "my_tracker"
    requires_logging_directory = True
    built: ClassVar[list[tuple[Any, ...]]] = []

    @on_main_process
    def __init__(self, run_name: str, logging_dir: str, **kwargs: Any) -> None:
        self.run_name, self.dir, self.kwargs = run_name, logging_dir, kwargs
        self.rows: list[tuple[dict[str, Any], int | None]] = []
        MyCustomTracker.built.append((run_name, logging_dir, kwargs))

    @property
    def tracker(self) -> Any:
        return self.rows

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        self.config = values

    @on_main_process
    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        self.rows.append((values, step))


def test_registered_class_is_built_by_init_trackers_with_the_documented_arguments(tmp_path: Path, monkeypatch) -> None:
    from callbacks.trackers import registry

    monkeypatch.setattr(registry, "_TRACKERS", dict(registry._TRACKERS))  # keep the registration to this test
    register_tracker_class(MyCustomTracker)
    acc = Accelerator(cpu=True, log_with=["my_tracker", LoggerType.TENSORBOARD], project_dir=tmp_path)
    assert MyCustomTracker.built == []  # names are checked now, built later
    acc.init_trackers("proj", config={"lr": 0.1}, init_kwargs={"my_tracker": {"team": "x"}})
    assert MyCustomTracker.built == [("proj", str(tmp_path), {"team": "x"})]
    acc.log({"loss": 1.5}, step=3)
    mine = acc.get_tracker("my_tracker")
    assert mine.config == {"lr": 0.1} and acc.get_tracker("my_tracker", unwrap=True) == [({"loss": 1.5}, 3)]
    assert isinstance(acc.get_tracker("tensorboard"), TensorBoardTracker)
    acc.end_training()
    assert list(tmp_path.rglob("events.out.tfevents.*"))  # the built-in one really wrote
