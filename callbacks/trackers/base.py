"""`GeneralTracker`: the one tracker interface both faces use.

A tracker is a `Callback`. With the ``Accelerator`` it is driven by ``init_trackers`` (``start`` then
``store_init_configuration``), ``log`` and ``end_training`` (``finish``). With the ``Trainer`` the
same object receives ``on_fit_start`` / ``on_log_metrics`` / ``teardown``.

Values go through :func:`prepare_values` before they reach a backend: nested dicts are flattened to
``"a/b"`` keys, 0-dim tensors become Python numbers with one device transfer per (device, dtype)
group, and anything a backend cannot take is skipped with a one-time warning. A built-in backend whose
Accelerate tracker writes a dict value its own way (TensorBoard's ``add_scalars``, W&B's nesting, Comet's
``log_metrics``) takes the dict values apart with `GeneralTracker.prepare_groups` / `prepare_tree` instead.
"""

from __future__ import annotations

import functools
import importlib
import numbers
import os
import sys
import warnings
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from callbacks.base import Callback
from strategies.base import user_class

if TYPE_CHECKING:
    from callbacks.view import TrainerView
    from trainer.fit.datamodule import DataModule
    from trainer.fit.module import TrainModule

F = TypeVar("F", bound=Callable[..., Any])

_RANK_VARIABLES = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID")


def env_is_main_process() -> bool:
    """Whether the launcher's variables say this is the global rank-0 process (True when unset)."""
    for variable in _RANK_VARIABLES:
        value = os.environ.get(variable)
        if value is not None and value.strip().lstrip("-").isdigit():
            return int(value) == 0
    return True


def on_main_process(function: F) -> F:
    """Run the decorated tracker method only on the main process when ``self.main_process_only``.

    On other processes the call does nothing and returns ``None``. Works on methods of any
    `GeneralTracker`, including subclasses that never call ``super().__init__``.
    """

    @functools.wraps(function)
    def wrapper(self: object, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "main_process_only", True) and not _is_main(self):
            return None
        return function(self, *args, **kwargs)

    return wrapper  # type: ignore[return-value]


def _is_main(tracker: object) -> bool:
    flag = getattr(tracker, "_is_main_process", None)
    return env_is_main_process() if flag is None else bool(flag)


def require_package(module_name: str, pip_name: str, tracker_name: str) -> ModuleType:
    """Import an optional package, or fail with the command that installs it.

    Raises:
        ModuleNotFoundError: the package is not installed; the message gives ``pip install <pip_name>``.
    """
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name is not None and error.name.split(".")[0] != module_name.split(".")[0]:
            raise
        raise ModuleNotFoundError(
            f"The {tracker_name!r} tracker needs the {module_name!r} package, which is not installed. "
            f"Install it with: pip install {pip_name}",
            name=module_name,
        ) from error


class NoOpTracker:
    """Stands in for a tracker on processes that do not log: every attribute, call, item is itself.

    ``accelerator.get_tracker("wandb", unwrap=True).log_artifact(...)`` therefore runs unchanged on
    every rank without an ``if accelerator.is_main_process`` guard.
    """

    def __getattr__(self, name: str) -> NoOpTracker:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> NoOpTracker:
        return self

    def __setattr__(self, name: str, value: Any) -> None:
        pass

    def __getitem__(self, key: Any) -> NoOpTracker:
        return self

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def __enter__(self) -> NoOpTracker:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "NoOpTracker()"


def flatten_dict(values: Mapping[str, Any], prefix: str = "", sep: str = "/") -> dict[str, Any]:
    """Flatten nested mappings: ``{"a": {"b": 1}}`` becomes ``{"a/b": 1}``."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{sep}{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            flat.update(flatten_dict(value, name, sep))
        else:
            flat[name] = value
    return flat


def _tensors_to_python(tensors: dict[str, Any]) -> dict[str, Any]:
    """Turn single-element tensors into Python numbers: one ``.tolist()`` per (device, dtype) group."""
    import torch

    groups: dict[tuple[Any, Any], list[str]] = {}
    for key, tensor in tensors.items():
        groups.setdefault((tensor.device, tensor.dtype), []).append(key)
    converted: dict[str, Any] = {}
    for keys in groups.values():
        stacked = torch.stack([tensors[key].detach().reshape(()) for key in keys])
        converted.update(zip(keys, stacked.tolist()))
    return converted


def prepare_values(
    values: Mapping[str, Any], warn: Callable[[str, str], None], passthrough: str | None = None
) -> dict[str, Any]:
    """Flatten ``values`` and convert them to ``int``/``float``/``bool``/``str``.

    Single-element tensors and numpy scalars become Python numbers. Objects whose type comes from
    the package ``passthrough`` (e.g. a ``wandb.Image`` for the wandb tracker) are kept as they are.
    Anything else (``None``, lists, multi-element tensors, other objects) is left out and reported
    through ``warn(key, message)``.
    """
    if not isinstance(values, Mapping):
        raise TypeError(
            f"Tracker values must be a dict of name -> value, got {type(values).__name__}: {values!r}. "
            "Pass e.g. {'loss': loss} instead."
        )
    if type(values) is dict and all(type(value) in _PLAIN for value in values.values()):  # the Trainer's step values
        return {str(key): value for key, value in values.items()}
    flat = flatten_dict(values)
    tensors: dict[str, Any] = {}
    result: dict[str, Any] = {}
    for key, value in flat.items():
        if type(value) in _PLAIN or isinstance(value, str) or (isinstance(value, numbers.Real) and not hasattr(value, "shape")):
            result[key] = value
        elif _is_tensor(value) and value.numel() == 1 and not value.is_complex():
            tensors[key] = value
            result[key] = None  # keeps the key order
        elif hasattr(value, "item") and getattr(value, "size", None) == 1 and not _is_tensor(value):
            result[key] = value.item()  # numpy scalar / 1-element array
        elif passthrough and type(value).__module__.split(".")[0] == passthrough:
            result[key] = value
        else:
            warn(key, f"the value for {key!r} ({_describe(value)}) is not a number or a string; it is not logged")
    if tensors:
        result.update(_tensors_to_python(tensors))
    return {key: value for key, value in result.items() if value is not None}


_PLAIN = (float, int, bool, str)  # kept as they are, checked first (the Trainer's step values are all floats); bool has no subclasses


def _is_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")  # a tensor cannot exist before torch is imported
    return torch is not None and isinstance(value, torch.Tensor)


def _describe(value: Any) -> str:
    if _is_tensor(value):
        return f"tensor of shape {tuple(value.shape)}"
    text = repr(value)
    return f"{type(value).__name__} {text[:60] + '...' if len(text) > 60 else text}"


def split_text(values: Mapping[str, Any]) -> tuple[dict[str, float | int | bool], dict[str, str]]:
    """Split prepared values into numbers and strings."""
    numbers_: dict[str, Any] = {}
    texts: dict[str, str] = {}
    for key, value in values.items():
        (texts if isinstance(value, str) else numbers_)[key] = value
    return numbers_, texts


def sanitize_config(values: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a (nested) config whose leaves are ``int``/``float``/``bool``/``str``/``None``/lists.

    Tensors and numpy scalars become numbers; other objects (paths, dtypes, classes) become ``str``.
    """
    return {str(key): _sanitize_leaf(value) for key, value in values.items()}


def _sanitize_leaf(value: Any) -> Any:
    if isinstance(value, Mapping):
        return sanitize_config(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_sanitize_leaf(item) for item in value]
    if (_is_tensor(value) and value.numel() == 1) or (hasattr(value, "item") and getattr(value, "size", None) == 1):
        return value.item()
    return str(value)


def flat_config(values: Mapping[str, Any]) -> dict[str, int | float | bool | str]:
    """Flatten a config to ``"a/b"`` keys with scalar leaves; ``None`` and lists become strings."""
    flat = flatten_dict(sanitize_config(values))
    return {
        key: value if isinstance(value, (bool, int, float, str)) else str(value) for key, value in flat.items()
    }


def logged_hyperparameters(module: TrainModule | None, datamodule: DataModule | None) -> dict[str, Any]:
    """The hyperparameters a run's trackers record (Lightning's rule): the module's and the DataModule's ``hparams``,
    each unless it called ``save_hyperparameters(logger=False)``; a name both hold with different values is an error."""
    parts = [dict(getattr(owner, "hparams", None) or {}) for owner in (module, datamodule)
             if owner is not None and getattr(owner, "hparams_to_trackers", True)]
    if len(parts) == 2:
        clash = sorted(k for k in parts[0].keys() & parts[1].keys() if parts[0][k] != parts[1][k])
        if clash:
            raise RuntimeError(f"the hyperparameters {clash} are in both the module's and the DataModule's hparams, with "
                               "different values: rename one, or save_hyperparameters(logger=False) on one of them")
    return {k: v for part in parts for k, v in part.items()}


class GeneralTracker(Callback):
    """Base class of every tracker: subclass it to plug in your own.

    Subclasses set the class attributes ``name`` (what ``log_with`` accepts) and
    ``requires_logging_directory``, and override `start`, `store_init_configuration`, `log`,
    `finish` and the `tracker` property. Nothing heavy may happen in ``__init__``: trackers are
    built when the ``Accelerator``/``Trainer`` is constructed and started by ``init_trackers`` or at
    the start of ``fit``.

    Args:
        run_name: name of the run/project; ``init_trackers(project_name)`` fills it when unset.
        logging_dir: where file-based backends write; defaults to the project directory.
        main_process_only: log only from the global rank-0 process (default); ``False`` logs everywhere.
        _blank: Accelerate's flag for its placeholder tracker; accepted (and ignored) so subclasses written for it work.
        **init_kwargs: passed to the backend's run constructor (e.g. ``wandb.init``).
    """

    name: ClassVar[str] = ""
    requires_logging_directory: ClassVar[bool] = False
    package: ClassVar[str | None] = None
    """Import name of the package the tracker needs (``None``: none)."""
    pip_name: ClassVar[str | None] = None
    """What to ``pip install`` to get `package`."""
    main_process_only: bool = True
    run_name: str | None = None
    logging_dir: str | None = None
    _is_main_process: bool | None = None
    _run: Any = None
    _started: bool = False
    continue_run: bool = False

    def __init__(
        self,
        run_name: str | None = None,
        logging_dir: str | os.PathLike[str] | None = None,
        *,
        main_process_only: bool = True,
        _blank: bool = False,
        **init_kwargs: Any,
    ) -> None:
        if not isinstance(main_process_only, bool):
            raise TypeError(f"main_process_only must be True or False, got {main_process_only!r}")
        self.run_name = run_name
        self._explicit_run_name = run_name is not None
        self.logging_dir = os.fspath(logging_dir) if logging_dir is not None else None
        self.main_process_only = main_process_only
        self.init_kwargs: dict[str, Any] = dict(init_kwargs)
        self._is_main_process = None
        self._run = None
        self._started = False
        self.continue_run = False
        self._warned: set[str] = set()

    # --- the interface a backend implements -------------------------------------------------------
    @property
    def tracker(self) -> Any:
        """The backend's own run object (``wandb.Run``, ``SummaryWriter``, ...), ``None`` before `start`."""
        return self._run

    def start(self) -> None:
        """Create the backend run. Called once, by ``init_trackers`` or at the start of ``fit``."""

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Record the run's configuration (hyperparameters)."""

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Record ``values`` (numbers, 0-dim tensors, strings, nested dicts) at ``step``."""

    def finish(self) -> None:
        """Flush and close the run; no background process or thread may outlive it."""

    # --- shared machinery ---------------------------------------------------------------------------
    @property
    def is_main_process(self) -> bool:
        """Whether this process logs as the main one (set by the hub/trainer, else read from the env)."""
        return _is_main(self)

    @property
    def started(self) -> bool:
        """Whether `start` ran and `finish` has not."""
        return bool(getattr(self, "_started", False))

    def begin(self, *, continue_run: bool = False) -> None:
        """`start` the tracker and mark it started (what the hub and the Trainer call).

        ``continue_run`` asks a tracker that can (the CSV one) to keep writing the run it wrote before
        (``fit`` then ``test`` with one Trainer); otherwise a start after `finish` is a new run.
        """
        self.continue_run = continue_run
        self.start()
        self._started = True

    def end(self) -> None:
        """`finish` the tracker if it was started."""
        if self.started:
            self._started = False
            self.finish()

    def set_main_process(self, is_main_process: bool) -> None:
        """Tell the tracker whether it runs on the global main process."""
        self._is_main_process = bool(is_main_process)

    def configure(self, run_name: str | None = None, init_kwargs: Mapping[str, Any] | None = None) -> None:
        """Fill the run name (a name given to the constructor wins) and add backend init kwargs."""
        explicit = self.__dict__.get("_explicit_run_name")
        if explicit is None:  # a subclass that skipped GeneralTracker.__init__
            explicit = self._explicit_run_name = getattr(self, "run_name", None) is not None
        if not explicit and run_name is not None:
            self.run_name = run_name
        if init_kwargs:
            self.init_kwargs = {**getattr(self, "init_kwargs", {}), **dict(init_kwargs)}

    def resolved_logging_dir(self) -> str:
        """The logging directory, falling back to the current directory."""
        return getattr(self, "logging_dir", None) or os.getcwd()

    def warn_once(self, key: str, message: str) -> None:
        """Emit ``message`` as a `UserWarning` the first time ``key`` is seen by this tracker."""
        warned = self.__dict__.setdefault("_warned", set())
        if key in warned:
            return
        warned.add(key)
        warnings.warn(f"[{self.name or type(self).__name__} tracker] {message}", UserWarning, stacklevel=3)

    def prepare_values(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """Flatten and convert ``values`` (see :func:`prepare_values`), warning once per bad key.

        Objects of the tracker's own package (``wandb.Image``, ``aim.Image``, ...) pass through.
        """
        return prepare_values(
            values, lambda key, message: self.warn_once(f"value:{key}", message), getattr(self, "package", None)
        )

    def prepare_groups(self, values: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        """``values`` split as Accelerate's trackers see them: the top-level values (prepared, see `prepare_values`),
        and each top-level dict value prepared on its own (its own nested dicts flattened to ``"a/b"`` keys).

        ``{"loss": t, "eval": {"acc": 0.6, "f1": 0.5}}`` -> ``({"loss": 0.3}, {"eval": {"acc": 0.6, "f1": 0.5}})``.
        """
        if not isinstance(values, Mapping):
            return self.prepare_values(values), {}  # (its error)
        top = {key: value for key, value in values.items() if not isinstance(value, Mapping)}
        groups = {}
        for key, value in values.items():
            if isinstance(value, Mapping):
                warn = functools.partial(self._warn_value, f"{key}/")
                group = prepare_values(value, warn, getattr(self, "package", None))
                if group:
                    groups[str(key)] = group
        return self.prepare_values(top), groups

    def _warn_value(self, prefix: str, key: str, message: str) -> None:
        self.warn_once(f"value:{prefix}{key}", message)

    def prepare_tree(self, values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
        """``values`` prepared leaf by leaf with their nesting kept (for backends that lay nested dicts out themselves:
        W&B, Trackio, SwanLab, as Accelerate hands them over); an empty dict is left out."""
        if not isinstance(values, Mapping):
            return self.prepare_values(values)  # (its error)
        top = {key: value for key, value in values.items() if not isinstance(value, Mapping)}
        prepared = prepare_values(top, functools.partial(self._warn_value, prefix), getattr(self, "package", None))
        tree: dict[str, Any] = {}
        for key, value in values.items():
            if isinstance(value, Mapping):
                branch = self.prepare_tree(value, f"{prefix}{key}/")
                if branch:
                    tree[str(key)] = branch
            elif str(key) in prepared:
                tree[str(key)] = prepared[str(key)]
        return tree

    def _should_run(self, trainer: TrainerView) -> bool:
        is_main = trainer.is_global_zero
        self.set_main_process(is_main)
        return is_main or not self.main_process_only

    # --- the Trainer face ---------------------------------------------------------------------------
    def start_from_trainer(self, trainer: TrainerView, module: TrainModule) -> None:
        """Start this tracker's run for a `Trainer` run (once; main process only, unless ``main_process_only=False``):
        its name is the module's class; its hparams the module's and the DataModule's (`logged_hyperparameters`), unless the
        Trainer has ``enable_autolog_hparams=False``."""
        if not self._should_run(trainer) or self.started:
            return
        if getattr(self, "logging_dir", None) is None:
            self.logging_dir = os.fspath(trainer.project_dir)
        self.configure(run_name=user_class(module).__name__)
        self.begin(continue_run=True)
        if getattr(trainer, "enable_autolog_hparams", True):  # Lightning's switch
            hparams = logged_hyperparameters(module, getattr(trainer, "datamodule", None))
            if hparams:
                self.store_init_configuration(hparams)

    def on_fit_start(self, trainer: TrainerView, module: TrainModule) -> None:
        self.start_from_trainer(trainer, module)

    def on_validation_start(self, trainer: TrainerView, module: TrainModule) -> None:
        self.start_from_trainer(trainer, module)

    def on_test_start(self, trainer: TrainerView, module: TrainModule) -> None:
        self.start_from_trainer(trainer, module)

    def on_log_metrics(self, trainer: TrainerView, module: TrainModule, metrics: dict[str, float], step: int) -> None:
        if not self._should_run(trainer):
            return
        if not self.started:
            self.start_from_trainer(trainer, module)
        self.log(metrics, step=step)

    def teardown(self, trainer: TrainerView, module: TrainModule, stage: str) -> None:
        if self._should_run(trainer):
            self.end()

    def on_exception(self, trainer: TrainerView, module: TrainModule, exception: BaseException) -> None:
        if self._should_run(trainer):
            self.end()  # flush what was logged and stop the backend's helpers; teardown then does nothing

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, run_name={getattr(self, 'run_name', None)!r})"
