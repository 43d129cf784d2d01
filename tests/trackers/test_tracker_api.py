"""The tracker API: log_with resolution and errors, custom trackers, non-main ranks, value conversion."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from callbacks.trackers import (
    CSVTracker,
    GeneralTracker,
    LoggerType,
    NoOpTracker,
    TensorBoardTracker,
    TrackerHub,
    available_trackers,
    on_main_process,
    register_tracker_class,
    registry,
    resolve_trackers,
)
from callbacks.trackers.base import prepare_values

REPO = Path(__file__).resolve().parents[2]
TRACKER_PACKAGES = ("tensorboard", "wandb", "comet_ml", "aim", "mlflow", "clearml", "dvclive", "trackio", "swanlab")


class RecordingTracker(GeneralTracker):
    """A user tracker that records what it receives."""

    name = "recording"
    requires_logging_directory = False

    def __init__(self, *, main_process_only: bool = True) -> None:
        super().__init__(main_process_only=main_process_only)
        self.calls: list[tuple[str, Any]] = []

    @on_main_process
    def start(self) -> None:
        self.calls.append(("start", self.run_name))

    @on_main_process
    def store_init_configuration(self, values: dict[str, Any]) -> None:
        self.calls.append(("config", values))

    @on_main_process
    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        self.calls.append(("log", self.prepare_values(values), step, kwargs))

    @on_main_process
    def finish(self) -> None:
        self.calls.append(("finish", None))


@pytest.fixture
def private_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_TRACKERS", dict(registry._TRACKERS))


# ------------------------------------------------------------------------------------------- resolution
def test_unknown_name_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="'tensorbored' is not a known tracker") as error:
        resolve_trackers(["csv", "tensorbored"])
    for name in ("all", "csv", "tensorboard", "wandb", "comet_ml", "mlflow", "swanlab"):
        assert repr(name) in str(error.value)


def test_missing_package_names_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # Python's own way to make a package unimportable
    with pytest.raises(ModuleNotFoundError, match=r"pip install wandb"):
        TrackerHub(["csv", "wandb"])
    assert "wandb" not in available_trackers()


def test_entries_of_the_wrong_type_are_rejected() -> None:
    with pytest.raises(TypeError, match="pass an instance"):
        resolve_trackers(CSVTracker)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="names or GeneralTracker instances"):
        resolve_trackers(["csv", 3])  # type: ignore[list-item]


def test_names_enums_instances_and_all_mix(tmp_path: Path) -> None:
    mine = RecordingTracker()
    trackers = resolve_trackers([LoggerType.CSV, "TensorBoard", mine, "csv"], project_dir=tmp_path)
    assert [type(t) for t in trackers] == [CSVTracker, TensorBoardTracker, RecordingTracker]
    assert trackers[0].logging_dir == str(tmp_path) and trackers[2] is mine
    assert str(LoggerType.COMETML) == "comet_ml" and resolve_trackers("comet")[0].name == "comet_ml"
    everything = resolve_trackers("all")
    assert [t.name for t in everything] == available_trackers()
    assert "csv" in available_trackers() and not any(t.started for t in everything)
    assert resolve_trackers(None) == []


def test_resolving_imports_no_tracker_package() -> None:
    code = textwrap.dedent(
        f"""
        import sys
        import callbacks, callbacks.trackers, trainer
        from callbacks.trackers import TrackerHub
        TrackerHub("all")
        loaded = [name for name in {TRACKER_PACKAGES!r} if name in sys.modules]
        assert not loaded, loaded
        """
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


# ------------------------------------------------------------------------------------- custom trackers
def test_registered_tracker_is_usable_by_name(private_registry: None) -> None:
    register_tracker_class(RecordingTracker)
    hub = TrackerHub(["recording"], project_dir=None)
    hub.init("proj", config={"lr": 0.1}, init_kwargs={"recording": {"color": "red"}})
    hub.log({"loss": torch.tensor(0.5)}, step=3, log_kwargs={"recording": {"commit": False}})
    tracker = hub.get("recording")
    hub.finish()
    hub.finish()  # a second end_training is harmless
    assert tracker.init_kwargs == {"color": "red"}
    assert tracker.calls == [
        ("start", "proj"),
        ("config", {"lr": 0.1}),
        ("log", {"loss": 0.5}, 3, {"commit": False}),
        ("finish", None),
    ]


def test_register_rejects_bad_classes(private_registry: None) -> None:
    class Nameless(GeneralTracker):
        pass

    with pytest.raises(ValueError, match="name must be a non-empty string"):
        register_tracker_class(Nameless)
    with pytest.raises(TypeError, match="subclass of GeneralTracker"):
        register_tracker_class(dict)  # type: ignore[arg-type]


def test_accelerate_style_tracker_without_super_init() -> None:
    class Legacy(GeneralTracker):
        name = "legacy"
        requires_logging_directory = False

        @on_main_process
        def __init__(self, run_name: str) -> None:
            self.run_name = run_name
            self.rows: list[Any] = []

        @property
        def tracker(self) -> list[Any]:
            return self.rows

        @on_main_process
        def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
            self.rows.append((values, step))

    hub = TrackerHub(Legacy("mine"))
    hub.init("proj", config={"a": 1})
    hub.log({"x": 1}, step=0)
    hub.finish()
    assert hub.get("legacy", unwrap=True) == [({"x": 1}, 0)] and hub.trackers[0].run_name == "mine"


# ------------------------------------------------------------------------------------- non-main ranks
def test_non_main_process_logs_nothing_and_gets_a_no_op(tmp_path: Path) -> None:
    hub = TrackerHub(["csv"], project_dir=tmp_path, is_main_process=False)
    hub.init("proj", config={"lr": 0.1})
    hub.log({"loss": 1.0}, step=0)
    for tracker in (hub.get("csv"), hub.get("csv", unwrap=True), hub.get("wandb", unwrap=True)):
        assert isinstance(tracker, NoOpTracker)
        assert tracker.log_artifact("x", name="y").anything["key"] is tracker
        tracker.config["lr"] = 1
        with tracker as inner:
            assert inner is tracker
    hub.finish()
    assert not (tmp_path / "logs").exists()


def test_all_process_tracker_runs_on_every_rank() -> None:
    mine = RecordingTracker(main_process_only=False)
    hub = TrackerHub([mine], is_main_process=False)
    hub.init("proj")
    hub.log({"loss": 1.0}, step=2)
    assert hub.get("recording") is mine
    assert [call[0] for call in mine.calls] == ["start", "log"]


def test_get_unknown_tracker_on_main_raises(tmp_path: Path) -> None:
    hub = TrackerHub("csv", project_dir=tmp_path)
    with pytest.raises(ValueError, match=r"No tracker named 'wandb'.*\['csv'\]"):
        hub.get("wandb")
    assert isinstance(TrackerHub(None).get("wandb", unwrap=True), NoOpTracker)  # no log_with at all
    with pytest.raises(TypeError, match="dict of name -> value"):
        hub.log([("loss", 1.0)])  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------- hub arguments
def test_hub_argument_errors(tmp_path: Path) -> None:
    hub = TrackerHub("csv", project_dir=tmp_path)
    with pytest.raises(ValueError, match="project_name"):
        hub.init("")
    with pytest.raises(TypeError, match="init_kwargs must be a dict keyed by tracker name"):
        hub.init("proj", init_kwargs=["wandb"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"init_kwargs\['csv'\] must be a dict"):
        hub.init("proj", init_kwargs={"csv": 1})  # type: ignore[dict-item]
    hub.init("proj")
    with pytest.raises(TypeError, match="step must be an int"):
        hub.log({"loss": 1.0}, step="3")  # type: ignore[arg-type]
    hub.log({"loss": 1.0}, step=torch.tensor(4))  # type: ignore[arg-type]
    hub.finish()


def test_log_before_init_warns_once_and_records_nothing(tmp_path: Path) -> None:
    hub = TrackerHub("csv", project_dir=tmp_path)
    with pytest.warns(UserWarning, match="before init_trackers"):
        hub.log({"loss": 1.0}, step=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hub.log({"loss": 1.0}, step=1)
    assert not (tmp_path / "logs").exists()


# ------------------------------------------------------------------------------------- values
def test_values_are_flattened_and_converted() -> None:
    warned: list[str] = []
    values = {
        "loss": torch.tensor(0.25),
        "count": torch.tensor(7),
        "flag": True,
        "np": np.float32(1.5),
        "lr": 1e-3,
        "name": "adamw",
        "val": {"acc": torch.tensor([0.5]), "deep": {"f1": 0.75}},
    }
    result = prepare_values(values, lambda key, message: warned.append(key))
    assert result == {
        "loss": 0.25,
        "count": 7,
        "flag": True,
        "np": 1.5,
        "lr": 1e-3,
        "name": "adamw",
        "val/acc": 0.5,
        "val/deep/f1": 0.75,
    }
    assert type(result["count"]) is int and type(result["np"]) is float and list(result) == list(result)
    assert warned == []


def test_tensors_are_converted_with_one_transfer_per_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = {"tolist": 0}
    original = torch.Tensor.tolist

    def counting_tolist(self: torch.Tensor) -> Any:
        calls["tolist"] += 1
        return original(self)

    def no_item(self: torch.Tensor) -> Any:
        raise AssertionError(".item() per value is one device sync per value")

    monkeypatch.setattr(torch.Tensor, "tolist", counting_tolist)
    monkeypatch.setattr(torch.Tensor, "item", no_item)
    values = {f"m{i}": torch.tensor(float(i)) for i in range(6)} | {"steps": torch.tensor(3)}
    result = prepare_values(values, lambda key, message: None)
    assert result == {**{f"m{i}": float(i) for i in range(6)}, "steps": 3}
    assert calls["tolist"] == 2  # one per (device, dtype) group: float32 and int64


def test_unloggable_values_are_skipped_with_one_warning(tmp_path: Path) -> None:
    import csv

    hub = TrackerHub("csv", project_dir=tmp_path)
    hub.init("proj")
    bad = {"loss": 1.0, "none": None, "vector": torch.ones(3), "items": [1, 2]}
    with pytest.warns(UserWarning) as record:
        hub.log(bad, step=0)
    assert sorted(str(w.message).split("'")[1] for w in record) == ["items", "none", "vector"]
    assert "tensor of shape (3,)" in " ".join(str(w.message) for w in record)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        hub.log(bad, step=1)
    hub.finish()
    with open(hub.get("csv").metrics_file, newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert rows == [{"step": "0", "loss": "1.0"}, {"step": "1", "loss": "1.0"}]
    with pytest.raises(TypeError, match="dict of name -> value"):
        prepare_values([("loss", 1.0)], lambda key, message: None)  # type: ignore[arg-type]


def test_the_custom_tracker_example_in_the_docs_runs(private_registry: None, tmp_path: Path) -> None:
    import json
    import re

    text = (REPO / "docs" / "trackers.md").read_text()
    section = text[text.index("## Writing your own tracker") :]
    example = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    exec(compile(example, "docs/trackers.md", "exec"), {})
    hub = TrackerHub("jsonl", project_dir=tmp_path)
    hub.init("proj", config={"lr": 0.1})
    hub.log({"loss": torch.tensor(0.5), "val": {"acc": 1.0}}, step=2)
    hub.finish()
    lines = [json.loads(line) for line in (tmp_path / "proj.jsonl").read_text().splitlines()]
    assert lines == [{"config": {"lr": 0.1}}, {"step": 2, "loss": 0.5, "val/acc": 1.0}]


class Media:
    """Stands for a backend's own media type (``wandb.Image``, ``aim.Image``, ...)."""


def test_objects_of_the_trackers_own_package_pass_through() -> None:
    image = Media()
    warned: list[str] = []
    result = prepare_values({"img": image, "other": object()}, lambda key, message: warned.append(key), __name__)
    assert result == {"img": image} and warned == ["other"]


def test_init_twice_and_unused_init_kwargs(tmp_path: Path) -> None:
    hub = TrackerHub("csv", project_dir=tmp_path)
    with pytest.warns(UserWarning, match=r"init_kwargs for \['wandb'\] are not used"):
        hub.init("proj", init_kwargs={"wandb": {"entity": "me"}})
    with pytest.raises(RuntimeError, match="end_training"):
        hub.init("proj")
    hub.finish()
    hub.init("proj")  # a new run after end_training
    hub.finish()
    hub.init("other")
    hub.finish()
    assert sorted(p.name for p in (tmp_path / "logs" / "proj").iterdir()) == ["version_0", "version_1"]
    assert [p.name for p in (tmp_path / "logs" / "other").iterdir()] == ["version_0"]
    named = TrackerHub(CSVTracker(run_name="fixed", logging_dir=tmp_path))
    named.init("proj")
    named.finish()
    assert (tmp_path / "logs" / "fixed" / "version_0").is_dir()
