"""One training batch: the hot path of ``fit``.

    on_train_batch_start
    output = training_step(batch, batch_idx)       # through the wrapper's forward when the strategy wraps the model
    (automatic optimization)
        processes agree: skip this batch? stop? (one small all-reduce, only with several processes)
        on_before_zero_grad, zero_grad             # on the first batch of an accumulation window
        on_before_backward, backward, on_after_backward
        on a window's last batch: unscale, on_before_optimizer_step, clip, step, schedulers
    on_train_batch_end(detached output)
    every log_every_n_steps windows: the step values go to the trackers

`TrainBatch` is built once per epoch and looks up there what stays fixed for the epoch (the step method, the
hooks someone overrides, whether the precision needs a context, whether several processes run), so a batch
runs the code above and little else: a hook nobody overrides is not dispatched, a context that does nothing is
not entered, a single process reduces no flags.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from typing import TYPE_CHECKING, Any

import torch

from trainer.accelerator.wrappers import step_optimizer, zero_grad_to_none
from trainer.fit.profiler import timed
from trainer.fit.transfer import transfer_batch

if TYPE_CHECKING:
    from trainer.fit.profiler import SimpleProfiler
    from trainer.fit.trainer import Trainer

_BATCH_EVENTS = ("on_train_batch_start", "on_before_zero_grad", "on_before_backward", "on_after_backward",
                 "on_before_optimizer_step", "on_train_batch_end")


class TrainBatch:
    """Runs training batches of one epoch: ``TrainBatch(trainer)(batch, batch_idx, last)``; see the module docstring."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.state = trainer.fit_loop_state
        self.accelerator = acc = trainer.accelerator
        self.module = module = trainer.attached_module
        self.results = trainer._results
        strategy, model = acc.strategy, trainer._model
        # the step, through the wrapper's forward when the strategy needs its hooks (DDP, FSDP), else the method itself
        redirect = strategy.redirects_forward(model, module)
        self.training_step = functools.partial(strategy.call_through, model, module, "training_step") if redirect else module.training_step
        self.precision = strategy.precision
        self.plain_precision = type(strategy.precision.forward_context()) is contextlib.nullcontext
        dispatch = trainer._dispatch
        self.hooks = {event: fire for event in _BATCH_EVENTS if (fire := dispatch.caller(event)) is not None}
        # the three big parts of a batch as plain callables (ProfiledTrainBatch wraps them in its timers)
        self.automatic_step = self._in_precision(self.training_step)
        self.manual_step = self._in_precision(module.training_step)
        self.backward = acc.backward
        self.optimizer_step = self._optimizer_step
        # backward and the optimizer step straight to torch where the accelerator's would do just that (no loss
        # scaling, no accumulation, a strategy with nothing to add: `Strategy.plain_steps`)
        self.direct = acc._plain_steps and acc.gradient_plugin.num_steps == 1
        self.several_processes = trainer.world_size > 1
        self.check_nonfinite = trainer._args.on_nonfinite is not None
        self.optimizer: Any = trainer.optimizers[0] if trainer.optimizers else None
        # zeroes at the window's first batch, where Lightning does (the prepared wrapper would on boundaries only)
        self.inner_optimizer: Any = _inner(self.optimizer)

    def __call__(self, batch: Any, batch_idx: int, last: bool) -> bool:
        """Run one batch (`last`: the epoch's last, which ends an accumulation window); return False (having done
        nothing more) when the processes agreed to stop."""
        trainer, state, hooks = self.trainer, self.state, self.hooks
        if trainer._moves_batches:
            batch = transfer_batch(trainer, batch, 0)
        self.results.begin_batch(batch, "train", True)  # step_context
        if "on_train_batch_start" in hooks:
            hooks["on_train_batch_start"](batch, batch_idx)
        if self.module.automatic_optimization:
            boundary = state["accumulation_position"] + 1 >= trainer.accumulate_grad_batches or last
            self.accelerator.sync_gradients = boundary
            if boundary:
                output, stop = self._automatic(batch, batch_idx, boundary)
            else:  # inside an accumulation window all of it runs without gradient reduction
                with self.accelerator.no_sync(trainer._model):
                    output, stop = self._automatic(batch, batch_idx, boundary)
            if stop:
                return False
        else:  # the user's step drives the optimizers (self.manual_backward, opt.step())
            self.accelerator.sync_gradients = True
            output = self.manual_step(batch, batch_idx)
            stop = self._agree(False)[1]
        state["batches_done_in_epoch"], state["is_last_batch"] = batch_idx + 1, last
        # a boundary batch (every batch in manual optimization); a checkpoint written before it is counted counts it
        state["stepping_batch_open"] = boundary = state["accumulation_position"] == 0
        if "on_train_batch_end" in hooks:
            hooks["on_train_batch_end"](self.results.detached(output), batch, batch_idx)
        if boundary and (state["batches_that_stepped"] + 1) % trainer.log_every_n_steps == 0:
            trainer._send_to_trackers(self.results.flush_step(), state["batches_that_stepped"])
        return not stop

    def _automatic(self, batch: Any, batch_idx: int, boundary: bool) -> tuple[Any, bool]:
        """Step, zero_grad, backward and (on a window's last batch) the optimizer step; returns (output, stop)."""
        trainer, state, hooks = self.trainer, self.state, self.hooks
        output = self.automatic_step(batch, batch_idx)
        loss = output if type(output) is torch.Tensor else _loss_of(output)
        check = self.check_nonfinite and loss is not None
        nonfinite = check and not bool(torch.isfinite(loss.detach()).all())  # type: ignore[union-attr]
        skip, stop = self._agree(loss is None or nonfinite, nonfinite)
        if stop:
            return output, True
        if check and trainer.agreed_nonfinite:
            _on_nonfinite(trainer, loss, batch_idx)
        if skip and loss is None and not trainer._warned_skip:
            trainer._warned_skip = True
            warnings.warn(
                f"training_step returned None for batch {batch_idx} (on at least one process), so every process skipped "
                "it: no backward, no optimizer step. Return the loss to train on it; this warning is shown once per fit",
                stacklevel=3,
            )
        position = state["accumulation_position"]
        if position == 0:  # Lightning's place: the window's first batch, after training_step
            if "on_before_zero_grad" in hooks:
                hooks["on_before_zero_grad"](self.optimizer)
            zero_grad_to_none(self.inner_optimizer)
        if not skip:
            if "on_before_backward" in hooks:
                hooks["on_before_backward"](loss)
            if self.direct and loss.dim() == 0:  # type: ignore[union-attr]
                loss.backward()  # type: ignore[union-attr]
            else:
                self.backward(loss)  # not skipped: the loss is a tensor
            if "on_after_backward" in hooks:
                hooks["on_after_backward"]()
            state["accumulated"] += 1
        state["accumulation_position"] = 0 if boundary else position + 1
        if boundary and state["accumulated"]:
            self.optimizer_step()
        return output, False

    def _in_precision(self, step: Any) -> Any:
        """`step` (``training_step``) in the precision's context (autocast, or a true precision's default dtype, with
        the batch's floating-point tensors in that dtype); `step` itself when that does nothing."""
        if self.plain_precision:
            return step
        precision = self.precision
        convert = precision.convert_input

        def step_in_precision(batch: Any, batch_idx: int) -> Any:
            with precision.forward_context():
                return step(convert(batch), batch_idx)

        return step_in_precision

    def _optimizer_step(self) -> None:
        """Unscale, clip and step the (single) optimizer, then step the schedulers; its gradients are zeroed on the
        next window's first batch, where Lightning zeroes them."""
        trainer, acc, optimizer = self.trainer, self.accelerator, self.optimizer
        if self.precision.scaler is not None:
            acc.unscale_gradients(optimizer)
        if "on_before_optimizer_step" in self.hooks:
            self.hooks["on_before_optimizer_step"](optimizer)
        if trainer.gradient_clip_val:
            params = [p for group in optimizer.param_groups for p in group["params"]]
            if trainer.gradient_clip_algorithm == "norm":
                acc.clip_grad_norm_(params, trainer.gradient_clip_val)
            else:
                acc.clip_grad_value_(params, trainer.gradient_clip_val)
        if self.direct:
            step_optimizer(self.inner_optimizer)
        else:
            optimizer.step()
        state = self.state
        state["global_step"] += 1
        state["accumulated"] = 0
        if trainer.lr_scheduler_configs and not acc.optimizer_step_was_skipped:
            step_schedulers(trainer, "step", update_plateau=True)

    def _agree(self, skip: bool, nonfinite: bool = False) -> tuple[bool, bool]:
        """`agree_flags` across processes; with one process its flags are this process's own, with no collective."""
        if self.several_processes:
            return agree_flags(self.trainer, skip, nonfinite)
        trainer = self.trainer
        trainer.agreed_nonfinite = nonfinite
        if trainer.received_signal and not trainer.agreed_signal:
            trainer.agreed_signal = trainer.received_signal
        return skip, bool(self.state["should_stop"])


class ProfiledTrainBatch(TrainBatch):
    """`TrainBatch` timing its parts for ``Trainer(profiler="simple")`` (Lightning's action names); the plain one
    reads no clock."""

    def __init__(self, trainer: Trainer) -> None:
        super().__init__(trainer)
        if trainer.profiler is None:
            raise ValueError("ProfiledTrainBatch times a Trainer(profiler='simple'); this Trainer has no profiler")
        profiler: SimpleProfiler = trainer.profiler
        self.profiler = profiler
        self.automatic_step = timed(profiler, "training_step", self.automatic_step)
        self.manual_step = timed(profiler, "training_step", self.manual_step)
        self.backward = timed(profiler, "backward", self.backward)
        self.optimizer_step = timed(profiler, "optimizer_step", self.optimizer_step)
        self.direct = False  # backward through its timer


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
            stacklevel=4,
        )


def _inner(optimizer: Any) -> Any:
    """The optimizer a prepared wrapper holds (or `optimizer` itself)."""
    return getattr(optimizer, "optimizer", optimizer)


def _loss_of(output: Any) -> torch.Tensor | None:
    if output is None or isinstance(output, torch.Tensor):
        return output
    if isinstance(output, dict) and "loss" in output:
        loss: torch.Tensor | None = output["loss"]
        return loss
    raise TypeError(
        f"training_step returned {type(output).__name__}; return the loss tensor, a dict with a 'loss' key, or None to skip the batch"
    )

