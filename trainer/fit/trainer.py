"""`Trainer`: the Lightning-style face. It owns an `Accelerator` and drives the loop through it.

    trainer = Trainer(max_epochs=10, precision="bf16-mixed")
    trainer.fit(module, train_loader, val_loader)
    trainer.test(module, test_loader)

`fit` reads top to bottom in `Trainer._fit`; the loops it runs (`train_epoch`, `train_batch`,
`eval_loop`, ...) are plain functions in `trainer.fit.loops`, and the constructor arguments are checked in
`trainer.fit.args`. Preparation, backward, accumulation, clipping, gathering and checkpoint I/O are
the `Accelerator`'s; nothing here reimplements them.

This module holds the constructor, the entry points (``fit``, ``validate``, ``test``, ``predict``) and how a run
starts and ends; the class is completed by two parts in their own modules: `trainer.fit.attributes`
(`TrainerAttributes`: Lightning's attributes, ``accelerator``, ``world_size``, ``model``, ...) and
`trainer.fit.metrics` (`TrainerMetrics`: ``callback_metrics``, ``log_metrics``, the trackers).
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast, overload

import torch

from callbacks.base import Callback
from callbacks.view import ValidationSchedule
from strategies.abilities import Engine
from strategies.checkpoint_io import load_weights
from strategies.checkpoint_store import CheckpointSaveError
from strategies.process_group import report_collective_failure
from trainer.fit import batch, loops, preemption
from trainer.fit.agreement import LoopAgreement
from trainer.fit.args import TrainerArgs, build_accelerator, build_profiler, check_arguments, default_callbacks, launch_processes
from trainer.fit.attributes import TrainerAttributes
from trainer.fit.checkpointing import (
    check_weights_only,
    resolve_ckpt_path,
    restore_checkpoint,
    save_checkpoint,
    trainer_parts,
    verify_checkpoint,
)
from trainer.fit.dispatch import HookDispatcher, order_callbacks, refuse_hooks_not_called, with_module_callbacks
from trainer.fit.finders import run_finder
from trainer.fit.loaders import RunLoaders, one_data_source, one_or_list
from trainer.fit.loss_health import LossHealth
from trainer.fit.metrics import TrainerMetrics
from trainer.fit.model_setup import ModelSetup
from trainer.fit.module import LRSchedulerConfig, TrainModule
from trainer.fit.plugins import plugin_precision_settings
from trainer.fit.profiler import ProfiledDispatcher, Profiler, profile
from trainer.fit.results import ResultsStore
from trainer.fit.run_state import RunState, RunStateField, RunStateValue
from trainer.fit.search import TunerExit
from trainer.fit.transfer import moves_batches_itself

if TYPE_CHECKING:
    from datetime import timedelta

    from callbacks.batch_size_finder import BatchSizeFinder
    from callbacks.lr_finder import LearningRateFinder
    from callbacks.trackers.base import GeneralTracker
    from callbacks.trackers.registry import LogWith
    from callbacks.view import ModuleTrainerView
    from strategies.base import Strategy
    from strategies.checkpoint_store import PendingSave
    from strategies.precision import Precision
    from trainer.accelerator.accelerator import Accelerator
    from trainer.accelerator.config import TorchDynamoPlugin
    from trainer.fit.combined_loader import Loaders
    from trainer.fit.datamodule import DataModule
    from trainer.fit.lr_finder import LRFinder
    from trainer.fit.module import ManualOptimizer
    from trainer.fit.plugins import AsyncCheckpointIO


class Trainer(TrainerAttributes, TrainerMetrics):
    """Runs a `TrainModule`: ``fit``, ``validate``, ``test`` and ``predict``.

    All arguments are keyword-only and checked here, before any work starts. When neither
    ``max_epochs`` nor ``max_steps`` is given, training stops after 1000 epochs (as in Lightning).

    Args:
        strategy: ``"auto"``, ``"single"``, ``"ddp"``, ``"fsdp"``, ``"deepspeed"`` (or ``"deepspeed_stage_3"``, ...) or a `Strategy`.
        devices: ``"auto"`` or the number of processes on this machine. ``strategy="ddp", devices=2`` in a plain
            ``python script.py`` re-runs the script on 2 processes when ``fit`` is called.
        precision: ``32``/``"32-true"``/``"no"``, ``16``/``"16-mixed"``/``"fp16"``, ``"bf16-mixed"``/``"bf16"``; true
            precision ``"bf16-true"``, ``"16-true"``/``"fp16-true"``, ``"64-true"``/``64``/``"double"``
            (default: full precision, or ``TRAINWRIGHT_MIXED_PRECISION``).
        max_epochs: stop after this many epochs (the first of `max_epochs` and `max_steps` reached wins).
        max_steps: stop after this many optimizer steps (-1, the default, or None: no step limit).
        accumulate_grad_batches: batches per optimizer step, or ``{epoch: batches}`` from those epochs on (a
            `GradientAccumulationScheduler` is added to the callbacks; epochs before the first key: 1).
        gradient_clip_val: clip gradients to this before each step (None: no clipping).
        gradient_clip_algorithm: ``"norm"`` (the total norm) or ``"value"`` (each element).
        callbacks: `Callback` objects, called in list order before the module's hooks (Lightning's order).
        log_with: tracker name(s) (``"csv"``, ``"tensorboard"``, ...), tracker objects, or None.
        project_dir: where logs and checkpoints go.
        val_check_interval: validate every N training batches (int) or every fraction of an epoch (float; a train
            loader without a length, a stream, takes only 1.0).
        check_val_every_n_epoch: validate every N epochs.
        limit_train_batches: training batches per epoch (int) or a fraction of the loader (float; a loader without a
            length, a stream, takes only 0.0 or 1.0). A stream's epoch ends when it does (``num_training_batches`` is inf).
        limit_val_batches: the same for validation.
        limit_test_batches: the same for testing.
        limit_predict_batches: the same for prediction.
        num_sanity_val_steps: validation batches run before training (-1: all; None: 2, or 0 with `barebones`).
        log_every_n_steps: write step values to the trackers every N batches that end an accumulation window
            (every N batches in manual optimization), at `logging_step`, as Lightning does (None: 50).
        enable_progress_bar: add the default progress bar (None: True, or False with `barebones`).
        enable_checkpointing: add the default `ModelCheckpoint` (None: True, or False with `barebones`).
        enable_model_summary: add the default model summary (None: True, or False with `barebones`).
        seed: seed python, numpy and torch on every process before the run.
        deterministic: use deterministic algorithms.
        process_group_timeout: seconds a collective may wait for a missing process.
        accelerator: Lightning's device choice: ``"auto"``, ``"cpu"`` (forces the CPU), ``"gpu"``/``"cuda"``,
            ``"mps"`` (each refused with an error when that device is missing); ``"tpu"`` runs ``strategy="xla"`` (it needs torch_xla).
        default_root_dir: Lightning's name for `project_dir`.
        logger: Lightning's switch for the trackers: ``True`` (the default CSV tracker), ``False`` (none), a
            tracker object or a list of them (the same as `log_with`).
        fast_dev_run: ``True`` or N: run 1 (or N) batches of training, validation, test and prediction in one
            epoch, without sanity check, trackers, checkpoints or early stopping (Lightning's debugging run).
        on_nonfinite: what a NaN/inf training loss does (automatic optimization): None (nothing is checked),
            ``"skip"`` (every process skips that batch: no backward, no step; counted in ``trainer.nonfinite_skipped``)
            or ``"stop"`` (every process raises `FloatingPointError` naming the step and the first non-finite parameter).
        num_nodes: Lightning's machine count. The launcher sets the layout: the default 1 takes its count, whatever it is
            (an elastic job restarted on fewer machines goes on); another count must agree with it (an error otherwise).
        overfit_batches: train on the first N batches (int) or fraction (float) of the train loader every epoch, in
            order (a shuffling loader is read unshuffled, with a warning), and validate on as many validation batches.
        sync_batchnorm: convert ``BatchNorm*d`` layers to ``SyncBatchNorm`` before the module is wrapped (several
            processes on GPUs; nothing to do in one process).
        use_distributed_sampler: ``True`` shards the train and evaluation loaders across processes; ``False`` gives
            every process the whole loader, as passed.
        reload_dataloaders_every_n_epochs: call ``train_dataloader()``/``val_dataloader()`` again every N epochs (0: never).
        inference_mode: evaluate under ``torch.inference_mode()`` (``False``: ``torch.no_grad()``; sharded strategies
            always use ``no_grad``).
        detect_anomaly: run ``fit`` under ``torch.autograd.detect_anomaly()``.
        benchmark: set ``torch.backends.cudnn.benchmark`` (None leaves it as it is).
        profiler: ``"simple"`` (wall time), ``"advanced"`` (cProfile), ``"pytorch"`` (torch.profiler traces) or such a
            `Profiler` object (``trainer.profilers``) times the main actions and hooks of ``fit`` and reports at its end; None: off.
        compile: compile the module after the strategy set it up (sharded, activation-checkpointed): ``True`` (inductor,
            the whole forward), a `TorchDynamoPlugin` (``use_regional_compilation=True`` compiles each repeated block), or
            a dict of its fields. ``fit(torch.compile(module))`` does the same for the whole forward.
        stop_check_interval: with several processes, how often during training they agree on stopping
            (``trainer.should_stop`` set on any of them) and on a preemption signal: seconds (a float, default 1.0) or
            batches (an int; 1: every batch). They also agree after each validation and at each epoch's end; nothing is
            reduced in between, so a step makes no collective of its own. See `trainer.fit.agreement`.
        min_epochs: a stop asked for earlier (``trainer.should_stop``: early stopping, a callback) waits until this many
            epochs are done; None: 0, or 1 with `min_steps` (Lightning's rule). `max_epochs`/`max_steps` still end the run.
        min_steps: the same for optimizer steps (None: no minimum).
        max_time: stop training after this wall time: ``"DD:HH:MM:SS"``, a ``timedelta`` or a dict of its arguments (a
            `callbacks.timer.Timer` checking after every batch; a Timer already among `callbacks` wins). Without
            `max_epochs`/`max_steps` there is then no epoch limit.
        barebones: turn off everything that may cost speed: checkpointing, progress bar, model summary, trackers,
            ``self.log`` (a warning, nothing logged), the sanity check. Passing one of them turned on, or `fast_dev_run`,
            `detect_anomaly`, `profiler`, is an error.
        plugins: Lightning's plugins; ``AsyncCheckpointIO()`` (`trainer.fit.plugins`) makes the Trainer's checkpoints
            asynchronous: written in the background once the state is copied (``ModelCheckpoint(async_save=...)`` per
            callback). A precision plugin of `trainer.plugins` (``MixedPrecision("bf16-mixed", "cuda")``,
            ``HalfPrecision``, ``DoublePrecision``, ``FSDPPrecision``, ``DeepSpeedPrecision``) is `precision` said
            another way (both together are an error, as in Lightning); ``MixedPrecision(..., scaler=)`` brings its loss
            scaler. Other plugins are refused with the argument that does their work here.
        enable_autolog_hparams: ``True``: the trackers record the module's and the DataModule's ``hparams`` when a run
            starts (each unless it called ``save_hyperparameters(logger=False)``); ``False``: they record none.
        model_registry: Lightning.ai's model registry upload; only None (not offered here).
    """

    def __init__(
        self,
        *,
        strategy: str | Strategy = "auto",
        devices: int | str = "auto",
        precision: str | int | None = None,
        max_epochs: int | None = None,
        max_steps: int | None = -1,
        accumulate_grad_batches: int | dict[int, int] = 1,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str = "norm",
        callbacks: Sequence[Callback] | Callback | None = None,
        log_with: LogWith = "csv",
        project_dir: str | os.PathLike[str] = ".",
        val_check_interval: int | float | None = None,
        check_val_every_n_epoch: int = 1,
        limit_train_batches: int | float | None = None,
        limit_val_batches: int | float | None = None,
        limit_test_batches: int | float | None = None,
        limit_predict_batches: int | float | None = None,
        num_sanity_val_steps: int | None = None,
        log_every_n_steps: int | None = None,
        enable_progress_bar: bool | None = None,
        enable_checkpointing: bool | None = None,
        enable_model_summary: bool | None = None,
        seed: int | None = None,
        deterministic: bool = False,
        process_group_timeout: float | None = None,
        accelerator: str = "auto",
        default_root_dir: str | os.PathLike[str] | None = None,
        logger: bool | GeneralTracker | Iterable[GeneralTracker] | None = None,
        fast_dev_run: bool | int = False,
        on_nonfinite: str | None = None,
        num_nodes: int = 1,
        overfit_batches: int | float = 0,
        sync_batchnorm: bool = False,
        use_distributed_sampler: bool = True,
        reload_dataloaders_every_n_epochs: int = 0,
        inference_mode: bool = True,
        detect_anomaly: bool = False,
        benchmark: bool | None = None,
        profiler: str | Profiler | None = None,
        compile: bool | TorchDynamoPlugin | dict[str, Any] | None = None,
        stop_check_interval: int | float = 1.0,
        min_epochs: int | None = None,
        min_steps: int | None = None,
        max_time: str | timedelta | dict[str, int] | None = None,
        barebones: bool = False,
        plugins: AsyncCheckpointIO | Precision | list[AsyncCheckpointIO | Precision] | tuple[AsyncCheckpointIO | Precision, ...] | None = None,
        enable_autolog_hparams: bool = True,
        model_registry: str | None = None,
    ) -> None:
        args = check_arguments(**{k: v for k, v in locals().items() if k not in ("self", "__class__")})
        self._args: TrainerArgs = args
        self.enable_autolog_hparams = args.enable_autolog_hparams  # read by the trackers when a run starts
        self.min_epochs, self.min_steps, self.barebones = args.min_epochs, args.min_steps, args.barebones
        self.gradient_clip_val, self.gradient_clip_algorithm = args.gradient_clip_val, args.gradient_clip_algorithm
        # when fit validates (read by the loop and by ModelCheckpoint/EarlyStopping); the epoch's length is set by fit
        self.validation_schedule = ValidationSchedule(args.val_check_interval, args.check_val_every_n_epoch)
        self.num_sanity_val_steps, self.log_every_n_steps = args.num_sanity_val_steps, args.log_every_n_steps
        self.project_dir = str(Path(args.project_dir))
        # what a run owns and where it is (trainer.fit.run_state): the loops advance it, checkpoints save its position,
        # a search puts it back; the Lightning attributes below (current_epoch, global_step, stage, ...) are views onto it
        self.run_state = RunState(max_epochs=args.max_epochs, max_steps=args.max_steps, loss_health=LossHealth(args.on_nonfinite))
        self.lightning_module: TrainModule | None = None
        self.model_setup = ModelSetup(self)  # the module as the strategy set it up, its optimizers
        self.loaders = RunLoaders(self)  # the run's train, validation and evaluation loaders
        self.datamodule: DataModule | None = None  # the DataModule of the running fit/validate/test/predict
        self.profiler: Profiler | None = build_profiler(args.profiler)
        if args.benchmark is not None:
            torch.backends.cudnn.benchmark = args.benchmark
        if args.seed is not None:
            from trainer.utils import set_seed  # lazy: trainer.utils loads the tracker modules; only a seeded run needs it

            set_seed(args.seed, deterministic=args.deterministic)
        elif args.deterministic:
            torch.use_deterministic_algorithms(True)
        # None in a plain process that starts the processes it asks for at fit() (`accelerator` raises there)
        self._accelerator: Accelerator | None = None if args.launch_processes else build_accelerator(args)
        if self._accelerator is not None:
            self._accelerator.checkpoint_parts.extend(trainer_parts(self))  # its state goes into every checkpoint
            strategy = self._accelerator.strategy  # a precision plugin's scaler and policy, as settings its precision is rebuilt from
            strategy.configure_precision(plugin_precision_settings(plugins, strategy.precision.settings, strategy.device))
        acc = self._accelerator
        if args.sync_batchnorm and acc is not None and self.world_size > 1 and acc.device.type == "cpu":
            raise ValueError(
                f"sync_batchnorm=True on {self.world_size} CPU processes: torch's SyncBatchNorm runs on GPUs only; "
                "pass sync_batchnorm=False (each process normalizes its own batch) or run on GPUs"
            )
        self.callbacks: list[Callback] = order_callbacks(default_callbacks(args))
        self._dispatch: HookDispatcher = HookDispatcher(None, TrainModule, self.callbacks, self)  # replaced with the module's in _attach
        self.agreement: LoopAgreement = self._new_agreement()  # stop and preemption, agreed across processes (trainer.fit.agreement)
        self._results: ResultsStore = ResultsStore(
            device=acc.device if acc is not None else torch.device("cpu"),
            reduce=lambda t, op: self.accelerator.reduce(t, op),
            gather_object=lambda obj: self.accelerator.gather_object(obj),
            world_size=self.world_size,
        )
        self.log_value = self._results.log if not args.barebones else _barebones_log  # what TrainModule.log calls: bound once

    # ------------------------------------------------------------------------------------ attributes
    # Lightning's attributes of the run, views onto `run_state` (`RunState` documents each); the settable ones set it.
    # The others (accelerator, world_size, model, ...) are `TrainerAttributes`'; the metrics and trackers `TrainerMetrics`'
    stage, training, sanity_checking = RunStateField[str | None](), RunStateField[bool](), RunStateField[bool]()
    max_epochs, max_steps = RunStateField[int | None](), RunStateField[int | None]()
    optimizers, lr_scheduler_configs = RunStateField[list[torch.optim.Optimizer]](), RunStateField[list[LRSchedulerConfig]]()
    current_epoch, global_step, logging_step = RunStateValue[int](), RunStateValue[int](), RunStateValue[int]()  # read-only
    loss_health = RunStateValue[LossHealth]()  # non-finite losses warned about once, skipped batches counted (per fit)
    should_stop = RunStateField[bool]()
    num_val_batches, num_test_batches, num_predict_batches = (RunStateField[int | float | list[int | float]]() for _ in range(3))

    # ------------------------------------------------------------------------------------ checkpoints
    def save_checkpoint(
        self, dirpath: str | os.PathLike[str], weights_only: bool = False, storage_options: None = None, *, async_save: bool | None = None,
    ) -> Path | PendingSave:
        """Write a complete checkpoint directory, atomically. Every process must call it.

        ``weights_only=True`` (Lightning's) writes the model weights and hyperparameters alone: they load with
        ``load_from_checkpoint`` and ``validate/test/predict(ckpt_path=...)``, and resuming training from them is refused.
        ``async_save=True`` returns once the state is copied out of the training tensors (a handle, see
        `strategies.checkpoint_store.PendingSave`) and writes it in the background; None: asynchronous when the
        Trainer has ``plugins=[AsyncCheckpointIO()]``. The next save, ``fit``'s end and a preemption wait for it.
        """
        if async_save is not None and not isinstance(async_save, bool):
            raise TypeError(f"save_checkpoint(async_save={async_save!r}) must be True, False or None (the Trainer's default)")
        if not isinstance(weights_only, bool):
            raise TypeError(f"save_checkpoint(weights_only={weights_only!r}) must be True or False")
        if storage_options is not None:
            raise TypeError(f"save_checkpoint(storage_options={storage_options!r}): checkpoints are written to a local or mounted "
                            "directory here, through no remote-storage layer; leave storage_options out")
        return save_checkpoint(self, dirpath, async_save=self._args.async_checkpoint if async_save is None else async_save,
                               weights_only=weights_only)

    # ------------------------------------------------------------------------------------ entry points
    def fit(
        self, model: TrainModule, train_dataloaders: Loaders | None = None, val_dataloaders: Loaders | None = None,
        datamodule: DataModule | None = None, ckpt_path: str | None = None, weights_only: bool | None = None,
    ) -> None:
        """Train `model` (a `TrainModule`), validating as configured; resume from `ckpt_path` ("last", "best" or a directory).

        The loaders come from the arguments, else from `datamodule` (a `DataModule`), else from the module's
        ``*_dataloader()`` methods. `weights_only` is Lightning 2.6's: None or True (nothing is unpickled here); False
        is refused (so are the same in `validate`, `test` and `predict`).
        """
        check_weights_only(weights_only, "fit")
        one_data_source(datamodule, train_dataloaders, val_dataloaders)
        module = self.model_setup.unwrap_compiled(model)
        if self._accelerator is None:
            launch_processes(self._args)
        if self.profiler is not None:  # files named by rank when there are several (Lightning: by local rank)
            self.profiler.setup("fit", self.global_rank if self.world_size > 1 else None, self.log_dir)
        anomaly = torch.autograd.detect_anomaly() if self._args.detect_anomaly else contextlib.nullcontext()
        try:
            with anomaly:
                self._run("fit", module, lambda: self._fit(module, train_dataloaders, val_dataloaders, ckpt_path), datamodule)
        except BaseException:
            if self.profiler is not None:
                self.profiler.teardown("fit")
            raise
        if self.profiler is not None:
            self.profiler.describe()

    def validate(
        self, model: TrainModule | None = None, dataloaders: Loaders | None = None, ckpt_path: str | None = None, verbose: bool = True,
        datamodule: DataModule | None = None, weights_only: bool | None = None,
    ) -> list[dict[str, float]]:
        """Run one validation epoch; returns ``[{metric: value}]`` of the epoch-level metrics (`verbose`: also printed
        as a table, on the main process, as Lightning's)."""
        check_weights_only(weights_only, "validate")
        one_data_source(datamodule, dataloaders)
        results = cast(list[dict[str, float]], self._run("validate", model, lambda: self._evaluate("validation", dataloaders, ckpt_path), datamodule))
        if verbose and results and self.is_global_zero:  # None: a batch-size search ended the run
            loops.print_results(results, "validate")
        return results

    def test(
        self, model: TrainModule | None = None, dataloaders: Loaders | None = None, ckpt_path: str | None = None, verbose: bool = True,
        datamodule: DataModule | None = None, weights_only: bool | None = None,
    ) -> list[dict[str, float]]:
        """Run one test epoch; returns ``[{metric: value}]`` of the epoch-level metrics (`verbose`: also printed as a
        table, on the main process, as Lightning's)."""
        check_weights_only(weights_only, "test")
        one_data_source(datamodule, dataloaders)
        results = cast(list[dict[str, float]], self._run("test", model, lambda: self._evaluate("test", dataloaders, ckpt_path), datamodule))
        if verbose and results and self.is_global_zero:  # None: a batch-size search ended the run
            loops.print_results(results, "test")
        return results

    def predict(
        self, model: TrainModule | None = None, dataloaders: Loaders | None = None, datamodule: DataModule | None = None,
        return_predictions: bool | None = None, ckpt_path: str | None = None, weights_only: bool | None = None,
    ) -> list[Any] | None:
        """Return ``predict_step``'s output for every batch, in dataset order, each sample once (all processes).

        With ``return_predictions=False`` the outputs are not kept (a callback's ``on_predict_batch_end`` can write
        them) and None is returned.
        """
        check_weights_only(weights_only, "predict")
        if return_predictions not in (None, True, False):
            raise TypeError(f"predict(..., return_predictions={return_predictions!r}) must be None, True or False")
        one_data_source(datamodule, dataloaders)
        keep = return_predictions is not False
        return cast("list[Any] | None", self._run("predict", model, lambda: self._evaluate("predict", dataloaders, ckpt_path, keep), datamodule))

    # ------------------------------------------------------------------------------------ fit
    def _fit(self, module: TrainModule, train_dataloaders: Any, val_dataloaders: Any, ckpt_path: str | None) -> None:
        state = self.run_state  # what the loops below advance (trainer.fit.run_state)
        state.begin_fit()
        self.model_setup.release_previous_fit()
        self.loaders.sources, self.loaders.stale = (train_dataloaders, val_dataloaders), False
        self.loaders.moves_batches = moves_batches_itself(self)
        val_loaders, built_at = self.loaders.build_fit(module, train_dataloaders, val_dataloaders), state.current_epoch
        self.model_setup.configure_optimizers(module)
        self._restore(ckpt_path)
        if self._args.reload_dataloaders_every_n_epochs and state.current_epoch != built_at:
            val_loaders = self.loaders.reload_resumed(module, train_dataloaders, val_dataloaders)
        self._dispatch.call("on_fit_start")
        if self.loaders.stale:  # a BatchSizeFinder set a new batch size (trainer.fit.batch_size_scaling)
            val_loaders, self.loaders.stale = self.loaders.build_fit(module, train_dataloaders, val_dataloaders, reload=True), False
        module.zero_grad()  # as Lightning: no gradient left from an earlier run reaches the first step
        if val_loaders and self.num_sanity_val_steps != 0 and state.global_step == 0:
            loops.sanity_check(self, val_loaders)
        state.training = True
        self._dispatch.call("on_train_start")
        reload_every = self._args.reload_dataloaders_every_n_epochs
        # the loaders are (re)built at the epochs that are multiples of reload_every, counted from epoch 0, so that a
        # resumed run reloads at the same epochs as the uninterrupted one (its loaders, just built, stand for the last one)
        last_reload = state.current_epoch - state.current_epoch % reload_every if reload_every else 0
        while not loops.fit_done(self):
            if reload_every and state.current_epoch - last_reload >= reload_every and state.progress.batches_done_in_epoch == 0:
                val_loaders, last_reload = self.loaders.build_fit(module, train_dataloaders, val_dataloaders, reload=True), state.current_epoch
            with profile(self, "run_training_epoch"):
                loops.train_epoch(self, val_loaders)
            if preemption.due(self):
                preemption.checkpoint_and_exit(self)
        state.end_fit()
        self._dispatch.call("on_train_end")
        self._dispatch.call("on_fit_end")

    def init_module(self, empty_init: bool | None = None) -> AbstractContextManager[None]:
        """Build the model inside this block, where the strategy wants it (Lightning's ``Trainer.init_module``).

        Single device and DDP: on the device, in the dtype of a ``-true`` precision. FSDP2: on the meta device, so the
        fit shards the empty model and each process initializes only its shards (each submodule's
        ``reset_parameters()``; see docs/strategies.md). DeepSpeed ZeRO-3: partitioned as it is built.
        ``empty_init=False`` asks for a full real copy on every process, ``True`` for an empty one.
        """
        if self._accelerator is None:
            raise RuntimeError(
                f"trainer.init_module() needs the {self._args.devices} processes this Trainer asks for, which start at fit(); "
                "start the script with `trainer launch` or torchrun, or build the model in TrainModule.configure_model()"
            )
        context: AbstractContextManager[None] = self.accelerator.strategy.module_init_context(empty_init)
        return context

    def _restore(self, ckpt_path: str | None) -> None:
        path = resolve_ckpt_path(self, ckpt_path)
        if path is not None:
            restore_checkpoint(self, path)

    # ------------------------------------------------------------------------------------ evaluation
    def _evaluate(self, stage: str, dataloaders: Any, ckpt_path: str | None, keep_predictions: bool = True) -> Any:
        module = cast(TrainModule, self.lightning_module)  # _run attached it
        kind = {"validation": "val", "test": "test", "predict": "predict"}[stage]
        self.loaders.moves_batches = moves_batches_itself(self)
        loaders = [self.loaders.eval_loader(loader) for loader in loops.loader_from(module, kind, dataloaders, required=True, datamodule=self.datamodule)]
        name = f"limit_{kind}_batches"
        limits = [loops.limit_batches(loops.num_batches(loader), getattr(self._args, name), name) for loader in loaders]
        setattr(self, f"num_{kind}_batches", one_or_list(limits))
        if self.model_setup.prepared_for != id(module) and isinstance(self.accelerator.strategy, Engine):
            # before any fit: an engine set up now could not take the optimizers of a later fit, so evaluate the plain module
            self.model_setup.model = self.accelerator.strategy.setup_module(module, wrap=False)
        elif self.model_setup.prepared_for != id(module):
            self.model_setup.model, self.model_setup.prepared_for = self.model_setup.prepare(module), id(module)
        if ckpt_path is not None:
            self._load_weights(module, ckpt_path)
        return loops.eval_loop(self, stage, loaders, limits, keep_predictions=keep_predictions)

    def _load_weights(self, module: TrainModule, ckpt_path: str | os.PathLike[str]) -> None:
        """Load only the module weights of a checkpoint ("best", "last" or a directory) for evaluation."""
        path = resolve_ckpt_path(self, ckpt_path)
        if path is None:
            raise ValueError(f"ckpt_path={ckpt_path!r} found no checkpoint; fit first or pass a checkpoint directory")
        verify_checkpoint(path)
        strategy = self.accelerator.strategy
        load_weights(Path(path), module, device=strategy.device, load_full=strategy.load_module_state_dict)

    # ------------------------------------------------------------------------------------ run plumbing
    def _run(self, stage: str, module: TrainModule | None, body: Any, datamodule: DataModule | None = None) -> Any:
        if self._accelerator is None:
            raise RuntimeError(
                f"trainer.{stage}() cannot start the {self._args.devices} processes this Trainer asks for; call trainer.fit() "
                "first (it re-runs the script on every process), or start the script with `trainer launch` or torchrun"
            )
        module = self.model_setup.unwrap_compiled(module) if module is not None else self.lightning_module
        if not isinstance(module, TrainModule):
            raise TypeError(f"trainer.{stage}() needs a TrainModule, got {type(module).__name__}; subclass trainer.TrainModule")
        self._attach(module, stage)
        setup_stage = "fit" if stage == "fit" else stage
        self.agreement = self._new_agreement()
        if stage == "fit":  # SIGTERM/SIGUSR1 are recorded, then agreed on and answered by a checkpoint (trainer.fit.preemption)
            self.agreement.signals.install(keep_user_handlers=True, first_wins=True)
        self.datamodule = datamodule
        try:
            self.loaders.prepare_data(module, datamodule)
            if datamodule is not None:
                self.loaders.setup_datamodule(datamodule, setup_stage)
            self._dispatch.call("setup", setup_stage)
            self.model_setup.configure_model(module)
            try:
                result = body()
            except TunerExit:  # a Tuner's search ran in the run's start hook, and the run ends there (trainer.fit.search)
                result = None
            self.accelerator.checkpoints.wait()  # a checkpoint written in the background is committed before we return
        except BaseException as err:
            # the run failed: no preemption checkpoint will answer a signal now, so a launcher's SIGTERM while this
            # process waits below (for its background save, whose peers may be gone) ends it, as without a Trainer
            self.agreement.signals.restore()
            report_collective_failure(err)  # a hung rank named here too when no exception hook sees the error (Ray)
            self._dispatch.call_callbacks("on_exception", err)
            if datamodule is not None and callable(getattr(datamodule, "on_exception", None)):  # Lightning's order: the callbacks, then the datamodule
                datamodule.on_exception(err)
            self._finish_background_save(err)
            self._teardown(setup_stage)
            raise
        finally:
            self.agreement.signals.restore()
        self._teardown(setup_stage)
        return result

    def _finish_background_save(self, err: BaseException) -> None:
        """After a failure: let a checkpoint being written in the background finish (it was a consistent copy), without
        hiding `err` behind an error of that write, which is reported as a warning."""
        if self._accelerator is None:
            return
        try:
            self._accelerator.checkpoints.wait()
        except CheckpointSaveError as save_error:
            if save_error is not err:
                warnings.warn(str(save_error), stacklevel=2)

    def _teardown(self, stage: str) -> None:
        if self.datamodule is not None:  # Lightning's order: the datamodule, the callbacks, the module
            self.datamodule.teardown(stage)
        self._dispatch.call("teardown", stage)
        self._end_run()

    def _end_run(self) -> None:
        self.run_state.end()
        self.accelerator.sync_gradients = True

    def _new_agreement(self) -> LoopAgreement:
        acc = self._accelerator
        return LoopAgreement(world_size=self.world_size, interval=self._args.stop_check_interval,
                             reduce=acc.reduce if acc is not None else _no_reduce, device=acc.device if acc is not None else torch.device("cpu"))

    def _attach(self, module: TrainModule, stage: str) -> None:
        self.lightning_module = module
        self.run_state.begin(stage)
        module.trainer = self
        if stage == "fit" and not module.automatic_optimization and (self.accumulate_grad_batches != 1 or self.gradient_clip_val is not None):
            raise ValueError(
                "accumulate_grad_batches and gradient_clip_val do not apply to manual optimization "
                f"(got {self.accumulate_grad_batches}, {self.gradient_clip_val}); accumulate and clip in training_step "
                "(self.clip_gradients(opt, ...)) or use automatic optimization"
            )
        refuse_hooks_not_called(module)
        self.callbacks = with_module_callbacks(self.callbacks, module.configure_callbacks())
        self._results.reset()
        if self.profiler is not None:
            self._dispatch = ProfiledDispatcher(module, TrainModule, self.callbacks, self, self.profiler)
        else:
            self._dispatch = HookDispatcher(module, TrainModule, self.callbacks, self)

    @overload
    def run_tuner(self, finder: LearningRateFinder, module: TrainModule) -> LRFinder | None: ...
    @overload
    def run_tuner(self, finder: BatchSizeFinder, module: TrainModule) -> int | None: ...
    def run_tuner(self, finder: LearningRateFinder | BatchSizeFinder, module: TrainModule) -> LRFinder | int | None:
        """Run the search of a `LearningRateFinder` or `BatchSizeFinder` (called from its hook) on this run's loops,
        putting the run back as it was afterwards; returns what it found (see `trainer.fit.search`)."""
        return run_finder(self, finder, module)

    def manual_backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """``TrainModule.manual_backward``: backward between its hooks, as in automatic optimization (`batch.manual_backward`)."""
        batch.manual_backward(self, loss, **kwargs)

    def step_manual_optimizer(self, optimizer: ManualOptimizer, closure: Callable[[], Any] | None = None) -> None:
        """``opt.step(closure)`` in manual optimization, with its hooks and one more `global_step` (`batch.step_manual_optimizer`)."""
        batch.step_manual_optimizer(self, optimizer, closure)

def _barebones_log(name: str, *args: Any) -> None:
    """``self.log`` under ``Trainer(barebones=True)``: nothing is logged (Lightning's warning, once per name)."""
    warnings.warn(f"self.log({name!r}, ...) does nothing under Trainer(barebones=True): logging is turned off there", stacklevel=3)


def _no_reduce(tensor: torch.Tensor, op: str) -> torch.Tensor:
    raise RuntimeError("this Trainer has not started its processes; call trainer.fit() first")


if TYPE_CHECKING:
    def _satisfies_the_view(trainer: Trainer) -> ModuleTrainerView:
        return trainer  # mypy checks here that a Trainer has everything callbacks (TrainerView) and the module may use
