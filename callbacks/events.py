"""Every event of the `Trainer` loop, in the order it fires.

The loop, in pseudocode (``fit`` with validation)::

    setup(stage="fit")
    module.configure_model()                       # module only, in the strategy's init context (meta under FSDP2)
    module.configure_optimizers()
    on_fit_start
    if num_sanity_val_steps:                       # sanity check: a few validation batches
        on_sanity_check_start
        <validation loop>
        on_sanity_check_end
    on_train_start
    for epoch in epochs:
        on_train_epoch_start
        for batch in train_loader:
            # module/DataModule only, when overridden: on_before_batch_transfer, transfer_batch_to_device,
            # on_after_batch_transfer (also for every evaluation batch)
            on_train_batch_start(batch, batch_idx)
            loss = module.training_step(batch, batch_idx)
            if first batch of an accumulation window:
                on_before_zero_grad(optimizer)
                optimizer.zero_grad()
            on_before_backward(loss)
            backward(loss)
            on_after_backward
            if accumulation boundary:
                on_before_optimizer_step(optimizer)  # gradients are unscaled here; clipping follows
                optimizer.step()
            on_train_batch_end(outputs, batch, batch_idx)
            on_log_metrics(metrics, step)            # when something was logged for this step
            if validation is due:
                <validation loop>
        on_train_epoch_end                           # metric-monitoring callbacks after the module's hook
        on_log_metrics(metrics, step)                # epoch-level metrics
    on_train_end
    on_fit_end
    teardown(stage="fit")

    <validation loop> =
        on_validation_start
        on_validation_epoch_start
        for batch in val_loader:
            on_validation_batch_start(batch, batch_idx)
            module.validation_step(batch, batch_idx)
            on_validation_batch_end(outputs, batch, batch_idx)
        on_validation_epoch_end
        on_log_metrics(metrics, step)
        on_validation_end

``test`` and ``predict`` follow the validation loop's shape with their own names. With several evaluation
loaders the batch loop runs over each in turn and the batch events get ``dataloader_idx`` too.
``on_save_checkpoint(checkpoint)`` and ``on_load_checkpoint(checkpoint)`` fire when a checkpoint is
written or restored; ``on_exception(exception)`` fires when the loop raises.

Callbacks receive ``(trainer, module, *args)`` (``trainer`` is what `callbacks.view.TrainerView` lists); the
module's own hooks receive ``(*args)``. As in Lightning, the callbacks' hooks run first, in list order (those that
set ``runs_last`` after the others), then the module's; ``on_load_checkpoint`` reaches the module first; at
``on_train_epoch_end`` the callbacks that monitor a metric (``monitors_metrics``: ``ModelCheckpoint``,
``EarlyStopping``) run after the module's hook. Only objects that override a hook are called at all. The rules are
written once, in `trainer.fit.dispatch`.
"""

from __future__ import annotations

FIT_EVENTS = (
    "setup",
    "on_fit_start",
    "on_sanity_check_start",
    "on_sanity_check_end",
    "on_train_start",
    "on_train_epoch_start",
    "on_train_batch_start",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_before_zero_grad",
    "on_train_batch_end",
    "on_train_epoch_end",
    "on_train_end",
    "on_fit_end",
    "teardown",
)

EVAL_EVENTS = tuple(
    f"on_{stage}_{point}"
    for stage in ("validation", "test", "predict")
    for point in ("start", "epoch_start", "batch_start", "batch_end", "epoch_end", "end")
)

OTHER_EVENTS = (
    "on_log_metrics",
    "on_save_checkpoint",
    "on_load_checkpoint",
    "on_exception",
)

ALL_EVENTS = FIT_EVENTS + EVAL_EVENTS + OTHER_EVENTS
"""Every event: `callbacks.base.Callback` has one no-op method per event, in this order (a test holds it to that)."""

MODULE_EVENTS = tuple(event for event in ALL_EVENTS if event not in ("on_log_metrics", "on_exception"))
"""The events `TrainModule` has a hook for (the same, without the trackers' ``on_log_metrics`` and ``on_exception``)."""
