"""The batch-size search (Lightning 2.6's ``scale_batch_size``), run on the `Trainer`'s own loops.

    save a checkpoint of the run
    size = init_val
    repeat (at most max_trials times, and while the size stays below the data set's length and max_val):
        rebuild the loaders (``*_dataloader()`` of the module or datamodule read the size) and run steps_per_trial
        steps of the method (fit: training steps with as many validation batches; else evaluation batches)
        it ran: "power" doubles the size; "binsearch" doubles it until a failure, then bisects
        out of memory (`is_oom_error`): "power" halves the size and ends once one size ran; "binsearch" bisects
    restore the checkpoint; "binsearch" keeps `margin` below the result

On a CPU no trial runs out of memory (torch asks the OS for more), so the search ends at ``max_trials``, at the data
set's length or at ``max_val``, as Lightning's does. The size found stays on the module (or hparams, or datamodule).
"""

from __future__ import annotations

import gc
import logging
from typing import TYPE_CHECKING, Any

import torch

from callbacks.base import overrides
from trainer.fit import loops
from trainer.fit.dispatch import HookDispatcher
from trainer.fit.lr_finder import get_attr, has_attr, set_attr
from trainer.fit.module import TrainModule
from trainer.fit.search import run_training, state_kept

if TYPE_CHECKING:
    from trainer.fit.trainer import Trainer

log = logging.getLogger(__name__)

MODES = ("power", "binsearch")


def is_oom_error(exception: BaseException) -> bool:
    """Lightning's ``is_oom_error``: a CUDA out-of-memory error, cuDNN's NOT_SUPPORTED (what it raises when out of
    memory) or the CPU allocator's failure."""
    if not isinstance(exception, RuntimeError) or len(exception.args) != 1 or not isinstance(exception.args[0], str):
        return False
    message = exception.args[0]
    return (("CUDA" in message and "out of memory" in message) or "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED." in message
            or "DefaultCPUAllocator: can't allocate memory" in message)


def _collect_garbage() -> None:
    """Lightning's ``garbage_collection_cuda``: free what a failed trial left on the device."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class _Search:
    """One search: the loaders of `stage` rebuilt for each size, and one trial of `steps_per_trial` steps."""

    def __init__(self, trainer: Trainer, module: TrainModule, stage: str, steps_per_trial: int, batch_arg_name: str) -> None:
        self.trainer, self.module, self.stage = trainer, module, stage
        self.steps_per_trial, self.batch_arg_name = steps_per_trial, batch_arg_name
        self.val_loaders: list[Any] | None = None
        self.eval_loaders: list[Any] = []
        self.length: int | None = None
        self.measured = False

    def reload(self) -> None:
        """Ask the module (or datamodule) for the loaders again, built with the size now set."""
        trainer = self.trainer
        if self.stage == "fit":
            self.val_loaders = trainer.loaders.build_fit(self.module, None, None, reload=True)
            trainer.num_training_batches = loops.num_batches(trainer.loaders.train)  # Lightning's limit_train_batches=1.0
            trainer.loaders.val_limits = [min(self.steps_per_trial, n) for n in trainer.loaders.val_limits]
        else:
            kind = {"validation": "val"}.get(self.stage, self.stage)
            self.eval_loaders = [trainer.loaders.eval_loader(loader) for loader in loops.loader_from(self.module, kind, None, required=True, datamodule=trainer.datamodule)]

    def dataset_length(self) -> int | None:
        """The samples in the loaders (Lightning's ``_dataset_length``: the sum over loaders); None for streams."""
        trainer = self.trainer
        if self.stage == "fit":
            loader = trainer.loaders.train
            parts = list(loader.flattened) if hasattr(loader, "flattened") else [loader]
        else:
            parts = self.eval_loaders
        try:
            return sum(len(part.dataset) for part in parts)
        except (TypeError, AttributeError):
            return None

    def trial(self) -> None:
        trainer = self.trainer
        trainer.run_state.progress.reset()  # each trial from the start (the run state is put back after the search)
        if self.stage == "fit":
            run_training(trainer, [], max_steps=self.steps_per_trial, val_loaders=self.val_loaders)
        else:
            trainer.dispatch = HookDispatcher(self.module, TrainModule, [], trainer)
            loops.eval_loop(trainer, self.stage, self.eval_loaders, [self.steps_per_trial] * len(self.eval_loaders), keep_predictions=False)

    def fits(self) -> bool:
        """Run one `trial`: True if it ran, False if it ran out of memory (the memory is freed); other errors raise."""
        try:
            self.trial()
        except RuntimeError as error:
            if not is_oom_error(error):
                raise
            _collect_garbage()
            return False
        return True

    def adjust(self, *, factor: float = 1.0, value: int | None = None, desc: str | None = None, max_val: int = 8192) -> tuple[int, bool]:
        """Lightning's ``_adjust_batch_size``: the next size (`value`, or the current one times `factor`, at most
        `max_val`), unchanged once the current size covers the data set; returns ``(size, changed)``."""
        size = int(get_attr(self.module, self.batch_arg_name, datamodule=self.trainer.datamodule))
        if not self.measured:  # the data set's length, from loaders of any size
            self.reload()
            self.length, self.measured = self.dataset_length(), True
        length = self.length
        if length is not None and size >= length:
            log.info(f"The batch size {size} is greater or equal than the length of your dataset: {length}.")
            return size, False
        new = value if value is not None else int(size * factor)
        if new > max_val:
            new = max_val
        if desc:
            log.info(f"Batch size {size} {desc}, trying batch size {new}")
        set_attr(self.module, self.batch_arg_name, new, datamodule=self.trainer.datamodule)
        self.reload()  # the next trial runs at the new size (Lightning's first trial runs at the size the module had)
        return new, new != size


def scale_batch_size(
    trainer: Trainer, module: TrainModule, *, mode: str, steps_per_trial: int, init_val: int, max_trials: int,
    batch_arg_name: str, margin: float, max_val: int,
) -> int | None:
    """Run the search inside `trainer`'s running ``fit``/``validate``/``test``/``predict`` and put the run back."""
    stage = trainer.run_state.stage or "fit"
    if trainer.args.fast_dev_run:
        log.warning("Skipping batch size scaler since `fast_dev_run` is enabled.")
        return None
    _check(trainer, module, stage, batch_arg_name)
    search = _Search(trainer, module, "validation" if stage == "validate" else stage, steps_per_trial, batch_arg_name)
    with state_kept(trainer, "scale_batch_size"):
        size, _ = search.adjust(value=init_val)
        size = _power(search, size, max_trials, max_val) if mode == "power" else _binsearch(search, size, max_trials, margin, max_val)
        _collect_garbage()
    if stage == "fit":  # the run goes on with loaders of the size found (the restored position is the run's start)
        trainer.loaders.stale = True
    log.info(f"Finished batch size finder, will continue with full run using batch size {size}")
    return size


def _check(trainer: Trainer, module: TrainModule, stage: str, batch_arg_name: str) -> None:
    if trainer.world_size > 1:
        raise ValueError(f"the batch size finder runs in one process (this run has {trainer.world_size}), as Lightning's")
    kind = {"fit": "train", "validate": "val"}.get(stage, stage)
    given = trainer.loaders.sources[0] if stage == "fit" else None
    if given is not None or (trainer.datamodule is None and not overrides(module, f"{kind}_dataloader", TrainModule)):
        raise ValueError(
            "the batch size finder builds the loaders again for every size, from the module's or datamodule's "
            f"{kind}_dataloader(): loaders passed to {stage}() directly cannot change size. Build them in "
            f"{kind}_dataloader() from self.{batch_arg_name}, or remove the finder"
        )
    if not has_attr(module, batch_arg_name, datamodule=trainer.datamodule):
        raise AttributeError(
            f"batch_arg_name={batch_arg_name!r} is neither an attribute of {type(module).__name__}, a key of its hparams, "
            f"nor an attribute of the datamodule; keep the batch size there under that name"
        )
    if hasattr(module, batch_arg_name) and batch_arg_name in getattr(module, "hparams", {}):
        log.warning(
            f"Field `model.{batch_arg_name}` and `model.hparams.{batch_arg_name}` are mutually exclusive! "
            f"`model.{batch_arg_name}` will be used as the initial batch size for scaling."
        )


def _power(search: _Search, size: int, max_trials: int, max_val: int) -> int:
    """Double until a trial runs out of memory (then halve, and stop once one size ran)."""
    any_success = False
    for i in range(max_trials):
        _collect_garbage()
        if size >= max_val:
            log.info(f"Reached the maximum batch size limit of {max_val}. Stopping search.")
            break
        if not search.fits():
            size, _ = search.adjust(factor=0.5, desc="failed")
            if any_success:
                break
            continue
        if i + 1 >= max_trials:
            break
        size, changed = search.adjust(factor=2.0, desc="succeeded")
        if not changed:
            break
        any_success = True
    return size


def _binsearch(search: _Search, size: int, max_trials: int, margin: float, max_val: int) -> int:
    """Double until a trial runs out of memory, then bisect between the last size that ran and the one that failed."""
    low, high, count = 1, None, 0
    while True:
        _collect_garbage()
        if size >= max_val:
            log.info(f"Reached the maximum batch size limit of {max_val}. Stopping search.")
            break
        if not search.fits():
            high = size
            size, _ = search.adjust(value=(high + low) // 2, desc="failed")
            if high - low <= 1:
                break
            continue
        count += 1
        if count >= max_trials:
            break
        low = size
        if high:
            if high - low <= 1:
                break
            size, changed = search.adjust(value=(high + low) // 2, desc="succeeded", max_val=max_val)
        else:
            size, changed = search.adjust(factor=2.0, desc="succeeded", max_val=max_val)
        if not changed:
            break
    if margin > 0:
        reduced = max(1, int(size * (1 - margin)))
        if reduced != size:
            log.info(f"Applying margin of {margin:.1%}, reducing batch size from {size} to {reduced}")
            size = reduced
            set_attr(search.module, search.batch_arg_name, size, datamodule=search.trainer.datamodule)
    return size
