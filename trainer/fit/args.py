"""The `Trainer`'s constructor arguments: the checked record `TrainerArgs`, and what it builds.

`check_arguments` validates every argument before any work starts and raises ``ValueError``/``TypeError``
naming the bad value and the fix. `build_accelerator` and `default_callbacks` turn the record into the
`Accelerator` and the callback list the `Trainer` drives; `launch_processes` starts the processes a plain
``python script.py`` with ``devices > 1`` asks for.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any

from callbacks.base import Callback
from strategies import REGISTRY, Strategy, normalize_precision, resolve_auto
from strategies.environment import detect_environment
from trainer.accelerator import Accelerator
from trainer.accelerator.config import DataLoaderConfiguration, TorchDynamoPlugin
from trainer.fit.plugins import check_plugins
from trainer.fit.profiler import AdvancedProfiler, Profiler, SimpleProfiler
from trainer.launchers import can_rerun_current_script, launch_current_script


@dataclass(frozen=True)
class TrainerArgs:
    """The checked constructor arguments of a `Trainer`."""

    strategy: Any
    devices: Any
    precision: str | None
    max_epochs: int | None
    max_steps: int | None
    accumulate_grad_batches: int  # a {epoch: n} schedule is a GradientAccumulationScheduler in `callbacks`
    gradient_clip_val: float | None
    gradient_clip_algorithm: str
    callbacks: tuple[Callback, ...]
    log_with: Any
    project_dir: str
    val_check_interval: int | float | None
    check_val_every_n_epoch: int
    limit_train_batches: int | float | None
    limit_val_batches: int | float | None
    limit_test_batches: int | float | None
    limit_predict_batches: int | float | None
    num_sanity_val_steps: int
    log_every_n_steps: int
    enable_progress_bar: bool
    enable_checkpointing: bool
    enable_model_summary: bool
    seed: int | None
    deterministic: bool
    process_group_timeout: float | None
    accelerator: str = "auto"
    fast_dev_run: int = 0
    on_nonfinite: str | None = None
    num_nodes: int = 1
    overfit_batches: int | float = 0
    sync_batchnorm: bool = False
    use_distributed_sampler: bool = True
    reload_dataloaders_every_n_epochs: int = 0
    inference_mode: bool = True
    detect_anomaly: bool = False
    benchmark: bool | None = None
    profiler: str | Profiler | None = None
    compile: Any = None
    stop_check_interval: int | float = 1.0
    min_epochs: int = 0
    min_steps: int | None = None
    max_time: Any = None
    barebones: bool = False
    async_checkpoint: bool = False
    enable_autolog_hparams: bool = True
    launch_processes: bool = False


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_int(name: str, value: Any, minimum: int, *, allow_none: bool = False, hint: str = "") -> None:
    if (value is None and allow_none) or (_is_int(value) and value >= minimum):
        return
    raise ValueError(f"{name}={value!r} must be an int >= {minimum}{' or None' if allow_none else ''}{hint}")


def _check_limit(name: str, value: Any) -> None:
    if value is None or (_is_int(value) and value >= 0) or (isinstance(value, float) and 0.0 <= value <= 1.0):
        return
    raise ValueError(f"{name}={value!r} must be None (all batches), an int >= 0 (a number of batches) or a float in [0.0, 1.0] (a fraction)")


def _check_lightning_only(enable_autolog_hparams: Any, model_registry: Any) -> None:
    if not isinstance(enable_autolog_hparams, bool):
        raise TypeError(f"Trainer(enable_autolog_hparams={enable_autolog_hparams!r}) must be True or False")
    if model_registry is not None:
        raise NotImplementedError(
            f"Trainer(model_registry={model_registry!r}): Lightning.ai's model registry is not offered; leave it None and "
            "publish the checkpoint directory (or its model.safetensors) yourself"
        )


def check_arguments(**kw: Any) -> TrainerArgs:
    """Check every `Trainer` argument; raise ``ValueError``/``TypeError`` naming the bad value and the fix."""
    kw = _lightning_names(_overfit_batches(_fast_dev_run(_barebones(kw))))
    strategy = kw["strategy"]
    if not isinstance(strategy, Strategy):
        if not isinstance(strategy, str) or strategy.lower() not in REGISTRY:
            raise ValueError(f"strategy={strategy!r} is not known; choose one of {', '.join(map(repr, sorted(REGISTRY)))} or pass a Strategy")
        strategy = strategy.lower()
    devices = kw["devices"]
    if devices != "auto" and not (_is_int(devices) and devices >= 1):
        raise ValueError(f"devices={devices!r} must be 'auto' or a positive int (the number of processes on this machine)")
    if strategy == "single" and _is_int(devices) and devices > 1:
        raise ValueError(f"strategy='single' runs one process but devices={devices}; use strategy='ddp' or devices=1")
    _check_lightning_only(kw.get("enable_autolog_hparams", True), kw.pop("model_registry", None))
    # a precision plugin (plugins=[MixedPrecision("bf16-mixed", "cpu")]) names the precision as precision= does
    precision, kw["async_checkpoint"] = check_plugins(kw.pop("plugins", None), kw["precision"])
    if precision is not None:
        try:
            precision = normalize_precision(precision)
        except ValueError:
            raise ValueError(
                f"precision={precision!r} is not supported; choose one of 32, 16, 'bf16', '32-true', '16-mixed', 'bf16-mixed', "
                "'16-true', 'bf16-true', '64-true' (also 'no', 'fp16', 'fp16-true', 64, 'double')"
            ) from None
    if kw["max_epochs"] not in (None, -1):
        _check_int("max_epochs", kw["max_epochs"], 1, hint=", -1 (no epoch limit, with max_steps) or None")
    max_steps = None if kw["max_steps"] == -1 else kw["max_steps"]
    _check_int("max_steps", max_steps, 1, allow_none=True)
    max_epochs = kw["max_epochs"]
    timed = _time_limited(kw["max_time"], kw["callbacks"])
    if max_epochs == -1 and max_steps is None and not timed:
        raise ValueError("max_epochs=-1 (no epoch limit) needs max_steps or max_time; set max_steps=... or a positive max_epochs")
    if max_epochs is None and max_steps is None and not timed:  # with a time limit, none (Lightning's rule)
        max_epochs = 1000
    min_epochs, min_steps = _min_limits(kw["min_epochs"], kw["min_steps"])
    clip = kw["gradient_clip_val"]
    if clip is not None and (isinstance(clip, bool) or not isinstance(clip, (int, float)) or clip < 0):
        raise ValueError(f"gradient_clip_val={clip!r} must be None or a number >= 0")
    if kw["gradient_clip_algorithm"] not in ("norm", "value"):
        raise ValueError(f"gradient_clip_algorithm={kw['gradient_clip_algorithm']!r} must be 'norm' or 'value'")
    callbacks = kw["callbacks"]
    callbacks = () if callbacks is None else (callbacks,) if isinstance(callbacks, Callback) else tuple(callbacks)
    bad = [cb for cb in callbacks if not isinstance(cb, Callback)]
    if bad:
        raise TypeError(f"callbacks must be Callback instances, got {bad!r:.200}; subclass callbacks.base.Callback")
    callbacks, kw["accumulate_grad_batches"] = _accumulation(kw["accumulate_grad_batches"], callbacks)
    interval = kw["val_check_interval"]
    if not (interval is None or (_is_int(interval) and interval >= 1) or (isinstance(interval, float) and 0.0 < interval <= 1.0)):
        raise ValueError(f"val_check_interval={interval!r} must be None, an int >= 1 (batches) or a float in (0.0, 1.0] (fraction of an epoch)")
    _check_int("check_val_every_n_epoch", kw["check_val_every_n_epoch"], 1)
    for name in ("limit_train_batches", "limit_val_batches", "limit_test_batches", "limit_predict_batches"):
        _check_limit(name, kw[name])
    _check_int("num_sanity_val_steps", kw["num_sanity_val_steps"], -1, hint=" (-1: all validation batches)")
    _check_int("log_every_n_steps", kw["log_every_n_steps"], 1)
    for name in ("enable_progress_bar", "enable_checkpointing", "enable_model_summary", "deterministic"):
        if not isinstance(kw[name], bool):
            raise TypeError(f"{name}={kw[name]!r} must be True or False")
    if kw["seed"] is not None and not _is_int(kw["seed"]):
        raise TypeError(f"seed={kw['seed']!r} must be an int or None")
    timeout = kw["process_group_timeout"]
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
        raise ValueError(f"process_group_timeout={timeout!r} must be a positive number of seconds or None")
    if kw.get("default_root_dir") is not None and not isinstance(kw["default_root_dir"], (str, os.PathLike)):
        raise TypeError(f"default_root_dir={kw['default_root_dir']!r} must be a path (str or os.PathLike)")
    if not isinstance(kw["project_dir"], (str, os.PathLike)):
        raise TypeError(f"project_dir={kw['project_dir']!r} must be a path (str or os.PathLike)")
    check = kw["stop_check_interval"]
    if not ((_is_int(check) and check >= 1) or (isinstance(check, float) and 0.0 < check < float("inf"))):
        raise ValueError(
            f"stop_check_interval={check!r} must be a float > 0 (seconds between the processes' agreements on stopping and "
            "preemption, e.g. 1.0) or an int >= 1 (batches; 1 agrees every batch)"
        )
    if kw["on_nonfinite"] not in (None, "skip", "stop"):
        raise ValueError(f"on_nonfinite={kw['on_nonfinite']!r} must be None, 'skip' or 'stop'")
    _check_int("num_nodes", kw["num_nodes"], 1)
    _check_num_nodes(kw["num_nodes"])
    for name in ("sync_batchnorm", "use_distributed_sampler", "inference_mode", "detect_anomaly"):
        if not isinstance(kw[name], bool):
            raise TypeError(f"{name}={kw[name]!r} must be True or False")
    if kw["benchmark"] is not None and not isinstance(kw["benchmark"], bool):
        raise TypeError(f"benchmark={kw['benchmark']!r} must be True, False or None (leave torch.backends.cudnn.benchmark as it is)")
    _check_int("reload_dataloaders_every_n_epochs", kw["reload_dataloaders_every_n_epochs"], 0, hint=" (0: never reload)")
    if not isinstance(kw["profiler"], Profiler) and kw["profiler"] not in _PROFILERS:
        raise ValueError(f"profiler={kw['profiler']!r} is not supported; choose one of {', '.join(map(repr, _PROFILERS))}, "
                         "or pass a Profiler (SimpleProfiler, AdvancedProfiler, PyTorchProfiler from trainer.profilers)")
    kw["compile"] = _compile_plugin(kw["compile"])
    values = {**kw, "strategy": strategy, "precision": precision, "max_epochs": max_epochs, "max_steps": max_steps, "callbacks": callbacks,
              "gradient_clip_val": clip or None, "project_dir": os.fspath(kw["project_dir"]), "min_epochs": min_epochs,
              "min_steps": min_steps}
    launch = _needs_launch(strategy, devices)
    if launch and not can_rerun_current_script():
        raise RuntimeError(
            f"Trainer(strategy={_strategy_name(strategy)!r}, devices={devices}) starts its processes by re-running this script, "
            "but this is an interactive session (a notebook or a REPL) with no script to re-run. Build the Trainer inside a "
            f"function and run it with `from trainer import notebook_launcher; notebook_launcher(train, num_processes={devices})` "
            "(Lightning's strategy='ddp_notebook'), or run your code as a script"
        )
    return TrainerArgs(**values, launch_processes=launch)


_ACCELERATORS = ("auto", "cpu", "gpu", "cuda", "mps", "tpu")
_PROFILERS = (None, "simple", "advanced", "pytorch")


def build_profiler(value: str | Profiler | None) -> Profiler | None:
    """``Trainer(profiler=...)``: None, a `Profiler`, or ``"simple"``/``"advanced"``/``"pytorch"`` (default settings)."""
    if value is None or isinstance(value, Profiler):
        return value
    if value == "simple":
        return SimpleProfiler()
    if value == "advanced":
        return AdvancedProfiler()
    if value == "pytorch":
        from trainer.fit.torch_profiler import PyTorchProfiler  # lazy: its module reads torch.profiler, only for profiler="pytorch"

        return PyTorchProfiler()
    raise ValueError(f"profiler={value!r} is not supported; choose one of None, 'simple', 'advanced', 'pytorch', or pass a "
                     "SimpleProfiler/AdvancedProfiler/PyTorchProfiler object")


def _accumulation(value: Any, callbacks: tuple[Callback, ...]) -> tuple[tuple[Callback, ...], int]:
    """``accumulate_grad_batches``: an int >= 1, or ``{epoch: batches per step}``, which becomes a
    `GradientAccumulationScheduler` among the callbacks (the Trainer's own factor then stays 1)."""
    if not isinstance(value, dict):
        _check_int("accumulate_grad_batches", value, 1, hint=", or a dict {epoch: batches per optimizer step}")
        return callbacks, value
    # lazy: only a schedule loads the callback
    from callbacks.gradient_accumulation_scheduler import GradientAccumulationScheduler, check_scheduling

    if any(isinstance(cb, GradientAccumulationScheduler) for cb in callbacks):
        raise ValueError(
            f"accumulate_grad_batches={value!r} and a GradientAccumulationScheduler among the callbacks both schedule the "
            "accumulation; keep one"
        )
    return (*callbacks, GradientAccumulationScheduler(check_scheduling(value, "accumulate_grad_batches"))), 1


def _compile_plugin(value: Any) -> Any:
    """``compile=``: None/False (off), True (inductor), a dict of `TorchDynamoPlugin` fields, or a `TorchDynamoPlugin`."""
    if value is None or value is False:
        return None
    if value is True:
        return TorchDynamoPlugin(backend="inductor")
    if isinstance(value, TorchDynamoPlugin):
        return value
    if isinstance(value, dict):
        try:
            return TorchDynamoPlugin(**{"backend": "inductor", **value})
        except TypeError as err:
            raise TypeError(f"compile={value!r}: {err}; the keys are TorchDynamoPlugin's (backend, mode, fullgraph, dynamic, options, "
                            "use_regional_compilation)") from None
    raise TypeError(f"compile={value!r} must be True, a dict of TorchDynamoPlugin fields or a TorchDynamoPlugin, e.g. "
                    "compile={'use_regional_compilation': True}")


def _time_limited(max_time: Any, callbacks: Any) -> bool:
    """Whether the run has a wall-time limit: ``max_time`` (checked here) or a `Timer` with a duration among `callbacks`."""
    from callbacks.timer import Timer, parse_duration  # lazy: the Timer module loads only when a run is built

    if max_time is not None:
        try:
            parse_duration(max_time)
        except (TypeError, ValueError) as err:
            raise type(err)(f"max_time={max_time!r}: {err}") from None
        return True
    callbacks = () if callbacks is None else (callbacks,) if isinstance(callbacks, Callback) else callbacks
    return any(isinstance(cb, Timer) and cb.duration is not None for cb in callbacks)


def _min_limits(min_epochs: Any, min_steps: Any) -> tuple[int, int | None]:
    """Lightning's ``min_epochs``/``min_steps``: a stop asked for earlier waits for them; ``min_steps`` alone means at
    least one epoch too (Lightning's `_parse_loop_limits`)."""
    _check_int("min_epochs", min_epochs, 0, allow_none=True)
    _check_int("min_steps", min_steps, 0, allow_none=True)
    if min_epochs is None:
        min_epochs = 1 if min_steps is not None else 0
    return min_epochs, min_steps


# Lightning's defaults of the arguments `barebones=True` turns off (None: not passed)
_BAREBONES_OFF = {"enable_checkpointing": True, "enable_progress_bar": True, "enable_model_summary": True, "log_every_n_steps": 50,
                  "num_sanity_val_steps": 2}


def _barebones(kw: dict[str, Any]) -> dict[str, Any]:
    """Lightning's ``barebones=True``: no checkpointing, progress bar, model summary, trackers, sanity check, and
    ``self.log`` does nothing; each of them passed turned on, and ``fast_dev_run``/``detect_anomaly``/``profiler``,
    is an error. Without it, the arguments left at None get their defaults."""
    barebones = kw["barebones"]
    if not isinstance(barebones, bool):
        raise TypeError(f"barebones={barebones!r} must be True or False")
    if not barebones:
        return {**kw, **{name: default for name, default in _BAREBONES_OFF.items() if kw[name] is None}}
    on = [f"{name}={kw[name]!r}" for name in _BAREBONES_OFF if kw[name] not in (None, False, 0)]
    on += [f"{name}={kw[name]!r}" for name in ("logger", "fast_dev_run", "detect_anomaly", "profiler") if kw[name] not in (None, False, 0)]
    if kw["log_with"] not in ("csv", None):  # "csv" is the default: it cannot be told from "not passed"
        on.append(f"log_with={kw['log_with']!r}")
    if on:
        raise ValueError(
            f"Trainer(barebones=True, {', '.join(on)}): barebones mode turns off everything that may cost speed "
            "(checkpointing, progress bar, model summary, trackers and self.log, sanity check, fast_dev_run, anomaly detection, "
            "profiler); drop those arguments or pass barebones=False"
        )
    return {**kw, "enable_checkpointing": False, "enable_progress_bar": False, "enable_model_summary": False, "log_every_n_steps": 50,
            "num_sanity_val_steps": 0, "log_with": None, "logger": None}


def _overfit_batches(kw: dict[str, Any]) -> dict[str, Any]:
    """Lightning's ``overfit_batches``: N batches (or a fraction) of the train loader, unshuffled, every epoch, and as
    many of the validation loader; it sets ``limit_train_batches`` and ``limit_val_batches``, so it cannot go with them."""
    value = kw["overfit_batches"]
    if value == 0 and not isinstance(value, bool):
        return {**kw, "overfit_batches": 0}
    _check_limit("overfit_batches", value)
    given = [name for name in ("limit_train_batches", "limit_val_batches") if kw[name] is not None]
    if given and not kw["fast_dev_run"]:
        raise ValueError(f"overfit_batches={value!r} sets limit_train_batches and limit_val_batches, but {given[0]}={kw[given[0]]!r} "
                         "was passed too; pass one of them")
    if kw["fast_dev_run"]:  # as Lightning: fast_dev_run wins
        return kw
    return {**kw, "limit_train_batches": value, "limit_val_batches": value}


def _check_num_nodes(num_nodes: int) -> None:
    """Lightning's ``num_nodes`` (machines): here the launcher sets the layout, so a count other than the default 1 must agree
    with what was launched. The default takes the launcher's, whatever it is: a job that TorchElastic restarts on fewer
    (or more) machines goes on with the same script (docs/elastic.md)."""
    if num_nodes == 1:
        return
    cluster = detect_environment()
    nodes = max(1, cluster.world_size // max(1, cluster.local_world_size))
    if num_nodes != nodes:
        how = (f"the launcher started {cluster.world_size} processes, {cluster.local_world_size} per machine ({cluster.source})"
               if cluster.is_distributed else "this is one process, not started by a launcher")
        raise ValueError(
            f"num_nodes={num_nodes} but {how}: {nodes} machine(s). The launcher sets the layout: pass num_nodes={nodes} (or leave "
            f"it out), or start the script on {num_nodes} machines with `trainer launch --num_machines {num_nodes} ...`, torchrun or SLURM"
        )


def _fast_dev_run(kw: dict[str, Any]) -> dict[str, Any]:
    """Lightning's ``fast_dev_run``: N batches (1 for True) of each stage, one epoch, no sanity check, no trackers,
    no checkpoints, no early stopping."""
    value = kw.pop("fast_dev_run")
    if value is False or value == 0:
        return {**kw, "fast_dev_run": 0}
    if value is True:
        value = 1
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"fast_dev_run={value!r} must be True/False or a number of batches >= 0")
    # lazy: the built-in callbacks load only for a run that uses them
    from callbacks.checkpoint import ModelCheckpoint
    from callbacks.early_stopping import EarlyStopping
    from callbacks.trackers import GeneralTracker

    callbacks = kw["callbacks"]
    callbacks = () if callbacks is None else (callbacks,) if isinstance(callbacks, Callback) else tuple(callbacks)
    kept = tuple(cb for cb in callbacks if not isinstance(cb, (ModelCheckpoint, EarlyStopping, GeneralTracker)))
    batches = {f"limit_{stage}_batches": value for stage in ("train", "val", "test", "predict")}
    return {**kw, **batches, "max_epochs": 1, "max_steps": value, "num_sanity_val_steps": 0, "val_check_interval": None,
            "check_val_every_n_epoch": 1, "log_with": None, "logger": None, "enable_checkpointing": False,
            "callbacks": kept, "fast_dev_run": value}


def _lightning_names(kw: dict[str, Any]) -> dict[str, Any]:
    """Fold Lightning's ``accelerator``, ``default_root_dir`` and ``logger`` into our arguments (a conflict is an error)."""
    kw = dict(kw)
    accelerator = kw.pop("accelerator")
    if not isinstance(accelerator, str) or accelerator.lower() not in _ACCELERATORS:
        raise ValueError(f"accelerator={accelerator!r} is not supported; choose one of {', '.join(map(repr, _ACCELERATORS))}")
    accelerator = accelerator.lower()
    import torch

    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"accelerator={accelerator!r} but this machine has no CUDA device; use accelerator='cpu' or 'auto'")
    mps = getattr(torch.backends, "mps", None)
    if accelerator == "mps" and not (mps is not None and mps.is_available()):
        raise RuntimeError("accelerator='mps' but MPS is not available here; use accelerator='cpu' or 'auto'")
    if accelerator == "tpu":  # Lightning's name for the XLA strategy's device
        if kw["strategy"] == "auto":
            kw["strategy"] = resolve_auto("auto", distributed=False, xla=True)
        elif getattr(REGISTRY.get(_strategy_name(kw["strategy"])), "name", None) != "xla":
            raise ValueError(f"accelerator='tpu' runs strategy='xla', but strategy={kw['strategy']!r} was passed; pass strategy='xla' or 'auto'")
    kw["accelerator"] = accelerator
    root = kw.pop("default_root_dir")
    if root is not None:
        if os.fspath(kw["project_dir"]) not in (".", os.fspath(root)):
            raise ValueError(f"default_root_dir={root!r} and project_dir={kw['project_dir']!r} name two directories; pass one of them")
        kw["project_dir"] = root
    logger = kw.pop("logger")
    if logger is not None:
        if kw["log_with"] not in ("csv", None):
            raise ValueError(f"logger={logger!r} and log_with={kw['log_with']!r} both choose trackers; pass one of them")
        kw["log_with"] = ("csv" if logger else None) if isinstance(logger, bool) else logger
    return kw


def _needs_launch(strategy: str | Strategy, devices: Any) -> bool:
    """True when this plain process must start `devices` processes itself (from ``fit``)."""
    cluster = detect_environment()
    if cluster.is_distributed:
        if _is_int(devices) and devices != cluster.local_world_size:
            raise ValueError(
                f"devices={devices} but the launcher started {cluster.local_world_size} processes on this machine "
                f"({cluster.source}); pass devices={cluster.local_world_size} or devices='auto'"
            )
        return False
    entry = REGISTRY.get(_strategy_name(strategy))
    return _is_int(devices) and devices > 1 and entry is not None and entry.launchable


def _strategy_name(strategy: str | Strategy) -> str:
    """The registry name of a strategy given by name or as an instance (which each launched process builds anew)."""
    return str(getattr(strategy, "name", strategy))


def build_accelerator(args: TrainerArgs) -> Accelerator:
    """The `Accelerator` a `Trainer` with these arguments drives."""
    return Accelerator(
        cpu=True if args.accelerator == "cpu" else None,
        mixed_precision=args.precision,
        gradient_accumulation_steps=None if args.accumulate_grad_batches == 1 else args.accumulate_grad_batches,
        strategy=None if args.strategy == "auto" else args.strategy,
        project_dir=args.project_dir,
        step_scheduler_with_optimizer=False,
        process_group_timeout=args.process_group_timeout,
        dynamo_plugin=args.compile,
        # shuffling by seed + epoch (no RNG synchronization per epoch); a stream's last step completed from its start
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, dispatch_batches=False),
    )


def default_callbacks(args: TrainerArgs) -> list[Callback]:
    """The user's callbacks plus the enabled defaults (progress bar, summary, checkpointing) and the trackers."""
    callbacks = list(args.callbacks)
    if args.enable_progress_bar:
        from callbacks.progress import ProgressBar  # lazy: each default callback loads only when enabled

        if not any(isinstance(cb, ProgressBar) for cb in callbacks):
            callbacks.append(ProgressBar())
    if args.enable_model_summary:
        from callbacks.summary import ModelSummary  # lazy: each default callback loads only when enabled

        if not any(isinstance(cb, ModelSummary) for cb in callbacks):
            callbacks.append(ModelSummary())
    if args.enable_checkpointing:
        from callbacks.checkpoint import ModelCheckpoint  # lazy: each default callback loads only when enabled

        if not any(isinstance(cb, ModelCheckpoint) for cb in callbacks):
            callbacks.append(ModelCheckpoint())
    if args.max_time is not None:
        from callbacks.timer import Timer  # lazy: each default callback loads only when enabled

        if any(isinstance(cb, Timer) for cb in callbacks):
            warnings.warn(f"Trainer(max_time={args.max_time!r}) is ignored: the callbacks already contain a Timer (as in Lightning)",
                          stacklevel=3)
        else:
            callbacks.append(Timer(duration=args.max_time, interval="step"))
    if args.log_with:
        from callbacks.trackers import resolve_trackers  # lazy: the tracker modules load only when trackers are asked for

        callbacks.extend(resolve_trackers(args.log_with, project_dir=args.project_dir))
    return callbacks


def launch_processes(args: TrainerArgs) -> None:
    """Re-run the current script on ``args.devices`` DDP processes (a plain ``python script.py`` with ``devices > 1``)."""
    settings: dict[str, Any] = {"strategy": resolve_auto(_strategy_name(args.strategy), distributed=True)}
    if args.precision is not None:
        settings["mixed_precision"] = args.precision
    if args.accelerator == "cpu":
        settings["cpu"] = True
    launch_current_script(int(args.devices), **settings)
