"""Tracker names, ``log_with`` resolution and the `TrackerHub` both faces delegate to."""

from __future__ import annotations

import enum
import importlib.util
import inspect
import os
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

from callbacks.trackers.base import GeneralTracker, NoOpTracker


class LoggerType(str, enum.Enum):
    """The built-in trackers, usable wherever ``log_with`` takes a name."""

    ALL = "all"
    CSV = "csv"
    TENSORBOARD = "tensorboard"
    WANDB = "wandb"
    COMETML = "comet_ml"
    AIM = "aim"
    MLFLOW = "mlflow"
    CLEARML = "clearml"
    DVCLIVE = "dvclive"
    TRACKIO = "trackio"
    SWANLAB = "swanlab"

    def __str__(self) -> str:
        return self.value


LogWith = str | LoggerType | GeneralTracker | Iterable[str | LoggerType | GeneralTracker] | None

_TRACKERS: dict[str, type[GeneralTracker]] = {}
_BUILT_IN: list[type[GeneralTracker]] = []  # register_built_in's: constructors taking (run_name, logging_dir) by keyword
_ALIASES = {"comet": "comet_ml", "comet-ml": "comet_ml", "tb": "tensorboard", "mlflow-skinny": "mlflow"}


def register_tracker_class(cls: type[GeneralTracker]) -> type[GeneralTracker]:
    """Make a `GeneralTracker` subclass usable by its ``name`` in ``log_with``. Usable as a decorator.

    The class is built as ``cls(logging_dir=project_dir)`` when ``requires_logging_directory`` is
    true or its constructor takes ``logging_dir``, else ``cls()``; ``init_trackers`` then fills ``run_name`` and calls ``start()``.
    A registered name replaces a built-in of the same name.

    Raises:
        TypeError: ``cls`` is not a `GeneralTracker` subclass.
        ValueError: ``cls.name`` is empty, not a string, or ``"all"``.
    """
    if not (isinstance(cls, type) and issubclass(cls, GeneralTracker)):
        raise TypeError(f"register_tracker_class expects a subclass of GeneralTracker, got {cls!r}")
    name = getattr(cls, "name", "")
    if not isinstance(name, str) or not name or name.lower() == "all":
        raise ValueError(
            f"{cls.__name__}.name must be a non-empty string other than 'all', got {name!r}; "
            "set a class attribute such as name = 'my_tracker'"
        )
    _TRACKERS[name.lower()] = cls
    return cls


def register_built_in(*classes: type[GeneralTracker]) -> None:
    """Register the trackers of this package (`callbacks.trackers` does, as it is imported): unlike Accelerate's
    user trackers, their constructors take ``run_name`` and ``logging_dir`` by keyword."""
    for cls in classes:
        register_tracker_class(cls)
    _BUILT_IN.extend(classes)


def available_trackers() -> list[str]:
    """Names of registered trackers whose package is installed (what ``log_with="all"`` uses)."""
    return [name for name, cls in _TRACKERS.items() if _is_installed(cls)]


def tracker_names() -> list[str]:
    """Every name ``log_with`` accepts, installed or not."""
    return ["all", *_TRACKERS]


def _is_installed(cls: type[GeneralTracker]) -> bool:
    package = getattr(cls, "package", None)
    return package is None or importlib.util.find_spec(package) is not None


def _build(name: str, project_dir: str | None) -> GeneralTracker:
    cls = _TRACKERS[name]
    if not _is_installed(cls):
        raise ModuleNotFoundError(
            f"log_with asks for the {name!r} tracker, but its package {cls.package!r} is not installed. "
            f"Install it with: pip install {cls.pip_name or cls.package}",
            name=cls.package,
        )
    if _takes_positional(cls) and not issubclass(cls, tuple(_BUILT_IN)):  # Accelerate's contract, run name filled at start
        return cls(None, project_dir) if cls.requires_logging_directory else cls(None)
    if cls.requires_logging_directory or _accepts_logging_dir(cls):
        return cls(logging_dir=project_dir)
    return cls()


def _accepts_logging_dir(cls: type[GeneralTracker]) -> bool:
    try:
        parameters = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return False
    return "logging_dir" in parameters


def _lookup(entry: str | LoggerType) -> list[str]:
    name = str(entry).strip().lower()
    name = _ALIASES.get(name, name)
    if name == "all":
        return available_trackers()
    if name not in _TRACKERS:
        raise ValueError(
            f"log_with={str(entry)!r} is not a known tracker; choose from {tracker_names()}, pass a "
            "GeneralTracker instance, or register your class with register_tracker_class"
        )
    return [name]


def _entries(log_with: LogWith) -> list[GeneralTracker | str]:
    """``log_with`` as an ordered list of the tracker instances given and the (validated, installed) names of the others."""
    if log_with is None:
        return []
    entries = [log_with] if isinstance(log_with, (str, GeneralTracker, type)) else log_with
    if not isinstance(entries, Iterable):
        raise TypeError(
            f"log_with must be a tracker name, a LoggerType, a GeneralTracker or a list of them, got {log_with!r}"
        )
    found: list[GeneralTracker | str] = []
    for entry in entries:
        if isinstance(entry, GeneralTracker):
            found.append(entry)
            continue
        if isinstance(entry, type) and issubclass(entry, GeneralTracker):
            raise TypeError(f"log_with got the class {entry.__name__}; pass an instance: {entry.__name__}(...)")
        if not isinstance(entry, str):
            raise TypeError(f"log_with entries must be names or GeneralTracker instances, got {entry!r}")
        for name in _lookup(entry):
            cls = _TRACKERS[name]
            if not _is_installed(cls):
                raise ModuleNotFoundError(
                    f"log_with asks for the {name!r} tracker, but its package {cls.package!r} is not installed. "
                    f"Install it with: pip install {cls.pip_name or cls.package}",
                    name=cls.package,
                )
            if name not in found:
                found.append(name)
    return found


def build_named_tracker(name: str, project_name: str, logging_dir: str | None, init_kwargs: Mapping[str, Any] | None) -> GeneralTracker:
    """Construct a registered tracker as Accelerate documents it: ``cls(project_name, logging_dir, **init_kwargs)``
    when ``requires_logging_directory`` is true, else ``cls(project_name, **init_kwargs)`` (built-ins that write
    files also get ``logging_dir=``)."""
    cls = _TRACKERS[name]
    kwargs = dict(init_kwargs or {})
    if not _takes_positional(cls):  # a keyword-only constructor: built bare, the run name and kwargs configured after
        tracker = _build(name, logging_dir)
        tracker.configure(run_name=project_name, init_kwargs=kwargs)
        return tracker
    if cls.requires_logging_directory:
        return cls(project_name, logging_dir, **kwargs)
    if _accepts_logging_dir(cls) and "logging_dir" not in kwargs:
        kwargs["logging_dir"] = logging_dir
    return cls(project_name, **kwargs)


def _takes_positional(cls: type[GeneralTracker]) -> bool:
    """Whether the constructor takes a positional argument (the run name, as Accelerate's trackers do)."""
    try:
        parameters = inspect.signature(cls).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in parameters)


def resolve_trackers(log_with: LogWith, *, project_dir: str | os.PathLike[str] | None = None) -> list[GeneralTracker]:
    """Turn a ``log_with`` value into tracker objects, validating every entry now.

    Args:
        log_with: ``None``, a name, a `LoggerType`, a `GeneralTracker` instance, ``"all"`` (every
            tracker whose package is installed), or a list mixing them.
        project_dir: logging directory for trackers that write files (default: the current directory
            at start time).

    Returns:
        The trackers, not started: nothing heavy is imported or created yet.

    Raises:
        ValueError: an unknown name.
        ModuleNotFoundError: a tracker asked for by name whose package is missing.
        TypeError: an entry that is neither a name nor a `GeneralTracker`.
    """
    directory = os.fspath(project_dir) if project_dir is not None else None
    return [entry if isinstance(entry, GeneralTracker) else _build(entry, directory) for entry in _entries(log_with)]


class TrackerHub:
    """The trackers of one ``Accelerator``: ``init_trackers``, ``log``, ``get_tracker``, ``end_training``.

    Args:
        log_with: see `resolve_trackers`; validated here, at construction.
        project_dir: logging directory for file-based trackers.
        is_main_process: whether this process is the global main one; trackers with
            ``main_process_only`` do nothing elsewhere and `get` returns a `NoOpTracker` there.
    """

    def __init__(
        self, log_with: LogWith, *, project_dir: str | os.PathLike[str] | None = None, is_main_process: bool = True
    ) -> None:
        # Names are checked now (a typo fails before training) but built in `init`, with the project name.
        self._entries = _entries(log_with)
        self._given = [e for e in self._entries if isinstance(e, GeneralTracker)]
        self._names = [e for e in self._entries if isinstance(e, str)]
        self.trackers: list[GeneralTracker] = list(self._given)
        self.project_dir = os.fspath(project_dir) if project_dir is not None else None
        self.is_main_process = bool(is_main_process)
        self.initialized = False
        self._warned_uninitialized = False
        for tracker in self.trackers:
            tracker.set_main_process(self.is_main_process)

    def _active(self) -> list[GeneralTracker]:
        return [t for t in self.trackers if self.is_main_process or not t.main_process_only]

    def init(
        self,
        project_name: str,
        config: Mapping[str, Any] | None = None,
        init_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        """Start every tracker under ``project_name`` and store ``config``.

        Args:
            project_name: run/project name given to each backend.
            config: hyperparameters to record (nested dicts allowed).
            init_kwargs: per-tracker keyword arguments for the backend's run constructor, keyed by
                tracker name, e.g. ``{"wandb": {"entity": "me"}}``.
        """
        if not isinstance(project_name, str) or not project_name:
            raise ValueError(f"init_trackers needs a non-empty project_name string, got {project_name!r}")
        if config is not None and not isinstance(config, Mapping):
            raise TypeError(f"init_trackers(config=...) must be a dict, got {type(config).__name__}")
        if self.initialized:
            raise RuntimeError("init_trackers() was already called; call end_training() before starting new runs")
        per_tracker = self._split_kwargs(init_kwargs, "init_kwargs")
        unused = set(per_tracker) - {tracker.name.lower() for tracker in self._given} - set(self._names)
        if unused:
            warnings.warn(
                f"init_kwargs for {sorted(unused)} are not used: log_with has {[t.name for t in self._given] + self._names}",
                UserWarning,
                stacklevel=3,
            )
        trackers = []
        for entry in self._entries:
            if isinstance(entry, GeneralTracker):
                entry.configure(run_name=project_name, init_kwargs=per_tracker.get(entry.name.lower()))
                trackers.append(entry)
            elif self.is_main_process or not _TRACKERS[entry].main_process_only:  # as Accelerate: not built where it would not log
                tracker = build_named_tracker(entry, project_name, self.project_dir, per_tracker.get(entry))
                tracker.set_main_process(self.is_main_process)
                tracker.configure(run_name=project_name)
                trackers.append(tracker)
        self.trackers = trackers
        for tracker in self._active():
            tracker.begin()
            if config is not None:
                tracker.store_init_configuration(dict(config))
        self.initialized = True

    def log(
        self,
        values: Mapping[str, Any],
        step: int | None = None,
        log_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        """Send ``values`` at ``step`` to every tracker; ``log_kwargs`` are per-tracker extras."""
        if not isinstance(values, Mapping):
            raise TypeError(f"log() takes a dict of name -> value, got {type(values).__name__}: {values!r}")
        if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
            if hasattr(step, "item") and getattr(step, "numel", lambda: 1)() == 1:
                step = int(step.item())
            else:
                raise TypeError(f"step must be an int or None, got {step!r}")
        if not self.initialized:
            if self._entries and not self._warned_uninitialized:
                self._warned_uninitialized = True
                warnings.warn(
                    "log() was called before init_trackers(project_name); nothing is recorded until then",
                    UserWarning,
                    stacklevel=3,
                )
            return
        per_tracker = self._split_kwargs(log_kwargs, "log_kwargs")
        for tracker in self._active():
            tracker.log(dict(values), step=step, **per_tracker.get(tracker.name.lower(), {}))

    def get(self, name: str, unwrap: bool = False) -> Any:
        """The tracker called ``name`` (its raw run object with ``unwrap=True``).

        On a process that does not log, or when ``log_with`` named no tracker at all, a `NoOpTracker`
        that accepts any attribute and call.

        Raises:
            ValueError: no tracker of that name was set up with ``log_with``.
        """
        key = _ALIASES.get(str(name).lower(), str(name).lower())
        for tracker in self.trackers:
            if tracker.name.lower() == key:
                if tracker.main_process_only and not self.is_main_process:
                    return NoOpTracker()
                return tracker.tracker if unwrap else tracker
        if not self.is_main_process or not self._entries:  # Accelerate returns a blank tracker without log_with
            return NoOpTracker()
        if key in self._names:
            raise RuntimeError(f"the {name!r} tracker is built by init_trackers(project_name); call it before get_tracker")
        raise ValueError(
            f"No tracker named {name!r}; this run logs with {[t.name for t in self._given] + self._names}. "
            "Add it to log_with to use it."
        )

    def finish(self) -> None:
        """Finish every started tracker (``end_training``); safe to call twice."""
        errors: list[BaseException] = []
        for tracker in self.trackers:
            try:
                tracker.end()
            except Exception as error:  # finish the others before reporting
                errors.append(error)
        self.initialized = False
        if errors:
            raise errors[0]

    @staticmethod
    def _split_kwargs(kwargs: Mapping[str, Any] | None, what: str) -> dict[str, dict[str, Any]]:
        if kwargs is None:
            return {}
        if not isinstance(kwargs, Mapping):
            raise TypeError(f"{what} must be a dict keyed by tracker name, e.g. {{'wandb': {{...}}}}, got {kwargs!r}")
        result: dict[str, dict[str, Any]] = {}
        for name, value in kwargs.items():
            if not isinstance(value, Mapping):
                raise TypeError(f"{what}[{name!r}] must be a dict of keyword arguments, got {value!r}")
            key = str(name).lower()
            result[_ALIASES.get(key, key)] = dict(value)
        return result
