"""One training batch: the hot path of ``fit``.

    on_train_batch_start
    output = training_step(batch, batch_idx)       # through the wrapper's forward when the strategy wraps the model
    (automatic optimization, through the accelerator's `Stepper`)
        [on_nonfinite set: the processes agree whether to skip this batch]
        on_before_zero_grad, zero_grad             # on the first batch of an accumulation window (the module's
                                                   #   optimizer_zero_grad(epoch, batch_idx, optimizer) when it has one)
        on_before_backward, backward, on_after_backward
        on a window's last batch: unscale, on_before_optimizer_step, clip, step, schedulers
    on_train_batch_end(detached output)
    (a module overriding optimizer_step or configure_gradient_clipping, on a window's last batch, Lightning's way)
        module.optimizer_step(epoch, batch_idx, optimizer, closure)  # closure: training_step, zero_grad, backward;
        optimizer.step(closure=closure)                              #   then unscale, on_before_optimizer_step,
                                                                     #   module.configure_gradient_clipping, the step
    every log_every_n_steps windows: the step values go to the trackers
    at a window's end, when scheduled: the processes agree on stopping and preemption (`trainer.fit.agreement`)

`TrainBatch` is built once per epoch and looks up there what stays fixed for the epoch (the hooks someone
overrides, whether the precision needs a context, whether a per-batch check was asked for), so a batch runs the code
above and little else: a hook nobody overrides is not dispatched, a context that does nothing is not entered, and
no collective and no read of a device value happens unless the user asked for one (``on_nonfinite``).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from callbacks.base import overrides
from trainer.accelerator.stepper import check_loss
from trainer.fit.module import TrainModule
from trainer.fit.profiler import profile, timed
from trainer.fit.transfer import transfer_batch

if TYPE_CHECKING:
    from trainer.fit.module import ManualOptimizer
    from trainer.fit.profiler import Profiler
    from trainer.fit.trainer import Trainer

_BATCH_EVENTS = ("on_train_batch_start", "on_before_zero_grad", "on_before_backward", "on_after_backward",
                 "on_before_optimizer_step", "on_train_batch_end")


class TrainBatch:
    """Runs training batches of one epoch: ``TrainBatch(trainer)(batch, batch_idx, last)``; see the module docstring."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.state = state = trainer.run_state  # the run's state (trainer.fit.run_state): its schedulers, its position
        self.progress = state.progress  # the window and the steps, counted there
        self.accelerator = acc = trainer.accelerator
        self.stepper = acc.stepper
        self.agreement = trainer.agreement
        self.module = module = trainer.attached_module
        self.results = trainer.results
        strategy, model = acc.strategy, trainer.model_setup.model  # set up before any batch runs
        self.models = [model]
        # the step, through the wrapper's forward when the strategy needs its hooks (DDP, FSDP), else the method itself
        redirect = strategy.redirects_forward(model, module)
        self.training_step = functools.partial(strategy.call_through, model, module, "training_step") if redirect else module.training_step
        self.precision = strategy.precision
        self.plain_precision = type(strategy.precision.forward_context()) is contextlib.nullcontext
        dispatch = trainer.dispatch
        self.hooks = {event: fire for event in _BATCH_EVENTS if (fire := dispatch.caller(event)) is not None}
        # the three big parts of a batch as plain callables (ProfiledTrainBatch wraps them in its timers)
        self.automatic_step = self._in_precision(self.training_step)
        self.manual_step = self._in_precision(module.training_step)
        self.backward = self.stepper.backward
        self.optimizer_step = self._optimizer_step
        self.check_nonfinite = trainer.run_state.loss_health.policy is not None  # the opt-in per-batch agreement
        # without it: a device-side flag of the losses trained on, read where the loop synchronizes anyway
        self.loss_health = state.loss_health
        self.watch_losses = not self.check_nonfinite and not self.loss_health.warned_nonfinite
        self.optimizer: Any = state.optimizers[0] if state.optimizers else None
        # zeroes at the window's first batch, where Lightning does (the prepared wrapper would on boundaries only)
        self.inner_optimizer: Any = _inner(self.optimizer)
        self.clip_optimizers = [self.inner_optimizer] if self.optimizer is not None else []
        # Lightning's optimizer_zero_grad override runs in place of the stepper's zero_grad: decided here, once
        self.zero_grad = self._zero_grad_through_hook if overrides(module, "optimizer_zero_grad", TrainModule) else self._zero_grad
        # Lightning's optimizer_step/configure_gradient_clipping overrides, or an optimizer whose step needs the closure
        # (LBFGS): decided here, once; else the plain path
        self.custom_clipping = overrides(module, "configure_gradient_clipping", TrainModule)
        hooked = self.custom_clipping or overrides(module, "optimizer_step", TrainModule) or _needs_closure(self.inner_optimizer)
        self.automatic = self._automatic_through_hook if hooked and self.optimizer is not None else self._automatic
        if strategy.pipeline is not None and module.automatic_optimization:  # pipeline_step runs forward and backward
            if hooked:
                raise NotImplementedError(
                    f"{type(module).__name__} overrides optimizer_step or configure_gradient_clipping (or its optimizer needs a "
                    "closure), which pipeline stages cannot run: the step's backward runs inside the pipeline schedule. Use "
                    "Trainer(gradient_clip_val=...) and a plain optimizer, or manual optimization"
                )
            self.automatic = self._automatic_pipelined
        self.step_optimizer = StepOptimizer(self) if hooked and self.optimizer is not None else None

    def __call__(self, batch: Any, batch_idx: int, last: bool) -> bool:
        """Run one batch (`last`: the epoch's last, which ends an accumulation window); return False when the
        processes agreed at its end to stop."""
        trainer, progress, hooks = self.trainer, self.progress, self.hooks
        if trainer.loaders.moves_batches:
            batch = transfer_batch(trainer, batch, 0)
        self.results.begin_batch(batch, "train", True)  # step_context
        if "on_train_batch_start" in hooks:
            hooks["on_train_batch_start"](batch, batch_idx)
        stepper = self.stepper
        if self.module.automatic_optimization:
            boundary = stepper.at_position(progress.accumulation_position, last)
            if boundary:
                output = self.automatic(batch, batch_idx, boundary)
            else:  # inside an accumulation window all of it runs without gradient reduction
                with stepper.sync_context(self.models):
                    output = self.automatic(batch, batch_idx, boundary)
        else:  # the user's step drives the optimizers (self.manual_backward, opt.step())
            stepper.sync_gradients = True
            output = self.manual_step(batch, batch_idx)
        # a boundary batch (every batch in manual optimization); a checkpoint written before it is counted counts it
        boundary = progress.end_batch(batch_idx, last)
        if "on_train_batch_end" in hooks:
            hooks["on_train_batch_end"](self.results.detached(output), batch, batch_idx)
        if boundary and (progress.batches_that_stepped + 1) % trainer.log_every_n_steps == 0:
            trainer.send_to_trackers(self.results.flush_step(), progress.batches_that_stepped)
        if boundary and self.agreement.due():
            return not self.agreement.agree(self.state)
        return True

    def _automatic(self, batch: Any, batch_idx: int, boundary: bool) -> Any:
        """Step, zero_grad, backward and (on a window's last batch) the optimizer step; returns the step's output."""
        trainer, progress, hooks = self.trainer, self.progress, self.hooks
        output = self.automatic_step(batch, batch_idx)
        loss = output if type(output) is torch.Tensor else _loss_of(output)
        skip = loss is None
        if self.check_nonfinite:
            nonfinite = not skip and not bool(torch.isfinite(loss.detach()).all())  # type: ignore[union-attr]
            skip, nonfinite = self.agreement.agree_skip(skip or nonfinite, nonfinite)
            if nonfinite:
                _on_nonfinite(trainer, loss, batch_idx)
        elif skip and trainer.world_size > 1:
            raise RuntimeError(
                f"training_step returned None for batch {batch_idx} on process {trainer.global_rank} of {trainer.world_size}: "
                "the other processes cannot know it and would wait in the gradient reduction. Return the loss on every "
                "process, or pass Trainer(on_nonfinite='skip') so the processes agree every batch which batches to skip "
                "(one small all-reduce per batch)"
            )
        if skip and loss is None and not self.loss_health.warned_skip:
            self.loss_health.warned_skip = True
            warnings.warn(
                f"training_step returned None for batch {batch_idx} (on at least one process), so every process skipped "
                "it: no backward, no optimizer step. Return the loss to train on it; this warning is shown once per fit",
                stacklevel=3,
            )
        if progress.accumulation_position == 0:  # the window's first batch (Lightning's place: after training_step)
            if "on_before_zero_grad" in hooks:
                hooks["on_before_zero_grad"](self.optimizer)
            self.zero_grad(batch_idx)
        ran_backward = not skip and loss is not None  # not skipped: the loss is a tensor
        if ran_backward and loss is not None:
            if "on_before_backward" in hooks:
                hooks["on_before_backward"](loss)
            if loss.dim():
                check_loss(loss, {})
            if self.watch_losses:
                self.loss_health.watch(loss)
            self.backward(loss)
            if "on_after_backward" in hooks:
                hooks["on_after_backward"]()
        progress.advance_window(boundary, ran_backward)
        if boundary and progress.accumulated:
            self.optimizer_step()
        return output

    def _automatic_pipelined(self, batch: Any, batch_idx: int, boundary: bool) -> Any:
        """`_automatic` with pipeline stages (`trainer.fit.pipelining`): zero_grad before the step on a window's first
        batch, since ``self.pipeline_step`` in ``training_step`` computes the gradients; no backward here."""
        progress, hooks = self.progress, self.hooks
        if progress.accumulation_position == 0:
            if "on_before_zero_grad" in hooks:
                hooks["on_before_zero_grad"](self.optimizer)
            self.zero_grad(batch_idx)
        output = self.automatic_step(batch, batch_idx)
        loss = output if type(output) is torch.Tensor else _loss_of(output)
        if not isinstance(loss, torch.Tensor) or loss.requires_grad:
            raise RuntimeError(
                f"with pipeline stages, training_step must return what self.pipeline_step(x, target=y, loss_fn=...) returned "
                f"(its backward ran inside the schedule), got {type(loss).__name__}"
                f"{' with a gradient: a loss computed outside the pipeline' if isinstance(loss, torch.Tensor) else ''}"
            )
        if self.watch_losses:
            self.loss_health.watch(loss)
        if "on_after_backward" in hooks:
            hooks["on_after_backward"]()
        progress.advance_window(boundary, True)
        if boundary and progress.accumulated:
            self.optimizer_step()
        return output

    def _zero_grad(self, batch_idx: int) -> None:
        self.stepper.zero_grad(self.inner_optimizer)

    def _zero_grad_through_hook(self, batch_idx: int) -> None:
        """The module's ``optimizer_zero_grad(epoch, batch_idx, optimizer)``, with the torch optimizer (Lightning hands
        it the strategy's optimizer, not the step wrapper)."""
        self.module.optimizer_zero_grad(self.state.current_epoch, batch_idx, self.inner_optimizer)

    def _automatic_through_hook(self, batch: Any, batch_idx: int, boundary: bool) -> Any:
        """`_automatic` for a module overriding ``optimizer_step`` (or ``configure_gradient_clipping``), as Lightning
        runs it: inside a window the batch runs as usual; on its last batch the module's ``optimizer_step(epoch,
        batch_idx, optimizer, optimizer_closure)`` runs, and the closure it hands to ``optimizer.step`` runs
        ``training_step``, ``zero_grad`` and backward. `global_step` counts the hook's call, as Lightning's."""
        if not boundary:
            return self._automatic(batch, batch_idx, boundary)
        progress, outputs = self.progress, []
        position = progress.accumulation_position

        def optimizer_closure() -> Any:
            """``training_step`` + ``zero_grad`` (on a window's first batch) + backward; returns the loss."""
            progress.rewind_window(position)  # an optimizer that calls the closure again (LBFGS) reruns the batch
            outputs.append(self._automatic(batch, batch_idx, False))  # False: the step is the hook's
            progress.advance_window(True, False)
            output = outputs[-1]
            return output if type(output) is torch.Tensor else _loss_of(output)

        step_optimizer = self.step_optimizer
        assert step_optimizer is not None  # built with this method's choice in __init__
        self.module.optimizer_step(self.state.current_epoch, batch_idx, step_optimizer, optimizer_closure)
        if not outputs:
            raise RuntimeError(
                f"{type(self.module).__name__}.optimizer_step(epoch, batch_idx, optimizer, optimizer_closure) did not run "
                "optimizer_closure, so training_step never ran for this batch. Call optimizer.step(closure=optimizer_closure) "
                "(or optimizer_closure() where it skips the step), as Lightning requires"
            )
        progress.count_step()
        if self.state.lr_scheduler_configs and not self.optimizer.step_was_skipped:
            step_schedulers(self.trainer, "step", update_plateau=True)
        return outputs[-1]

    def before_step(self) -> None:
        """What runs between the closure and the optimizer's update in Lightning's precision plugin: unscale,
        ``on_before_optimizer_step``, then the module's ``configure_gradient_clipping`` (or the Trainer's clipping)."""
        trainer, optimizer = self.trainer, self.optimizer
        self.stepper.unscale(self.clip_optimizers)
        if "on_before_optimizer_step" in self.hooks:
            self.hooks["on_before_optimizer_step"](optimizer)
        if self.custom_clipping:
            self.module.configure_gradient_clipping(optimizer, trainer.gradient_clip_val, trainer.gradient_clip_algorithm)
        elif trainer.gradient_clip_val:
            self.module.clip_gradients(optimizer, trainer.gradient_clip_val, trainer.gradient_clip_algorithm)

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
        trainer, stepper, optimizer = self.trainer, self.stepper, self.optimizer
        stepper.unscale(self.clip_optimizers)
        if "on_before_optimizer_step" in self.hooks:
            self.hooks["on_before_optimizer_step"](optimizer)
        if trainer.gradient_clip_val:
            params = [p for group in optimizer.param_groups for p in group["params"]]
            if trainer.gradient_clip_algorithm == "norm":
                stepper.clip_grad_norm_(params, trainer.gradient_clip_val, 2.0, self.clip_optimizers)
            else:
                stepper.clip_grad_value_(params, trainer.gradient_clip_val, self.clip_optimizers)
        optimizer.step()  # the prepared optimizer: the stepper's step, and its fp16 skipped flag
        self.progress.count_step()
        if self.state.lr_scheduler_configs and not optimizer.step_was_skipped:
            step_schedulers(trainer, "step", update_plateau=True)


class StepOptimizer:
    """The optimizer a module's ``optimizer_step`` override gets (Lightning's ``LightningOptimizer``): ``step(closure)``
    runs the closure, then `TrainBatch.before_step`, then the update; everything else (``param_groups``, ``state``,
    ...) is the prepared optimizer's.

    Where the step is plain torch (`Stepper.plain`: no loss scaler, no strategy step of its own) the closure runs
    inside the optimizer's own ``step`` (an optimizer such as LBFGS may call it again), as in Lightning's full
    precision; otherwise (fp16 loss scaling, DeepSpeed's engine stepping in its backward, XLA reducing gradients
    before its step) it runs first and the update follows, as in Lightning's mixed precision.
    """

    def __init__(self, batch: TrainBatch) -> None:
        self.batch = batch
        self.optimizer = batch.optimizer  # Lightning's `optimizer.optimizer`: the wrapped optimizer
        self.closure_first = not batch.stepper.plain

    def step(self, closure: Any = None) -> Any:
        """Run `closure` (training_step, zero_grad, backward), then unscale, ``on_before_optimizer_step`` and clipping,
        then update the parameters; returns what the closure returned."""
        batch, result = self.batch, None

        def closure_then_before_step() -> Any:
            nonlocal result
            result = closure() if closure is not None else None
            batch.before_step()
            return result

        if self.closure_first:
            closure_then_before_step()
            if batch.progress.accumulated:  # a step whose backward was skipped is not taken (Lightning's AMP)
                self.optimizer.step()
        else:
            self.optimizer.step(closure_then_before_step)
        return result

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.optimizer, name)

    def __repr__(self) -> str:
        return f"StepOptimizer({self.optimizer!r})"


class ProfiledTrainBatch(TrainBatch):
    """`TrainBatch` timing its parts for ``Trainer(profiler="simple")`` (Lightning's action names); the plain one
    reads no clock."""

    def __init__(self, trainer: Trainer) -> None:
        super().__init__(trainer)
        if trainer.profiler is None:
            raise ValueError("ProfiledTrainBatch times a Trainer(profiler='simple'); this Trainer has no profiler")
        profiler: Profiler = trainer.profiler
        self.profiler = profiler
        profiler.epoch_batches = trainer.num_training_batches
        self.automatic_step = timed(profiler, "training_step", self.automatic_step)
        self.manual_step = timed(profiler, "training_step", self.manual_step)
        self.backward = timed(profiler, "backward", self.backward)
        self.optimizer_step = timed(profiler, "optimizer_step", self.optimizer_step)


def step_schedulers(trainer: Trainer, interval: str, *, update_plateau: bool) -> None:
    """Step the schedulers configured for `interval` ("step" or "epoch") whose frequency is due."""
    state = trainer.run_state
    count = state.global_step if interval == "step" else state.current_epoch + 1
    module = trainer.attached_module
    for config in state.lr_scheduler_configs:
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
    state = trainer.run_state
    where = f"step {state.global_step}, epoch {state.current_epoch}, batch {batch_idx}"
    if trainer.run_state.loss_health.policy == "stop":
        bad = next((name for name, p in trainer.attached_module.named_parameters() if not bool(torch.isfinite(p.detach()).all())), None)
        weights = f"parameter {bad!r} is already non-finite" if bad else "the parameters are still finite"
        raise FloatingPointError(
            f"the training loss is not finite at {where} ({'this process: ' + repr(value) if local else 'on another process'}); "
            f"{weights}. Nothing was stepped and saved checkpoints are intact. Lower the learning rate, clip gradients "
            "(gradient_clip_val=...), use bf16 instead of fp16, or Trainer(on_nonfinite='skip') to skip such batches"
        )
    state.loss_health.skipped += 1
    if state.loss_health.skipped == 1:
        warnings.warn(
            f"the training loss is not finite at {where}; every process skipped the batch (on_nonfinite='skip'). "
            "trainer.nonfinite_skipped counts them; this warning is shown once per fit",
            stacklevel=4,
        )


def _needs_closure(optimizer: object) -> bool:
    """Whether `optimizer`'s ``step`` cannot run without a closure (``torch.optim.LBFGS``)."""
    step = getattr(optimizer, "step", None)
    try:
        parameter = inspect.signature(step).parameters.get("closure") if step is not None else None
    except (TypeError, ValueError):
        return False
    return parameter is not None and parameter.default is inspect.Parameter.empty


def _inner(optimizer: torch.optim.Optimizer | None) -> Any:
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


# manual optimization ------------------------------------------------------------------------------------
def manual_backward(trainer: Trainer, loss: torch.Tensor, **kwargs: Any) -> None:
    """``TrainModule.manual_backward``: backward between ``on_before_backward``/``on_after_backward``, as in automatic
    optimization.

    The step ran outside the wrapper's forward, so the strategy arms its gradient sync first.
    """
    trainer.dispatch.call("on_before_backward", loss)
    trainer.accelerator.strategy.prepare_for_backward(trainer.model_setup.model, loss)
    with profile(trainer, "backward"):
        trainer.accelerator.backward(loss, **kwargs)
    health = trainer.run_state.loss_health
    if health.policy is None and not health.warned_nonfinite:
        health.watch(loss)  # (after the backward, which refuses a loss that is not a scalar)
    trainer.dispatch.call("on_after_backward")


def step_manual_optimizer(trainer: Trainer, optimizer: ManualOptimizer, closure: Callable[[], Any] | None = None) -> None:
    """``opt.step(closure)`` in manual optimization: ``on_before_optimizer_step(opt)`` on the callbacks and the module,
    the prepared optimizer's step, and one more `global_step`, as in Lightning. With a `closure` the hook runs after it
    (inside the optimizer's step), as Lightning's precision plugin does."""
    dispatch = trainer.dispatch
    if closure is None:
        dispatch.call("on_before_optimizer_step", optimizer)
        optimizer.optimizer.step()
    else:
        def closure_then_hook() -> Any:
            result = closure()
            dispatch.call("on_before_optimizer_step", optimizer)
            return result

        optimizer.optimizer.step(closure=closure_then_hook)
    trainer.run_state.progress.count_step()
