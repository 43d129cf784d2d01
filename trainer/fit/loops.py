"""The `Trainer`'s loops, as plain functions of the trainer.

    fit:        sanity_check(trainer, val)        # a few validation batches before training
                while not fit_done(trainer):
                    train_epoch(trainer, val)     # -> train_batch -> optimizer_step, eval_loop when due
    validate/test/predict:
                eval_loop(trainer, stage, loader, limit)

The loop position lives in ``trainer.fit_loop_state`` (saved in checkpoints, so a resume continues
mid-epoch). Preparation, backward, accumulation, clipping and gathering are the `Accelerator`'s; calling a step
through the wrapped model's forward is the strategy's (`Strategy.call_through`).
"""

from __future__ import annotations

import contextlib
import warnings
from typing import TYPE_CHECKING, Any

import torch

from trainer.fit import preemption
from trainer.fit.module import TrainModule
from trainer.fit.profiler import profile
from trainer.fit.transfer import moves_batches_itself, transfer_batch

if TYPE_CHECKING:
    from trainer.fit.trainer import Trainer

_MISSING = object()


# ---------------------------------------------------------------------------------------- fit
def new_loop_state() -> dict[str, Any]:
    """The loop position of a fit that has not started."""
    return {
        "epoch": 0, "global_step": 0, "batches_that_stepped": 0, "stepping_batch_open": False, "batches_done_in_epoch": 0,
        "accumulation_position": 0, "accumulated": 0, "should_stop": False, "validation_pending": False,
    }


def max_steps_reached(trainer: Trainer) -> bool:
    """True once ``max_steps`` optimizer steps were taken."""
    return trainer.max_steps is not None and trainer.global_step >= trainer.max_steps


def fit_done(trainer: Trainer) -> bool:
    """True when training should stop: asked to, ``max_steps`` reached or ``max_epochs`` done."""
    if trainer.should_stop or max_steps_reached(trainer):
        return True
    return trainer.max_epochs not in (None, -1) and trainer.current_epoch >= trainer.max_epochs


def sanity_check(trainer: Trainer, val_loaders: list[Any]) -> None:
    """Run ``num_sanity_val_steps`` validation batches; the metrics they log are dropped afterwards."""
    stores = (trainer.callback_metrics, trainer.logged_metrics, trainer.progress_bar_metrics)
    saved = [dict(d) for d in stores]
    trainer.sanity_checking = True
    trainer._dispatch.call("on_sanity_check_start")
    limits = trainer._val_limits
    steps = limits if trainer.num_sanity_val_steps == -1 else [min(trainer.num_sanity_val_steps, n) for n in limits]
    eval_loop(trainer, "validation", val_loaders, steps)
    trainer._dispatch.call("on_sanity_check_end")
    trainer.sanity_checking = False
    for target, values in zip(stores, saved):
        target.clear()
        target.update(values)


def train_epoch(trainer: Trainer, val_loaders: list[Any] | None) -> None:
    """Run (the rest of) one training epoch, validating when due."""
    state, module, results = trainer.fit_loop_state, trainer.attached_module, trainer._results
    # a checkpoint written at a batch's end comes before the validation due after that batch: run it first
    pending = state.get("validation_pending", False) and bool(val_loaders)
    if 0 < trainer.num_training_batches <= state["batches_done_in_epoch"]:  # restored from the end of an epoch
        if pending:
            _validate(trainer, val_loaders)
        _close_stepping_batch(state)
        return _next_epoch(trainer, update_plateau=False)
    start = state["batches_done_in_epoch"]
    batches = _train_batches(trainer, start)
    module.train()
    results.set_context("train", False)
    trainer._dispatch.call("on_train_epoch_start")
    if pending:
        _validate(trainer, val_loaders)
    _close_stepping_batch(state)
    for batch_idx in range(start, trainer.num_training_batches):
        with profile(trainer, "train_dataloader_next"):
            batch = next(batches, _MISSING)
        if batch is _MISSING:
            break
        state["validation_pending"] = bool(val_loaders) and _validation_due(trainer, batch_idx)  # saved by checkpoints
        go_on = train_batch(trainer, batch, batch_idx)
        if go_on and state["validation_pending"]:
            _validate(trainer, val_loaders)
        state["validation_pending"] = False
        _close_stepping_batch(state)  # a boundary batch counts once its validation logged at its step
        if not go_on or max_steps_reached(trainer):
            break
        if preemption.due(trainer) and batch_idx + 1 < trainer.num_training_batches:  # at the epoch's end: after it
            preemption.checkpoint_and_exit(trainer)
    _, logged = _end_of_epoch(trainer, "train")
    trainer._send_to_trackers(logged, max(trainer.logging_step - 1, 0))  # at the epoch's last step, as its last step values
    cut_by_max_steps = state["batches_done_in_epoch"] < trainer.num_training_batches and max_steps_reached(trainer)
    if not cut_by_max_steps:  # an epoch cut short by max_steps stays open, so a resume continues it
        _next_epoch(trainer, update_plateau=True)
    return None


def _validate(trainer: Trainer, val_loaders: list[Any] | None) -> None:
    trainer.fit_loop_state["validation_pending"] = False  # a checkpoint written during the validation is past it
    with profile(trainer, "validation"):
        eval_loop(trainer, "validation", val_loaders or [], trainer._val_limits)
    trainer.attached_module.train()


def _close_stepping_batch(state: dict[str, Any]) -> None:
    if state["stepping_batch_open"]:
        state["batches_that_stepped"] += 1
        state["stepping_batch_open"] = False


def _end_of_epoch(trainer: Trainer, stage: str) -> tuple[dict[str, float], dict[str, float]]:
    """``on_<stage>_epoch_end`` in Lightning's order, with the epoch values computed around it.

    Returns ``(the epoch values, the ones for the trackers)``.

    The epoch values of what the steps logged are computed first, so every epoch-end hook sees them; then the
    callbacks run and the module's hook; the values those hooks logged are computed last. At the end of a
    training epoch the callbacks that monitor a metric (checkpointing, early stopping) run after the module's
    hook and that last computation, so they see what the module logged there; the other callbacks run before it.
    """
    results, dispatch, event = trainer._results, trainer._dispatch, f"on_{stage}_epoch_end"
    results.set_context(stage, False)
    metrics, logged = results.reduce_epoch(stage)
    results.set_context(stage, False, epoch_end=True)
    dispatch.call_callbacks(event, monitoring=False if stage == "train" else None)
    dispatch.call_module(event)
    more_metrics, more_logged = results.reduce_epoch(stage, epoch_end=True)
    if stage == "train":
        dispatch.call_callbacks(event, monitoring=True)
    results.set_context(stage, False)
    return {**metrics, **more_metrics}, {**logged, **more_logged}


def _train_batches(trainer: Trainer, start: int) -> Any:
    """An iterator over this epoch's training batches, starting after the `start` already done (resume)."""
    loader = trainer._train_loader
    if hasattr(loader, "set_epoch"):
        loader.set_epoch(trainer.current_epoch)
    if start:  # resuming mid-epoch: skip at the batch-sampler level, no skipped sample is loaded
        loader = trainer.accelerator.skip_first_batches(loader, start)
    return iter(loader)


def _next_epoch(trainer: Trainer, *, update_plateau: bool) -> None:
    step_schedulers(trainer, "epoch", update_plateau=update_plateau)
    state = trainer.fit_loop_state
    state["epoch"] += 1
    state["batches_done_in_epoch"] = 0
    agree_flags(trainer, False)  # every process learns whether one of them asked to stop


def _validation_due(trainer: Trainer, batch_idx: int) -> bool:
    if (trainer.current_epoch + 1) % trainer.check_val_every_n_epoch:
        return False
    interval = trainer.val_check_interval
    if isinstance(interval, float):
        interval = max(1, int(trainer.num_training_batches * interval))
    last = batch_idx + 1 == trainer.num_training_batches
    if interval is None or interval >= trainer.num_training_batches:
        return last
    return (batch_idx + 1) % interval == 0


def train_batch(trainer: Trainer, batch: Any, batch_idx: int) -> bool:
    """Run one training batch; return False (having done nothing) when the processes agreed to stop."""
    state, acc, module = trainer.fit_loop_state, trainer.accelerator, trainer.attached_module
    if trainer._moves_batches:
        batch = transfer_batch(trainer, batch, 0)
    trainer._results.set_batch(batch)
    trainer._results.set_context("train", True)
    trainer._dispatch.call("on_train_batch_start", batch, batch_idx)
    if not module.automatic_optimization:
        acc.sync_gradients = True
        with acc.strategy.precision.forward_context(), profile(trainer, "training_step"):
            output = module.training_step(batch, batch_idx)
        stop = agree_flags(trainer, False)[1]
    else:
        boundary = state["accumulation_position"] + 1 >= trainer.accumulate_grad_batches or batch_idx + 1 >= trainer.num_training_batches
        acc.sync_gradients = boundary
        with contextlib.nullcontext() if boundary else acc.no_sync(trainer._model):
            with acc.strategy.precision.forward_context(), profile(trainer, "training_step"):
                output = acc.strategy.call_through(trainer._model, module, "training_step", batch, batch_idx)
            loss = _loss_of(output)
            check = trainer._args.on_nonfinite is not None and loss is not None
            nonfinite = check and not bool(torch.isfinite(loss.detach()).all())  # type: ignore[union-attr]
            skip, stop = agree_flags(trainer, loss is None or nonfinite, nonfinite)
            if stop:
                return False
            if check and trainer.agreed_nonfinite:
                _on_nonfinite(trainer, loss, batch_idx)
            if skip and loss is None and not trainer._warned_skip:
                trainer._warned_skip = True
                warnings.warn(
                    f"training_step returned None for batch {batch_idx} (on at least one process), so every process skipped "
                    "it: no backward, no optimizer step. Return the loss to train on it; this warning is shown once per fit",
                    stacklevel=2,
                )
            if state["accumulation_position"] == 0:  # Lightning's place: the window's first batch, after training_step
                _zero_grad(trainer)
            if not skip:
                trainer._dispatch.call("on_before_backward", loss)
                with profile(trainer, "backward"):
                    acc.backward(loss)
                trainer._dispatch.call("on_after_backward")
                state["accumulated"] += 1
        state["accumulation_position"] = 0 if boundary else state["accumulation_position"] + 1
        if boundary and state["accumulated"]:
            with profile(trainer, "optimizer_step"):
                optimizer_step(trainer)
    state["batches_done_in_epoch"] = batch_idx + 1
    # a boundary batch (every batch in manual optimization); a checkpoint written before it is counted counts it
    state["stepping_batch_open"] = boundary = state["accumulation_position"] == 0
    trainer._dispatch.call("on_train_batch_end", _detached(output), batch, batch_idx)
    if boundary and (trainer.logging_step + 1) % trainer.log_every_n_steps == 0:
        trainer._send_to_trackers(trainer._results.flush_step(), trainer.logging_step)
    return not stop


def optimizer_step(trainer: Trainer) -> None:
    """Unscale, clip and step the (single, automatic-optimization) optimizer, then step the schedulers.

    Its gradients are zeroed on the next window's first batch (`_zero_grad`), where Lightning zeroes them.
    """
    acc, optimizer = trainer.accelerator, trainer.optimizers[0]
    acc.unscale_gradients(optimizer)
    trainer._dispatch.call("on_before_optimizer_step", optimizer)
    if trainer.gradient_clip_val:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if trainer.gradient_clip_algorithm == "norm":
            acc.clip_grad_norm_(params, trainer.gradient_clip_val)
        else:
            acc.clip_grad_value_(params, trainer.gradient_clip_val)
    optimizer.step()
    trainer.fit_loop_state["global_step"] += 1
    trainer.fit_loop_state["accumulated"] = 0
    if trainer.lr_scheduler_configs and not acc.optimizer_step_was_skipped:
        step_schedulers(trainer, "step", update_plateau=True)


def _zero_grad(trainer: Trainer) -> None:
    """``on_before_zero_grad`` (it sees the gradients of the previous step), then zero them before this window's backward."""
    optimizer = trainer.optimizers[0]
    trainer._dispatch.call("on_before_zero_grad", optimizer)
    getattr(optimizer, "optimizer", optimizer).zero_grad(set_to_none=True)  # the prepared wrapper would zero on boundaries only


def step_schedulers(trainer: Trainer, interval: str, *, update_plateau: bool) -> None:
    """Step the schedulers configured for `interval` ("step" or "epoch") whose frequency is due."""
    count = trainer.global_step if interval == "step" else trainer.current_epoch + 1
    module = trainer.attached_module
    for config in trainer.lr_scheduler_configs:
        if config.interval != interval or count % config.frequency or not module.automatic_optimization:
            continue
        metric = None
        if config.monitor is not None:
            if not update_plateau:
                continue
            metric = trainer.callback_metrics.get(config.monitor)
            if metric is None:
                if config.strict:
                    raise RuntimeError(
                        f"the lr scheduler monitors {config.monitor!r}, which was not logged; logged: {sorted(trainer.callback_metrics)}. "
                        "self.log it (e.g. in validation_step), or pass 'strict': False to skip the step when it is missing"
                    )
                continue
            metric = float(metric)
        module.lr_scheduler_step(config.scheduler, metric)


def _on_nonfinite(trainer: Trainer, loss: Any, batch_idx: int) -> None:
    """``on_nonfinite``: the processes agreed this batch is skipped; say why, or stop (every process raises)."""
    local = loss is not None and not bool(torch.isfinite(loss.detach()).all())
    value = float(loss.detach().float().flatten()[0]) if loss is not None else None
    where = f"step {trainer.global_step}, epoch {trainer.current_epoch}, batch {batch_idx}"
    if trainer._args.on_nonfinite == "stop":
        bad = next((name for name, p in trainer.attached_module.named_parameters() if not bool(torch.isfinite(p.detach()).all())), None)
        weights = f"parameter {bad!r} is already non-finite" if bad else "the parameters are still finite"
        raise FloatingPointError(
            f"the training loss is not finite at {where} ({'this process: ' + repr(value) if local else 'on another process'}); "
            f"{weights}. Nothing was stepped and saved checkpoints are intact. Lower the learning rate, clip gradients "
            "(gradient_clip_val=...), use bf16 instead of fp16, or Trainer(on_nonfinite='skip') to skip such batches"
        )
    trainer.nonfinite_skipped += 1
    if trainer.nonfinite_skipped == 1:
        warnings.warn(
            f"the training loss is not finite at {where}; every process skipped the batch (on_nonfinite='skip'). "
            "trainer.nonfinite_skipped counts them; this warning is shown once per fit",
            stacklevel=3,
        )


def agree_flags(trainer: Trainer, skip: bool, nonfinite: bool = False) -> tuple[bool, bool]:
    """Make every process agree on (skip this batch, stop now, a non-finite loss, a preemption signal): each is
    true if any process says so, in one small all-reduce.

    The agreed signal lands in ``trainer.agreed_signal`` (the loop acts on it at the next step boundary), the
    non-finite flag in ``trainer.agreed_nonfinite``.
    """
    stop, received = trainer.should_stop, trainer.received_signal
    if trainer.world_size > 1:
        acc = trainer.accelerator
        flags = acc.reduce(torch.tensor([float(skip), float(stop), float(nonfinite), float(received)], device=acc.device), "max")
        skip, stop, nonfinite, received = bool(flags[0]), bool(flags[1]), bool(flags[2]), int(flags[3])
        trainer.should_stop = stop
    trainer.agreed_nonfinite = nonfinite
    trainer.agreed_signal = trainer.agreed_signal or received
    return skip, stop


# ---------------------------------------------------------------------------------------- evaluation
def eval_loop(trainer: Trainer, stage: str, loaders: list[Any], limits: list[int]) -> Any:
    """Run one epoch of `stage` ("validation", "test" or "predict") over each loader in turn, at most `limits[i]`
    batches of loader i. With several loaders the steps and batch hooks also get ``dataloader_idx`` (as Lightning's).

    Returns ``[{metric: value}]``, one dict per loader (with several, loader i's holds the ``name/dataloader_idx_<i>``
    values and those logged without a loader suffix), or for "predict" every batch's output in dataset order
    (a list per loader when there are several).
    """
    module, call, results = trainer.attached_module, trainer._dispatch.call, trainer._results
    step = getattr(module, f"{stage}_step")
    # A sharded strategy gathers parameters in forward (a collective), so its steps go through the wrapper;
    # DDP's forward would only broadcast buffers, which ranks with unequal evaluation batches must not do.
    strategy, wrapped = trainer.accelerator.strategy, trainer._model
    through = strategy.sharded
    gathered: Any = contextlib.nullcontext()
    if through and trainer.world_size > 1:
        # Each sample is evaluated once, so processes may run different numbers of batches; a forward that
        # all-gathers would then wait forever for the process that has finished. Gather the parameters once instead.
        counts = strategy.all_gather_object([min(limit, len(loader)) for loader, limit in zip(loaders, limits)])
        if any(c != counts[0] for c in counts):
            gathered, through = strategy.gathered_parameters(wrapped), False
    several = len(loaders) > 1
    transfer = moves_batches_itself(trainer)
    module.eval()
    was_training, trainer.training = trainer.training, False
    results.set_context(stage, False)
    results.enabled = stage != "predict"
    predictions: list[list[tuple[int, int, Any]]] = [[] for _ in loaders]
    # Lightning's inference_mode=True; a sharded strategy's gathers and XLA need plain no_grad
    no_grad = torch.inference_mode if trainer._args.inference_mode and not strategy.sharded and strategy.name != "xla" else torch.no_grad
    with no_grad(), gathered:
        call(f"on_{stage}_start")
        call(f"on_{stage}_epoch_start")
        for dataloader_idx, (loader, limit) in enumerate(zip(loaders, limits)):
            extra = (dataloader_idx,) if several else ()
            results.dataloader_suffix = f"/dataloader_idx_{dataloader_idx}" if several else ""
            batches = iter(loader)
            for batch_idx in range(limit):
                batch = next(batches, _MISSING)
                if batch is _MISSING:
                    break
                if transfer:
                    batch = transfer_batch(trainer, batch, dataloader_idx)
                results.set_batch(batch)
                call(f"on_{stage}_batch_start", batch, batch_idx, *extra)
                with strategy.precision.forward_context():
                    if through:
                        output = strategy.call_through(wrapped, module, f"{stage}_step", batch, batch_idx, *extra)
                    else:
                        output = step(batch, batch_idx, *extra)
                if stage == "predict":
                    predictions[dataloader_idx].append((batch_idx, trainer.global_rank, _to_cpu(output)))
                call(f"on_{stage}_batch_end", output, batch, batch_idx, *extra)
                if stage != "predict":  # Lightning: every batch, at the batches seen so far (the sanity check's are dropped)
                    values, seen, key = results.flush_step(stage), trainer._eval_batches_seen, (stage, dataloader_idx)
                    if not trainer.sanity_checking:
                        trainer._send_to_trackers(values, seen.get(key, 0), epoch=False)
                        seen[key] = seen.get(key, 0) + 1
        results.dataloader_suffix = ""
        metrics: dict[str, float] = {}
        if stage == "predict":
            call("on_predict_epoch_end")
        else:
            metrics, logged = _end_of_epoch(trainer, stage)
            trainer._send_to_trackers(logged)
        call(f"on_{stage}_end")
    results.enabled, trainer.training = True, was_training
    if stage == "predict":
        ordered = [_ordered_predictions(trainer, local) for local in predictions]
        return ordered if several else ordered[0]
    return [_of_loader(metrics, i) for i in range(len(loaders))] if several else [metrics]


def _of_loader(metrics: dict[str, float], dataloader_idx: int) -> dict[str, float]:
    """The metrics of loader `dataloader_idx`: its ``/dataloader_idx_<i>`` ones and those without a loader suffix."""
    return {k: v for k, v in metrics.items() if "/dataloader_idx_" not in k or k.endswith(f"/dataloader_idx_{dataloader_idx}")}


def _ordered_predictions(trainer: Trainer, local: list[tuple[int, int, Any]]) -> list[Any]:
    """Predictions of every process in dataset order (batches are dealt round-robin to processes)."""
    if trainer.world_size > 1 and trainer._args.use_distributed_sampler:  # unsharded: each process predicted everything
        local = trainer.accelerator.gather_object(local)
    return [output for _, _, output in sorted(local, key=lambda item: (item[0], item[1]))]


# ---------------------------------------------------------------------------------------- small helpers
def limit_batches(num_batches: int, limit: int | float | None) -> int:
    """Batches to run per epoch: all, at most `limit` (int), or a fraction of them (float)."""
    if limit is None:
        return num_batches
    if isinstance(limit, float):
        return max(1, int(num_batches * limit)) if limit > 0 and num_batches else 0
    return min(num_batches, limit)


def unshuffled(loader: Any, kind: str) -> Any:
    """``overfit_batches``: the same loader reading its data set in order (a shuffling one is rebuilt, with a warning, as Lightning)."""
    if (isinstance(loader.sampler, torch.utils.data.SequentialSampler) or loader.batch_size is None
            or isinstance(loader.dataset, torch.utils.data.IterableDataset)):
        return loader
    warnings.warn(f"overfit_batches reads the {kind} dataloader in order: its shuffling is turned off (as Lightning does)", stacklevel=4)
    from strategies.data import _carried_kwargs

    return torch.utils.data.DataLoader(
        loader.dataset, batch_size=loader.batch_size, shuffle=False, drop_last=loader.drop_last, **_carried_kwargs(loader)
    )


def overrides(module: TrainModule, name: str) -> bool:
    """True when `module`'s class defines `name` itself (e.g. ``validation_step``)."""
    return getattr(type(module), name, None) is not getattr(TrainModule, name, None)


def loader_from(module: TrainModule, kind: str, given: Any, *, required: bool) -> Any:
    """The loader passed to the entry point, else the datamodule's ``<kind>_dataloader()``, else the module's.

    "train" gives one loader; the evaluation kinds a list (a single loader becomes a list of one).
    """
    owner = module._trainer
    datamodule = getattr(owner, "datamodule", None) if owner is not None else None
    if given is None and datamodule is not None:
        given = getattr(datamodule, f"{kind}_dataloader")()
    if given is None:
        method = getattr(module, f"{kind}_dataloader", None)
        given = method() if callable(method) else None
    if isinstance(given, dict):
        raise TypeError(f"the {kind} dataloaders are a dict; pass a list of DataLoaders (dataloader_idx is the position in it)")
    several = isinstance(given, (list, tuple))
    loaders = list(given) if several else [given]
    if several and kind == "train" and len(loaders) != 1:
        raise ValueError(f"one train dataloader is supported, got {len(loaders)}; pass a single DataLoader")
    if given is None or not loaders:
        if required:
            raise ValueError(f"no {kind} dataloader: pass one to the Trainer method, or define {kind}_dataloader() on {type(module).__name__}")
        return None
    for loader in loaders:
        if not isinstance(loader, torch.utils.data.DataLoader):
            raise TypeError(f"the {kind} dataloader must be a torch.utils.data.DataLoader, got {type(loader).__name__}")
    return loaders if kind != "train" else loaders[0]


def _loss_of(output: Any) -> torch.Tensor | None:
    if output is None or isinstance(output, torch.Tensor):
        return output
    if isinstance(output, dict) and "loss" in output:
        loss: torch.Tensor | None = output["loss"]
        return loss
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
