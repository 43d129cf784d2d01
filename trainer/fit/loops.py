"""The `Trainer`'s loops, as plain functions of the trainer.

    fit:        sanity_check(trainer, val)        # a few validation batches before training
                while not fit_done(trainer):
                    train_epoch(trainer, val)     # -> train_batch -> optimizer_step, eval_loop when due
    validate/test/predict:
                eval_loop(trainer, stage, loader, limit)

What the loops advance is the run's state, ``trainer.run_state`` (`trainer.fit.run_state.RunState`): what the run is
doing (stage, training, sanity checking) and where the fit is (its `LoopProgress`, saved in checkpoints, so a resume
continues mid-epoch), whose methods are the only writers of the step, window and epoch counts. Preparation, backward, accumulation, clipping and gathering are the `Accelerator`'s; calling a step
through the wrapped model's forward is the strategy's (`Strategy.call_through`).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import shutil
import sys
import warnings
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from callbacks.base import overrides
from strategies.collectives import apply_to_tensors
from trainer.fit import preemption
from trainer.fit.batch import ProfiledTrainBatch, TrainBatch, step_schedulers
from trainer.fit.combined_loader import CombinedLoader
from trainer.fit.module import TrainModule
from trainer.fit.profiler import profile
from trainer.fit.transfer import moves_batches_itself, transfer_batch

if TYPE_CHECKING:
    from trainer.fit.datamodule import DataModule
    from trainer.fit.trainer import Trainer

_MISSING = object()


# ---------------------------------------------------------------------------------------- fit
def can_stop_early(trainer: Trainer) -> bool:
    """Whether a stop asked for (``trainer.should_stop``: early stopping, a `Timer`, a callback) may take effect: once
    ``min_epochs`` epochs and ``min_steps`` optimizer steps are done (Lightning's ``_can_stop_early``). Until then the
    stop stays asked for and training goes on. Read where every process has the same epoch and step counts."""
    args, state = trainer.args, trainer.run_state
    return state.current_epoch >= args.min_epochs and (args.min_steps is None or state.global_step >= args.min_steps)


def fit_done(trainer: Trainer) -> bool:
    """True when training should stop: asked to (and `can_stop_early`), ``max_steps`` reached or ``max_epochs`` done."""
    state = trainer.run_state
    if (state.should_stop and can_stop_early(trainer)) or state.max_steps_reached():
        return True
    return state.max_epochs not in (None, -1) and state.current_epoch >= state.max_epochs


def sanity_check(trainer: Trainer, val_loaders: list[Any]) -> None:
    """Run ``num_sanity_val_steps`` validation batches; the metrics they log are dropped afterwards."""
    stores = (trainer.callback_metrics, trainer.logged_metrics, trainer.progress_bar_metrics)
    saved, state = [dict(d) for d in stores], trainer.run_state
    state.sanity_checking = True
    trainer.dispatch.call("on_sanity_check_start")
    limits = trainer.loaders.val_limits
    steps = limits if trainer.num_sanity_val_steps == -1 else [min(trainer.num_sanity_val_steps, n) for n in limits]
    eval_loop(trainer, "validation", val_loaders, steps)
    trainer.dispatch.call("on_sanity_check_end")
    state.sanity_checking = False
    for target, values in zip(stores, saved):
        target.clear()
        target.update(values)


def train_epoch(trainer: Trainer, val_loaders: list[Any] | None) -> None:
    """Run (the rest of) one training epoch, validating when due.

    The epoch ends after ``num_training_batches`` batches, or when the loader runs out: a loader without a length
    (a stream) has ``num_training_batches == inf``, and its last batch is known while it is in use (the loader reads
    one batch ahead: ``end_of_dataloader``), so accumulation, validation and checkpoints treat it as the sized
    loader's last batch.
    """
    state, results = trainer.run_state, trainer.results
    progress = state.progress
    stop_agreed = state.should_stop  # agreed at the last epoch's end (before any hook of this one); min_epochs/min_steps held it
    # a checkpoint written at a batch's end comes before the validation due after that batch: run it first
    pending = progress.validation_pending and bool(val_loaders)
    start, total = progress.batches_done_in_epoch, trainer.num_training_batches
    if 0 < total <= start or (start and progress.is_last_batch):  # restored from the end of an epoch
        if pending:
            _validate(trainer, val_loaders)
        progress.close_stepping_batch()
        return _next_epoch(trainer, update_plateau=False)
    loader = trainer.loaders.train
    stream = math.isinf(num_batches(loader))
    batches = _train_batches(trainer, start)
    # the module's modes are the user's: no .train() here (Lightning's); an evaluation restores the modes it found
    results.set_context("train", False)
    trainer.dispatch.call("on_train_epoch_start")
    if pending:
        _validate(trainer, val_loaders)
    progress.close_stepping_batch()
    train_batch = TrainBatch(trainer) if trainer.profiler is None else ProfiledTrainBatch(trainer)
    trainer.agreement.begin_epoch()
    validates, drawn = bool(val_loaders), False
    indices = range(start, int(total)) if math.isfinite(total) else itertools.count(start)
    for batch_idx, batch in zip(indices, batches):  # the indices first: no batch is drawn past the limit
        drawn, last = True, batch_idx + 1 >= total or (stream and loader.end_of_dataloader)
        validate = progress.validation_pending = validates and _validation_due(trainer, batch_idx, last)  # saved by checkpoints
        go_on = train_batch(batch, batch_idx, last)  # False: the processes agreed at its end to stop
        if validates and not validate and (stop_agreed or not go_on) and can_stop_early(trainer) and _validation_due(trainer, batch_idx, True):
            validate = progress.validation_pending = True  # a stop that takes effect here validates first, as Lightning's
        if validate:
            go_on = not _validate(trainer, val_loaders) and go_on
        progress.validation_pending = False
        progress.close_stepping_batch()  # a boundary batch counts once its validation logged at its step
        stop_agreed = stop_agreed or not go_on  # the same on every process, as the step and epoch counts
        if (stop_agreed and can_stop_early(trainer)) or state.max_steps_reached():
            break
        if trainer.agreement.signal and preemption.due(trainer) and not last:  # at the epoch's end: after it
            preemption.checkpoint_and_exit(trainer)
    if stream and not drawn and start == 0 and total:
        raise ValueError(
            f"the train dataloader yielded no batch in epoch {state.current_epoch}: its IterableDataset ended at once, so "
            "fit would take no step. Check that the data set yields items on every pass (after set_epoch), or pass a non-empty one"
        )
    _, logged = _end_of_epoch(trainer, "train")
    trainer.send_to_trackers(logged, max(state.logging_step - 1, 0))  # at the epoch's last step, as its last step values
    trainer.warn_if_nonfinite({}, synchronized=True)  # the losses trained on this epoch, read at its end (where the loop synchronizes)
    epoch_over = progress.batches_done_in_epoch >= total or progress.is_last_batch
    if epoch_over or not state.max_steps_reached():  # an epoch cut short by max_steps stays open, so a resume continues it
        _next_epoch(trainer, update_plateau=True)
    return None


def _validate(trainer: Trainer, val_loaders: list[Any] | None) -> bool:
    """Validate during fit; returns the stop the processes agree on after it (early stopping decides there)."""
    trainer.run_state.progress.validation_pending = False  # a checkpoint written during the validation is past it
    with profile(trainer, "validation"):
        eval_loop(trainer, "validation", val_loaders or [], trainer.loaders.val_limits)  # puts the module back in its modes
    trainer.warn_if_nonfinite({}, synchronized=True)  # the losses trained on so far, read after the validation synchronized
    return trainer.agreement.agree(trainer.run_state)


def _end_of_epoch(trainer: Trainer, stage: str) -> tuple[dict[str, float], dict[str, float]]:
    """``on_<stage>_epoch_end`` in Lightning's order, with the epoch values computed around it.

    Returns ``(the epoch values, the ones for the trackers)``.

    The epoch values of what the steps logged are computed first, so every epoch-end hook sees them; then the
    callbacks run and the module's hook; the values those hooks logged are computed last. At the end of a
    training epoch the callbacks that monitor a metric (checkpointing, early stopping) run after the module's
    hook and that last computation, so they see what the module logged there; the other callbacks run before it.
    """
    results, dispatch, event = trainer.results, trainer.dispatch, f"on_{stage}_epoch_end"
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
    loader = trainer.loaders.train
    if hasattr(loader, "set_epoch"):
        loader.set_epoch(trainer.run_state.current_epoch)
    if isinstance(loader, CombinedLoader):  # the step gets the combined batch; a resume reads the batches it skips
        batches = itertools.islice(trainer.loaders.train_step_batches(), start, None)
    else:
        if start:  # resuming mid-epoch: skip at the batch-sampler level, no skipped sample is loaded
            loader = trainer.accelerator.skip_first_batches(loader, start)
        batches = iter(loader)
    return batches if trainer.profiler is None else _timed_batches(trainer.profiler, batches)


def _timed_batches(profiler: Any, batches: Any) -> Any:
    """`batches`, each draw timed as ``train_dataloader_next`` (``profiler="simple"``)."""
    while True:
        with profiler.time("train_dataloader_next"):
            batch = next(batches, _MISSING)
        if batch is _MISSING:
            return
        yield batch


def _next_epoch(trainer: Trainer, *, update_plateau: bool) -> None:
    step_schedulers(trainer, "epoch", update_plateau=update_plateau)
    trainer.run_state.progress.next_epoch()
    trainer.agreement.agree(trainer.run_state)  # every process learns whether one of them asked to stop


def _validation_due(trainer: Trainer, batch_idx: int, last: bool) -> bool:
    """Validate after batch `batch_idx` (`last`: the epoch's last)? The trainer's `ValidationSchedule` says."""
    return trainer.validation_schedule.due(trainer.run_state.current_epoch, batch_idx, last)


# ---------------------------------------------------------------------------------------- evaluation
def eval_loop(trainer: Trainer, stage: str, loaders: list[Any], limits: list[int | float], *, keep_predictions: bool = True) -> Any:
    """Run one epoch of `stage` ("validation", "test" or "predict") over each loader in turn, at most `limits[i]`
    batches of loader i (``inf``: until it runs out, for a loader without a length). With several loaders the steps
    and batch hooks also get ``dataloader_idx`` (as Lightning's).

    Returns ``[{metric: value}]``, one dict per loader (with several, loader i's holds the ``name/dataloader_idx_<i>``
    values and those logged without a loader suffix), or for "predict" every batch's output in dataset order
    (a list per loader when there are several; None without `keep_predictions`: nothing kept, nothing gathered).
    """
    module, call, results, state = trainer.attached_module, trainer.dispatch.call, trainer.results, trainer.run_state
    step = getattr(module, f"{stage}_step")
    # A sharded strategy gathers parameters in forward (a collective), so its steps go through the wrapper;
    # DDP's forward would only broadcast buffers, which ranks with unequal evaluation batches must not do.
    strategy, wrapped = trainer.accelerator.strategy, trainer.model_setup.model
    through = strategy.sharded
    gathered: Any = contextlib.nullcontext()
    if through and trainer.world_size > 1:
        # Each sample is evaluated once, so processes may run different numbers of batches; a forward that
        # all-gathers would then wait forever for the process that has finished. Gather the parameters once instead.
        # a tuple per process (gather_object concatenates lists)
        counts = strategy.all_gather_object(tuple(min(limit, num_batches(loader)) for loader, limit in zip(loaders, limits)))
        if any(c != counts[0] for c in counts) or any(math.isinf(n) for c in counts for n in c):  # a stream's count is unknown
            gathered, through = strategy.gathered_parameters(wrapped), False
    several = len(loaders) > 1
    transfer = moves_batches_itself(trainer)
    modes = [(submodule, submodule.training) for submodule in module.modules()]  # restored after, as Lightning's
    getattr(module, f"on_{stage}_model_eval")()  # default: module.eval()
    was_training, state.training = state.training, False
    results.set_context(stage, False)
    results.enabled = stage != "predict"
    predictions: list[list[tuple[int, int, Any]]] = [[] for _ in loaders]
    with strategy.evaluation_context(trainer.args.inference_mode), gathered:  # Lightning's inference_mode=True
        call(f"on_{stage}_start")
        call(f"on_{stage}_epoch_start")
        for dataloader_idx, (loader, limit) in enumerate(zip(loaders, limits)):
            extra = (dataloader_idx,) if several else ()
            results.dataloader_suffix = f"/dataloader_idx_{dataloader_idx}" if several else ""
            batches = iter(loader)
            for batch_idx in range(int(limit)) if math.isfinite(limit) else itertools.count():
                batch = next(batches, _MISSING)
                if batch is _MISSING:
                    break
                if transfer:
                    batch = transfer_batch(trainer, batch, dataloader_idx)
                results.set_batch(batch)
                call(f"on_{stage}_batch_start", batch, batch_idx, *extra)
                with strategy.precision.forward_context():
                    inputs = strategy.precision.convert_input(batch)  # a true precision's dtype; the hooks get `batch`
                    if through:
                        output = strategy.call_through(wrapped, module, f"{stage}_step", inputs, batch_idx, *extra)
                    else:
                        output = step(inputs, batch_idx, *extra)
                if stage == "predict" and keep_predictions:
                    predictions[dataloader_idx].append((batch_idx, trainer.global_rank, _to_cpu(output)))
                call(f"on_{stage}_batch_end", output, batch, batch_idx, *extra)
                if stage != "predict":  # Lightning: every batch, at the batches seen so far (the sanity check's are dropped)
                    values, seen, key = results.flush_step(stage), state.eval_batches_seen, (stage, dataloader_idx)
                    if not state.sanity_checking:
                        trainer.send_to_trackers(values, seen.get(key, 0), epoch=False)
                        seen[key] = seen.get(key, 0) + 1
        results.dataloader_suffix = ""
        metrics: dict[str, float] = {}
        if stage == "predict":
            call("on_predict_epoch_end")
        else:
            metrics, logged = _end_of_epoch(trainer, stage)
            trainer.send_to_trackers(logged)
        call(f"on_{stage}_end")
    if stage != "predict" and overrides(module, f"on_{stage}_model_train", TrainModule):
        getattr(module, f"on_{stage}_model_train")()
    else:
        for submodule, training in modes:
            submodule.training = training
    results.enabled, state.training = True, was_training
    if stage == "predict":
        if not keep_predictions:
            return None
        ordered = [_ordered_predictions(trainer, local) for local in predictions]
        return ordered if several else ordered[0]
    return [_of_loader(metrics, i) for i in range(len(loaders))] if several else [metrics]


def _of_loader(metrics: dict[str, float], dataloader_idx: int) -> dict[str, float]:
    """The metrics of loader `dataloader_idx`: its ``/dataloader_idx_<i>`` ones and those without a loader suffix."""
    return {k: v for k, v in metrics.items() if "/dataloader_idx_" not in k or k.endswith(f"/dataloader_idx_{dataloader_idx}")}


def _ordered_predictions(trainer: Trainer, local: list[tuple[int, int, Any]]) -> list[Any]:
    """Predictions of every process in dataset order (batches are dealt round-robin to processes)."""
    if trainer.world_size > 1 and trainer.args.use_distributed_sampler:  # unsharded: each process predicted everything
        repeated = trainer.accelerator.strategy.repeats_batches  # a tensor-parallel or pipeline peer's: gathered once
        local = trainer.accelerator.gather_object([] if repeated else local)
    return [output for _, _, output in sorted(local, key=lambda item: (item[0], item[1]))]


# ---------------------------------------------------------------------------------------- small helpers
def num_batches(loader: Any) -> int | float:
    """``len(loader)``, or ``float("inf")`` for a loader without a length (an `IterableDataset` without ``__len__``),
    as Lightning counts it."""
    try:
        return len(loader)
    except (TypeError, NotImplementedError):
        return math.inf


def limit_batches(num_batches: int | float, limit: int | float | None, name: str) -> int | float:
    """Batches to run per epoch: all, at most `limit` (int), or a fraction of them (float).

    `name` is the argument `limit` came from (``"limit_val_batches"``, ...), for the error on a loader without a length
    (`num_batches` is inf), whose fraction is unknown: there only an int, 1.0 (all) or 0.0 (none) is taken.
    """
    if limit is None:
        return num_batches
    if isinstance(limit, float):
        if math.isinf(num_batches):
            refuse_fraction(name, limit)
            return num_batches if limit else 0
        return max(1, int(num_batches * limit)) if limit > 0 and num_batches else 0
    return min(num_batches, limit)


def refuse_fraction(name: str, value: Any) -> None:
    """Raise for a fraction (a float other than 0.0 and 1.0) of a loader without a length; Lightning's rule."""
    if isinstance(value, float) and value not in (0.0, 1.0):
        loader = name.removeprefix("limit_").removesuffix("_batches") if name.startswith("limit_") else "train"
        use = "at most that many batches per epoch" if name.startswith("limit_") else "validate every that many training batches"
        raise ValueError(
            f"{name}={value!r} is a fraction of an epoch, but the {loader} dataloader has no length (an IterableDataset without "
            f"__len__), so the fraction is unknown; pass an int ({use}) or 1.0 (the whole epoch)"
        )


def unshuffled(loader: Any, kind: str) -> Any:
    """``overfit_batches``: the same loader reading its data set in order (a shuffling one is rebuilt, with a warning, as Lightning)."""
    if (isinstance(loader.sampler, torch.utils.data.SequentialSampler) or loader.batch_size is None
            or isinstance(loader.dataset, torch.utils.data.IterableDataset)):
        return loader
    warnings.warn(f"overfit_batches reads the {kind} dataloader in order: its shuffling is turned off (as Lightning does)", stacklevel=4)
    from strategies.data import carried_kwargs  # lazy: `from trainer import Trainer` does not load strategies.data

    return torch.utils.data.DataLoader(
        loader.dataset, batch_size=loader.batch_size, shuffle=False, drop_last=loader.drop_last, **carried_kwargs(loader)
    )


def loader_from(module: TrainModule, kind: str, given: Any, *, required: bool, datamodule: DataModule | None) -> Any:
    """The loader passed to the entry point, else `datamodule`'s ``<kind>_dataloader()`` (the run's), else the module's.

    "train" gives one loader, or a `CombinedLoader` (as given, or a list or dict of loaders in ``max_size_cycle`` mode,
    as Lightning); the evaluation kinds a list (a single loader becomes a list of one; a dict, or a ``sequential``
    `CombinedLoader`, its loaders in order).
    """
    if given is None and datamodule is not None:
        given = getattr(datamodule, f"{kind}_dataloader")()
    if given is None:
        method = getattr(module, f"{kind}_dataloader", None)
        given = method() if callable(method) else None
    combined = given if isinstance(given, CombinedLoader) else None
    if kind == "train" and combined is None and isinstance(given, (Mapping, list, tuple)):
        combined = CombinedLoader(given, "max_size_cycle")
    if combined is not None and (combined.mode == "sequential") != (kind != "train"):
        raise ValueError(
            f"CombinedLoader(mode={combined.mode!r}) is not supported for the {kind} dataloaders: training takes 'max_size_cycle', "
            "'min_size' or 'max_size'; evaluation runs its loaders one after another, 'sequential' (as Lightning)"
        )
    if kind != "train" and isinstance(given, Mapping):
        combined = CombinedLoader(given, "sequential")
    several = combined is not None or isinstance(given, (list, tuple))
    loaders = combined.flattened if combined is not None else list(given) if several else [given]
    if given is None or not loaders:
        if required:
            raise ValueError(f"no {kind} dataloader: pass one to the Trainer method, or define {kind}_dataloader() on {type(module).__name__}")
        return None
    for loader in loaders:
        if not isinstance(loader, torch.utils.data.DataLoader):
            raise TypeError(f"the {kind} dataloader must be a torch.utils.data.DataLoader, got {type(loader).__name__}")
    if kind != "train":
        return loaders
    return combined if combined is not None else loaders[0]


def print_results(results: list[dict[str, float]], stage: str) -> None:
    """``validate``/``test(verbose=True)``: Lightning's plain-text table of the epoch metrics (its output without
    ``rich``), one column per loader, as wide as the terminal allows."""
    results = [{k.split("/dataloader_idx_")[0]: v for k, v in r.items()} for r in results]
    names = sorted({k for r in results for k in r})
    if not names:
        return
    headers = [f"DataLoader {i}" for i in range(len(results))]
    term = shutil.get_terminal_size(fallback=(120, 30)).columns or 120
    width = int(min(max(len(max(names, key=len)), len(max(headers, key=len)), 25), term / 2))
    rows = [[f"{r[name]}" if name in r else " " for r in results] for name in names]
    per_table, half = max(int((term - width) / width), 1), int(term / 2)
    try:
        bar = ("─" if sys.stdout.encoding is None or "─".encode(sys.stdout.encoding) else "-") * term
    except UnicodeEncodeError:  # a terminal without the box character
        bar = "-" * term
    for start in range(0, len(headers), per_table):
        shown = headers[start:start + per_table]
        line = f"{{:^{width}}}" * (len(shown) + 1)
        lines = [bar, line.format(f"{stage} Metric".capitalize(), *shown).rstrip(), bar]
        for name, row in zip(names, rows):
            while len(name) > half:  # a long name takes several lines, the values on each (Lightning's layout)
                lines.append(line.format(name[:half], *row[start:start + per_table]).rstrip())
                name = name[half:]
            lines.append(line.format(name, *row[start:start + per_table]).rstrip())
        lines.append(bar)
        print(os.linesep.join(lines))


def _to_cpu(output: Any) -> Any:
    return apply_to_tensors(lambda t: t.detach().cpu(), output)
