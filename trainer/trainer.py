"""`Trainer`: the Lightning-style face. It owns an `Accelerator` and drives the loop through it.

    trainer = Trainer(max_epochs=10, precision="bf16-mixed")
    trainer.fit(module, train_loader, val_loader)
    trainer.test(module, test_loader)

The loop (see `callbacks.events` for every event) reads top to bottom in `_fit`, `_train_epoch`,
`_train_batch` and `_eval_loop`. Preparation, backward, accumulation, clipping, gathering and
checkpoint I/O are the `Accelerator`'s; nothing here reimplements them.
"""

from __future__ import annotations

import contextlib
import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from callbacks.base import Callback
from trainer.dispatch import HookDispatcher, order_callbacks
from trainer.metrics_logging import ResultsStore
from trainer.module import LRSchedulerConfig, TrainModule, parse_optimizers

_MISSING = object()


class Trainer:
    """Runs a `TrainModule`: ``fit``, ``validate``, ``test`` and ``predict``.

    All arguments are keyword-only and checked here, before any work starts. When neither
    ``max_epochs`` nor ``max_steps`` is given, training stops after 1000 epochs (as in Lightning).

    Args:
        strategy: ``"auto"``, ``"single"`` or ``"ddp"``.
        devices: ``"auto"`` or the number of processes on this machine. ``strategy="ddp", devices=2`` in a plain
            ``python script.py`` re-runs the script on 2 processes when ``fit`` is called.
        precision: ``"32"``/``"no"``, ``"16-mixed"``/``"fp16"``, ``"bf16-mixed"``/``"bf16"`` (default: full precision,
            or ``TRAINWRIGHT_MIXED_PRECISION``).
        max_epochs, max_steps: when to stop (the first reached wins).
        accumulate_grad_batches: batches per optimizer step.
        gradient_clip_val, gradient_clip_algorithm: clip gradients (``"norm"`` or ``"value"``) before each step.
        callbacks: `Callback` objects, called in list order after the module's hooks.
        log_with: tracker name(s) (``"csv"``, ``"tensorboard"``, ...), tracker objects, or None.
        project_dir: where logs and checkpoints go.
        val_check_interval: validate every N training batches (int) or every fraction of an epoch (float).
        check_val_every_n_epoch: validate every N epochs.
        limit_train_batches, limit_val_batches, limit_test_batches, limit_predict_batches: batches per epoch
            (int) or a fraction of the loader (float).
        num_sanity_val_steps: validation batches run before training (-1: all).
        log_every_n_steps: write step values to the trackers every N optimizer steps.
        enable_progress_bar, enable_checkpointing, enable_model_summary: add the default callbacks.
        seed: seed python, numpy and torch on every process before the run.
        deterministic: use deterministic algorithms.
        process_group_timeout: seconds a collective may wait for a missing process.
    """

    def __init__(
        self,
        *,
        strategy: str | Any = "auto",
        devices: int | str = "auto",
        precision: str | int | None = None,
        max_epochs: int | None = None,
        max_steps: int | None = None,
        accumulate_grad_batches: int = 1,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str = "norm",
        callbacks: Sequence[Callback] | Callback | None = None,
        log_with: Any = "csv",
        project_dir: str | os.PathLike[str] = ".",
        val_check_interval: int | float | None = None,
        check_val_every_n_epoch: int = 1,
        limit_train_batches: int | float | None = None,
        limit_val_batches: int | float | None = None,
        limit_test_batches: int | float | None = None,
        limit_predict_batches: int | float | None = None,
        num_sanity_val_steps: int = 2,
        log_every_n_steps: int = 50,
        enable_progress_bar: bool = True,
        enable_checkpointing: bool = True,
        enable_model_summary: bool = True,
        seed: int | None = None,
        deterministic: bool = False,
        process_group_timeout: float | None = None,
    ) -> None:
        args = check_arguments(**{k: v for k, v in locals().items() if k not in ("self", "__class__")})
        self._args: TrainerArgs = args
        self.max_epochs, self.max_steps = args.max_epochs, args.max_steps
        self.gradient_clip_val, self.gradient_clip_algorithm = args.gradient_clip_val, args.gradient_clip_algorithm
        self.val_check_interval, self.check_val_every_n_epoch = args.val_check_interval, args.check_val_every_n_epoch
        self.num_sanity_val_steps, self.log_every_n_steps = args.num_sanity_val_steps, args.log_every_n_steps
        self.project_dir = str(Path(args.project_dir))
        self.fit_loop_state: dict[str, Any] = _new_loop_state()
        self.stage: str | None = None
        self.sanity_checking = False
        self.training = False
        self.optimizers: list[Any] = []
        self.lr_scheduler_configs: list[LRSchedulerConfig] = []
        self.num_training_batches = 0
        self.num_val_batches = 0
        self.num_test_batches = 0
        self.num_predict_batches = 0
        self.lightning_module: TrainModule | None = None
        self._model: Any = None
        self._prepared_for: int | None = None
        self._train_loader: Any = None
        self._dispatch: HookDispatcher | None = None
        if args.seed is not None:
            from trainer.utils import set_seed

            set_seed(args.seed, deterministic=args.deterministic)
        elif args.deterministic:
            torch.use_deterministic_algorithms(True)
        self.accelerator: Any = None if args.launch_processes else _build_accelerator(args)
        self.accumulate_grad_batches = self.accelerator.gradient_accumulation_steps if self.accelerator else args.accumulate_grad_batches
        self.callbacks: list[Callback] = order_callbacks(_default_callbacks(args))
        self._results = ResultsStore(
            device=self.accelerator.device if self.accelerator else torch.device("cpu"),
            reduce=lambda t, op: self.accelerator.reduce(t, op),
            gather_object=lambda obj: self.accelerator.gather_object(obj),
            world_size=self.world_size,
        )

    # ------------------------------------------------------------------------------------ attributes
    @property
    def module(self) -> TrainModule | None:
        """The user's module (unwrapped)."""
        return self.lightning_module

    @property
    def strategy(self) -> Any:
        return self.accelerator.strategy if self.accelerator else None

    @property
    def world_size(self) -> int:
        return self.accelerator.num_processes if self.accelerator else 1

    @property
    def global_rank(self) -> int:
        return self.accelerator.process_index if self.accelerator else 0

    @property
    def local_rank(self) -> int:
        return self.accelerator.local_process_index if self.accelerator else 0

    @property
    def is_global_zero(self) -> bool:
        return self.global_rank == 0

    @property
    def global_step(self) -> int:
        """Optimizer steps taken so far."""
        return int(self.fit_loop_state["global_step"])

    @property
    def current_epoch(self) -> int:
        return int(self.fit_loop_state["epoch"])

    @property
    def should_stop(self) -> bool:
        return bool(self.fit_loop_state["should_stop"])

    @should_stop.setter
    def should_stop(self, value: bool) -> None:
        self.fit_loop_state["should_stop"] = bool(value)

    @property
    def callback_metrics(self) -> dict[str, Any]:
        return self._results.callback_metrics

    @property
    def logged_metrics(self) -> dict[str, float]:
        return self._results.logged_metrics

    @property
    def progress_bar_metrics(self) -> dict[str, Any]:
        return self._results.progress_bar_metrics

    @property
    def checkpoint_callback(self) -> Any:
        """The first `ModelCheckpoint` callback, or None."""
        return next((cb for cb in self.callbacks if type(cb).__name__ == "ModelCheckpoint"), None)

    @property
    def log_dir(self) -> str:
        """The directory of the first file-based tracker's run (``<project_dir>/logs`` before it starts)."""
        for cb in self.callbacks:
            run_dir = getattr(cb, "run_dir", None)
            if run_dir is not None:
                return str(run_dir)
        return str(Path(self.project_dir) / "logs")

    @property
    def estimated_stepping_batches(self) -> int:
        """Optimizer steps the whole ``fit`` will take (from the train loader length, epochs and max_steps)."""
        per_epoch = math.ceil(self.num_training_batches / self.accumulate_grad_batches)
        epochs = self.max_epochs if self.max_epochs not in (None, -1) else None
        total = per_epoch * epochs if epochs is not None else math.inf
        if self.max_steps is not None:
            total = min(total, self.max_steps)
        return int(total) if total != math.inf else -1

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on the global main process only."""
        if self.is_global_zero:
            print(*args, **kwargs)

    def save_checkpoint(self, dirpath: str | os.PathLike[str]) -> Path:
        """Write a complete checkpoint directory, atomically. Every process must call it."""
        from trainer.checkpointing import save_checkpoint

        return save_checkpoint(self, dirpath)

    # ------------------------------------------------------------------------------------ entry points
    def fit(self, module: TrainModule, train_dataloaders: Any = None, val_dataloaders: Any = None, ckpt_path: str | None = None) -> None:
        """Train `module`, validating as configured; resume from `ckpt_path` ("last", "best" or a directory)."""
        if self.accelerator is None:
            _launch(self._args)
        self._run("fit", module, lambda: self._fit(module, train_dataloaders, val_dataloaders, ckpt_path))

    def validate(self, module: TrainModule | None = None, dataloaders: Any = None, ckpt_path: str | None = None) -> list[dict[str, float]]:
        """Run one validation epoch; returns ``[{metric: value}]`` of the epoch-level metrics."""
        return self._run("validate", module, lambda: self._evaluate("validation", dataloaders, ckpt_path))

    def test(self, module: TrainModule | None = None, dataloaders: Any = None, ckpt_path: str | None = None) -> list[dict[str, float]]:
        """Run one test epoch; returns ``[{metric: value}]`` of the epoch-level metrics."""
        return self._run("test", module, lambda: self._evaluate("test", dataloaders, ckpt_path))

    def predict(self, module: TrainModule | None = None, dataloaders: Any = None, ckpt_path: str | None = None) -> list[Any]:
        """Return ``predict_step``'s output for every batch, in dataset order, each sample once (all processes)."""
        return self._run("predict", module, lambda: self._evaluate("predict", dataloaders, ckpt_path))

    # ------------------------------------------------------------------------------------ run plumbing
    def _run(self, stage: str, module: TrainModule | None, body: Any) -> Any:
        if self.accelerator is None:
            raise RuntimeError(
                f"trainer.{stage}() cannot start the {self._args.devices} processes this Trainer asks for; call trainer.fit() "
                "first (it re-runs the script on every process), or start the script with `trainer launch` or torchrun"
            )
        module = module if module is not None else self.lightning_module
        if not isinstance(module, TrainModule):
            raise TypeError(f"trainer.{stage}() needs a TrainModule, got {type(module).__name__}; subclass trainer.TrainModule")
        self._attach(module, stage)
        setup_stage = "fit" if stage == "fit" else stage
        try:
            self._dispatch.call("setup", setup_stage)
            result = body()
        except BaseException as err:
            self._dispatch.call_callbacks("on_exception", err)
            self._dispatch.call("teardown", setup_stage)
            self._end_run()
            raise
        self._dispatch.call("teardown", setup_stage)
        self._end_run()
        return result

    def _end_run(self) -> None:
        self.stage, self.training, self.sanity_checking = None, False, False
        self.accelerator.sync_gradients = True

    def _attach(self, module: TrainModule, stage: str) -> None:
        self.lightning_module, self.stage = module, stage
        module.trainer = self
        if stage == "fit" and not module.automatic_optimization:
            if self.accumulate_grad_batches != 1 or self.gradient_clip_val is not None:
                raise ValueError(
                    "accumulate_grad_batches and gradient_clip_val do not apply to manual optimization "
                    f"(got {self.accumulate_grad_batches}, {self.gradient_clip_val}); accumulate and clip in training_step "
                    "(self.clip_gradients(opt, ...)) or use automatic optimization"
                )
        self._results.reset()
        self._dispatch = HookDispatcher(module, TrainModule, self.callbacks, self)

    def _prepare_model(self, module: TrainModule) -> None:
        """Prepare the module (device, DDP, autocast) once per module."""
        if self._prepared_for != id(module):
            self._model = self.accelerator.prepare(module)
            self._prepared_for = id(module)

    def _restore(self, ckpt_path: str | None) -> None:
        from trainer.checkpointing import resolve_ckpt_path, restore_checkpoint

        path = resolve_ckpt_path(self, ckpt_path)
        if path is not None:
            restore_checkpoint(self, path)

    # ------------------------------------------------------------------------------------ fit
    def _fit(self, module: TrainModule, train_dataloaders: Any, val_dataloaders: Any, ckpt_path: str | None) -> None:
        self.fit_loop_state.clear()
        self.fit_loop_state.update(_new_loop_state())
        self._train_loader = self.accelerator.prepare(_loader_from(module, "train", train_dataloaders, required=True))
        self.num_training_batches = _limit(len(self._train_loader), self._args.limit_train_batches)
        val = _loader_from(module, "val", val_dataloaders, required=False) if _overrides(module, "validation_step") else None
        if val_dataloaders is not None and val is None:
            warnings.warn(f"val_dataloaders were passed but {type(module).__name__} has no validation_step; validation is skipped", stacklevel=3)
        if val is not None and _limit(len(val), self._args.limit_val_batches) == 0:
            val = None  # decided from the unsharded loader, so every process agrees (a process may hold no batch)
        val_loader = self._eval_loader(val) if val is not None else None
        self.num_val_batches = _limit(len(val_loader), self._args.limit_val_batches) if val_loader is not None else 0
        self._configure_optimizers(module)
        self._restore(ckpt_path)
        self._dispatch.call("on_fit_start")
        if val_loader is not None and self.num_sanity_val_steps != 0 and self.global_step == 0:
            self._sanity_check(val_loader)
        self.training = True
        self._dispatch.call("on_train_start")
        while not self._fit_done():
            self._train_epoch(val_loader)
        self.training = False
        self._dispatch.call("on_train_end")
        self._dispatch.call("on_fit_end")

    def _max_steps_reached(self) -> bool:
        return self.max_steps is not None and self.global_step >= self.max_steps

    def _fit_done(self) -> bool:
        if self.should_stop or self._max_steps_reached():
            return True
        return self.max_epochs not in (None, -1) and self.current_epoch >= self.max_epochs

    def _configure_optimizers(self, module: TrainModule) -> None:
        optimizers, configs = parse_optimizers(module.configure_optimizers())
        if module.automatic_optimization and len(optimizers) != 1:
            raise ValueError(
                f"automatic optimization needs exactly one optimizer, configure_optimizers returned {len(optimizers)}; "
                "set self.automatic_optimization = False and step them in training_step (see docs/trainer.md)"
            )
        if self._prepared_for == id(module):
            prepared = (self._model, *(self.accelerator.prepare_optimizer(o) for o in optimizers))
        else:
            prepared = self.accelerator.prepare(module, *optimizers) if optimizers else (self.accelerator.prepare(module),)
        self._model, self.optimizers, self._prepared_for = prepared[0], list(prepared[1:]), id(module)
        for config in configs:  # prepared so that checkpoints hold their state; stepped by the loop itself
            self.accelerator.prepare_scheduler(config.scheduler)
        self.lr_scheduler_configs = configs

    def _sanity_check(self, val_loader: Any) -> None:
        saved = [dict(d) for d in (self.callback_metrics, self.logged_metrics, self.progress_bar_metrics)]
        self.sanity_checking = True
        self._dispatch.call("on_sanity_check_start")
        steps = self.num_val_batches if self.num_sanity_val_steps == -1 else min(self.num_sanity_val_steps, self.num_val_batches)
        self._eval_loop("validation", val_loader, steps)
        self._dispatch.call("on_sanity_check_end")
        self.sanity_checking = False
        for target, values in zip((self.callback_metrics, self.logged_metrics, self.progress_bar_metrics), saved):
            target.clear()
            target.update(values)

    def _train_epoch(self, val_loader: Any) -> None:
        state, module = self.fit_loop_state, self.lightning_module
        if 0 < self.num_training_batches <= state["batches_done_in_epoch"]:
            return self._next_epoch(update_plateau=False)  # restored from a checkpoint written at the end of an epoch
        start = state["batches_done_in_epoch"]
        batches = self._train_batches(start)
        module.train()
        self._results.set_context("train", False)
        self._dispatch.call("on_train_epoch_start")
        for batch_idx in range(start, self.num_training_batches):
            batch = next(batches, _MISSING)
            if batch is _MISSING or not self._train_batch(batch, batch_idx):
                break
            if val_loader is not None and self._validation_due(batch_idx):
                self._eval_loop("validation", val_loader, self.num_val_batches)
                module.train()
            if self._max_steps_reached():
                break
        self._results.set_context("train", False)
        self._dispatch.call_module("on_train_epoch_end")
        _, logged = self._results.reduce_epoch("train")
        self._dispatch.call_callbacks("on_train_epoch_end")
        self._log_metrics(logged)
        cut_by_max_steps = state["batches_done_in_epoch"] < self.num_training_batches and self._max_steps_reached()
        if not cut_by_max_steps:  # an epoch cut short by max_steps stays open, so a resume continues it
            self._next_epoch(update_plateau=True)

    def _train_batches(self, start: int) -> Any:
        """An iterator over this epoch's training batches, starting after the `start` already done (resume)."""
        loader = self._train_loader
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(self.current_epoch)
        if start:  # resuming mid-epoch: skip at the batch-sampler level, no skipped sample is loaded
            loader = self.accelerator.skip_first_batches(loader, start)
        return iter(loader)

    def _next_epoch(self, *, update_plateau: bool) -> None:
        self._step_schedulers("epoch", update_plateau=update_plateau)
        state = self.fit_loop_state
        state["epoch"] += 1
        state["batches_done_in_epoch"] = 0
        self._agree_flags(False)  # every process learns whether one of them asked to stop

    def _validation_due(self, batch_idx: int) -> bool:
        if (self.current_epoch + 1) % self.check_val_every_n_epoch:
            return False
        interval = self.val_check_interval
        if isinstance(interval, float):
            interval = max(1, int(self.num_training_batches * interval))
        last = batch_idx + 1 == self.num_training_batches
        if interval is None or interval >= self.num_training_batches:
            return last
        return (batch_idx + 1) % interval == 0

    def _train_batch(self, batch: Any, batch_idx: int) -> bool:
        """Run one training batch; return False (having done nothing) when the processes agreed to stop."""
        state, acc, module = self.fit_loop_state, self.accelerator, self.lightning_module
        self._results.set_batch(batch)
        self._results.set_context("train", True)
        steps_before = state["global_step"]
        self._dispatch.call("on_train_batch_start", batch, batch_idx)
        if not module.automatic_optimization:
            acc.sync_gradients = True
            with acc.autocast():
                output = module.training_step(batch, batch_idx)
            stop = self._agree_flags(False)[1]
        else:
            boundary = state["accumulation_position"] + 1 >= self.accumulate_grad_batches or batch_idx + 1 >= self.num_training_batches
            acc.sync_gradients = boundary
            with contextlib.nullcontext() if boundary else acc.no_sync(self._model):
                with acc.autocast():
                    output = self._call_through_model("training_step", batch, batch_idx)
                loss = _loss_of(output)
                skip, stop = self._agree_flags(loss is None)
                if stop:
                    return False
                if not skip:
                    self._dispatch.call("on_before_backward", loss)
                    acc.backward(loss)
                    self._dispatch.call("on_after_backward")
                    state["accumulated"] += 1
            state["accumulation_position"] = 0 if boundary else state["accumulation_position"] + 1
            if boundary and state["accumulated"]:
                self._optimizer_step()
        state["batches_done_in_epoch"] = batch_idx + 1
        self._dispatch.call("on_train_batch_end", _detached(output), batch, batch_idx)
        stepped = state["global_step"] != steps_before
        if stepped and state["global_step"] % self.log_every_n_steps == 0:
            self._log_metrics(self._results.flush_step())
        return not stop

    def _optimizer_step(self) -> None:
        acc, optimizer = self.accelerator, self.optimizers[0]
        acc.unscale_gradients(optimizer)
        self._dispatch.call("on_before_optimizer_step", optimizer)
        if self.gradient_clip_val:
            params = [p for group in optimizer.param_groups for p in group["params"]]
            if self.gradient_clip_algorithm == "norm":
                acc.clip_grad_norm_(params, self.gradient_clip_val)
            else:
                acc.clip_grad_value_(params, self.gradient_clip_val)
        optimizer.step()
        self.fit_loop_state["global_step"] += 1
        self.fit_loop_state["accumulated"] = 0
        self._dispatch.call("on_before_zero_grad", optimizer)
        optimizer.zero_grad()
        if not acc.optimizer_step_was_skipped:
            self._step_schedulers("step", update_plateau=True)

    def _step_schedulers(self, interval: str, *, update_plateau: bool) -> None:
        count = self.global_step if interval == "step" else self.current_epoch + 1
        for config in self.lr_scheduler_configs:
            if config.interval != interval or count % config.frequency or not self.lightning_module.automatic_optimization:
                continue
            metric = None
            if config.monitor is not None:
                if not update_plateau:
                    continue
                metric = self.callback_metrics.get(config.monitor)
                if metric is None:
                    if config.strict:
                        raise RuntimeError(
                            f"the lr scheduler monitors {config.monitor!r}, which was not logged; logged: {sorted(self.callback_metrics)}. "
                            "self.log it (e.g. in validation_step), or pass 'strict': False to skip the step when it is missing"
                        )
                    continue
                metric = float(metric)
            self.lightning_module.lr_scheduler_step(config.scheduler, metric)

    def _agree_flags(self, skip: bool) -> tuple[bool, bool]:
        """Make every process agree on (skip this batch, stop now): true if any process says so."""
        stop = self.should_stop
        if self.world_size > 1:
            flags = self.accelerator.reduce(torch.tensor([float(skip), float(stop)], device=self.accelerator.device), "max")
            skip, stop = (bool(v) for v in flags.tolist())
            self.should_stop = stop
        return skip, stop

    def _call_through_model(self, method: str, *args: Any) -> Any:
        """Call ``module.<method>(*args)`` through the prepared (e.g. DDP) wrapper's forward, so it syncs gradients."""
        module, wrapped = self.lightning_module, self._model
        step = getattr(module, method)
        if wrapped is module:
            return step(*args)
        saved = module.__dict__.get("forward", _MISSING)

        def restore() -> None:
            if saved is _MISSING:
                module.__dict__.pop("forward", None)
            else:
                module.__dict__["forward"] = saved

        def redirect(*inner: Any, **kwargs: Any) -> Any:
            restore()  # the step's own self(x) calls reach the real forward
            return step(*inner, **kwargs)

        module.__dict__["forward"] = redirect
        try:
            return wrapped(*args)
        finally:
            restore()

    def _manual_backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        """Backward for manual optimization: the step ran outside DDP's forward, so arm its gradient sync first."""
        model = self._model
        if isinstance(model, torch.nn.parallel.DistributedDataParallel) and torch.is_grad_enabled() and model.require_backward_grad_sync:
            from torch.nn.parallel.distributed import _find_tensors

            model.require_forward_param_sync = True
            used = list(_find_tensors(loss)) if model.find_unused_parameters and not model.static_graph else []
            model.reducer._rebuild_buckets()
            model.reducer.prepare_for_backward(used)
        self.accelerator.backward(loss, **kwargs)

    def _log_metrics(self, metrics: dict[str, float]) -> None:
        if metrics and not self.sanity_checking:
            self._dispatch.call_callbacks("on_log_metrics", {**metrics, "epoch": self.current_epoch}, self.global_step)

    # ------------------------------------------------------------------------------------ evaluation
    def _eval_loader(self, loader: Any) -> Any:
        """Shard an evaluation loader without padding: every sample is seen exactly once across processes."""
        from strategies.data import prepare_data_loader

        acc = self.accelerator
        return prepare_data_loader(
            loader,
            device=acc.device,
            num_processes=acc.num_processes,
            process_index=acc.process_index,
            split_batches=acc.split_batches,
            even_batches=False,
            put_on_device=acc.device_placement,
            non_blocking=acc.dataloader_config.non_blocking,
            seed=0,
        )

    def _evaluate(self, stage: str, dataloaders: Any, ckpt_path: str | None) -> Any:
        module = self.lightning_module
        kind = {"validation": "val", "test": "test", "predict": "predict"}[stage]
        loader = self._eval_loader(_loader_from(module, kind, dataloaders, required=True))
        limit = _limit(len(loader), getattr(self._args, f"limit_{kind}_batches"))
        setattr(self, f"num_{kind}_batches", limit)
        if self._prepared_for != id(module):
            self._model, self._prepared_for = self.accelerator.prepare(module), id(module)
        if ckpt_path is not None:
            self._load_weights(ckpt_path)
        return self._eval_loop(stage, loader, limit)

    def _load_weights(self, ckpt_path: str | os.PathLike[str]) -> None:
        """Load only the module weights of a checkpoint ("best", "last" or a directory) for evaluation."""
        from safetensors.torch import load_file

        from trainer.checkpointing import resolve_ckpt_path, verify_checkpoint

        path = resolve_ckpt_path(self, ckpt_path)
        if path is None:
            raise ValueError(f"ckpt_path={ckpt_path!r} found no checkpoint; fit first or pass a checkpoint directory")
        verify_checkpoint(path)
        state = load_file(str(Path(path) / "model.safetensors"), device=str(self.accelerator.device))
        self.lightning_module.load_state_dict(state)

    def _eval_loop(self, stage: str, loader: Any, limit: int) -> Any:
        """Run one epoch of `stage` ("validation", "test" or "predict") over at most `limit` batches."""
        module, call = self.lightning_module, self._dispatch.call
        step = getattr(module, f"{stage}_step")
        module.eval()
        was_training, self.training = self.training, False
        self._results.set_context(stage, False)
        self._results.enabled = stage != "predict"
        predictions: list[tuple[int, int, Any]] = []
        with torch.no_grad():
            call(f"on_{stage}_start")
            call(f"on_{stage}_epoch_start")
            batches = iter(loader)
            for batch_idx in range(limit):
                batch = next(batches, _MISSING)
                if batch is _MISSING:
                    break
                self._results.set_batch(batch)
                call(f"on_{stage}_batch_start", batch, batch_idx)
                with self.accelerator.autocast():
                    output = step(batch, batch_idx)
                if stage == "predict":
                    predictions.append((batch_idx, self.global_rank, _to_cpu(output)))
                call(f"on_{stage}_batch_end", output, batch, batch_idx)
            self._dispatch.call_module(f"on_{stage}_epoch_end")
            metrics, logged = self._results.reduce_epoch(stage) if stage != "predict" else ({}, {})
            self._dispatch.call_callbacks(f"on_{stage}_epoch_end")
            self._log_metrics(logged)
            call(f"on_{stage}_end")
        self._results.enabled, self.training = True, was_training
        if stage == "predict":
            return self._ordered_predictions(predictions)
        return [metrics]

    def _ordered_predictions(self, local: list[tuple[int, int, Any]]) -> list[Any]:
        """Predictions of every process in dataset order (batches are dealt round-robin to processes)."""
        if self.world_size > 1:
            local = self.accelerator.gather_object(local)
        return [output for _, _, output in sorted(local, key=lambda item: (item[0], item[1]))]


# ---------------------------------------------------------------------------------------- arguments
_STRATEGIES = ("auto", "single", "ddp")
_PRECISIONS = ("32", "16-mixed", "bf16-mixed", "no", "fp16", "bf16")


@dataclass(frozen=True)
class TrainerArgs:
    """The checked constructor arguments of a `Trainer`."""

    strategy: Any
    devices: Any
    precision: str | None
    max_epochs: int | None
    max_steps: int | None
    accumulate_grad_batches: int
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


def check_arguments(**kw: Any) -> TrainerArgs:
    """Check every `Trainer` argument; raise ``ValueError``/``TypeError`` naming the bad value and the fix."""
    from strategies.base import Strategy

    strategy = kw["strategy"]
    if not isinstance(strategy, Strategy) and strategy not in _STRATEGIES:
        raise ValueError(f"strategy={strategy!r} is not supported by the Trainer; choose one of {', '.join(map(repr, _STRATEGIES))} or pass a Strategy")
    devices = kw["devices"]
    if devices != "auto" and not (_is_int(devices) and devices >= 1):
        raise ValueError(f"devices={devices!r} must be 'auto' or a positive int (the number of processes on this machine)")
    if strategy == "single" and _is_int(devices) and devices > 1:
        raise ValueError(f"strategy='single' runs one process but devices={devices}; use strategy='ddp' or devices=1")
    precision = kw["precision"]
    if precision is not None:
        precision = str(precision)
        if precision not in _PRECISIONS:
            raise ValueError(f"precision={kw['precision']!r} is not supported; choose one of {', '.join(map(repr, _PRECISIONS))}")
    if kw["max_epochs"] not in (None, -1):
        _check_int("max_epochs", kw["max_epochs"], 1, hint=", -1 (no epoch limit, with max_steps) or None")
    max_steps = None if kw["max_steps"] == -1 else kw["max_steps"]
    _check_int("max_steps", max_steps, 1, allow_none=True)
    max_epochs = kw["max_epochs"]
    if max_epochs == -1 and max_steps is None:
        raise ValueError("max_epochs=-1 (no epoch limit) needs max_steps; set max_steps=... or a positive max_epochs")
    if max_epochs is None and max_steps is None:
        max_epochs = 1000
    _check_int("accumulate_grad_batches", kw["accumulate_grad_batches"], 1)
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
    if not isinstance(kw["project_dir"], (str, os.PathLike)):
        raise TypeError(f"project_dir={kw['project_dir']!r} must be a path (str or os.PathLike)")
    values = {**kw, "precision": precision, "max_epochs": max_epochs, "max_steps": max_steps, "callbacks": callbacks,
              "gradient_clip_val": clip or None, "project_dir": os.fspath(kw["project_dir"])}
    return TrainerArgs(**values, launch_processes=_needs_launch(strategy, devices))


def _needs_launch(strategy: Any, devices: Any) -> bool:
    """True when this plain process must start `devices` processes itself (from ``fit``)."""
    from strategies.environment import detect_environment

    cluster = detect_environment()
    if cluster.is_distributed:
        if _is_int(devices) and devices != cluster.local_world_size:
            raise ValueError(
                f"devices={devices} but the launcher started {cluster.local_world_size} processes on this machine "
                f"({cluster.source}); pass devices={cluster.local_world_size} or devices='auto'"
            )
        return False
    return _is_int(devices) and devices > 1 and strategy in ("auto", "ddp")


# ---------------------------------------------------------------------------------------- small helpers
def _new_loop_state() -> dict[str, Any]:
    return {"epoch": 0, "global_step": 0, "batches_done_in_epoch": 0, "accumulation_position": 0, "accumulated": 0, "should_stop": False}


def _limit(num_batches: int, limit: int | float | None) -> int:
    """Batches to run per epoch: all, at most `limit` (int), or a fraction of them (float)."""
    if limit is None:
        return num_batches
    if isinstance(limit, float):
        return max(1, int(num_batches * limit)) if limit > 0 and num_batches else 0
    return min(num_batches, limit)


def _overrides(module: TrainModule, name: str) -> bool:
    return getattr(type(module), name, None) is not getattr(TrainModule, name, None)


def _loss_of(output: Any) -> torch.Tensor | None:
    if output is None or isinstance(output, torch.Tensor):
        return output
    if isinstance(output, dict) and "loss" in output:
        return output["loss"]
    raise TypeError(
        f"training_step returned {type(output).__name__}; return the loss tensor, a dict with a 'loss' key, or None to skip the batch"
    )


def _detached(output: Any) -> Any:
    if isinstance(output, torch.Tensor):
        return output.detach()
    if isinstance(output, dict) and isinstance(output.get("loss"), torch.Tensor):
        return {**output, "loss": output["loss"].detach()}
    return output


def _to_cpu(output: Any) -> Any:
    from strategies.collectives import apply_to_tensors

    return apply_to_tensors(lambda t: t.detach().cpu(), output)


def _loader_from(module: TrainModule, kind: str, given: Any, *, required: bool) -> Any:
    """The loader passed to the entry point, else the module's ``<kind>_dataloader()``."""
    if given is None:
        method = getattr(module, f"{kind}_dataloader", None)
        given = method() if callable(method) else None
    if isinstance(given, (list, tuple)):
        if len(given) != 1:
            raise ValueError(f"one {kind} dataloader is supported, got {len(given)}; pass a single DataLoader")
        given = given[0]
    if given is None:
        if required:
            raise ValueError(f"no {kind} dataloader: pass one to the Trainer method, or define {kind}_dataloader() on {type(module).__name__}")
        return None
    if not isinstance(given, torch.utils.data.DataLoader):
        raise TypeError(f"the {kind} dataloader must be a torch.utils.data.DataLoader, got {type(given).__name__}")
    return given


def _build_accelerator(args: TrainerArgs) -> Any:
    from trainer.accelerator import Accelerator

    return Accelerator(
        mixed_precision=args.precision,
        gradient_accumulation_steps=None if args.accumulate_grad_batches == 1 else args.accumulate_grad_batches,
        strategy=None if args.strategy == "auto" else args.strategy,
        project_dir=args.project_dir,
        step_scheduler_with_optimizer=False,
        process_group_timeout=args.process_group_timeout,
    )


def _default_callbacks(args: TrainerArgs) -> list[Callback]:
    callbacks = list(args.callbacks)
    names = {type(cb).__name__ for cb in callbacks}
    if args.enable_progress_bar and not any("ProgressBar" in n for n in names):
        from callbacks.progress import ProgressBar

        callbacks.append(ProgressBar())
    if args.enable_model_summary and "ModelSummary" not in names:
        from callbacks.summary import ModelSummary

        callbacks.append(ModelSummary())
    if args.enable_checkpointing and "ModelCheckpoint" not in names:
        from callbacks.checkpoint import ModelCheckpoint

        callbacks.append(ModelCheckpoint())
    if args.log_with:
        from callbacks.trackers import resolve_trackers

        callbacks.extend(resolve_trackers(args.log_with, project_dir=args.project_dir))
    return callbacks


def _launch(args: TrainerArgs) -> None:
    from trainer.launchers import launch_current_script

    settings: dict[str, Any] = {"strategy": "ddp"}
    if args.precision is not None:
        settings["mixed_precision"] = args.precision
    launch_current_script(int(args.devices), **settings)
