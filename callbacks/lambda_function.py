"""`LambdaCallback`: a callback built from functions, one keyword per hook (Lightning's)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from callbacks.base import Callback

Hook = Callable[..., Any]


class LambdaCallback(Callback):
    """A callback whose hooks are the functions passed, by hook name; the others stay no-ops (and are never called).

    Each function receives what the hook does: ``(trainer, module, *args)``, as the `Callback` methods (without
    ``self``). The keywords are Lightning's, in its order, plus ``on_log_metrics`` (an event of ours).

    Example::

        trainer = Trainer(callbacks=[LambdaCallback(on_train_epoch_end=lambda trainer, module: print(trainer.current_epoch))])

    Raises:
        TypeError: a value that is neither None nor callable.
    """

    def __init__(
        self,
        setup: Hook | None = None,
        teardown: Hook | None = None,
        on_fit_start: Hook | None = None,
        on_fit_end: Hook | None = None,
        on_sanity_check_start: Hook | None = None,
        on_sanity_check_end: Hook | None = None,
        on_train_batch_start: Hook | None = None,
        on_train_batch_end: Hook | None = None,
        on_train_epoch_start: Hook | None = None,
        on_train_epoch_end: Hook | None = None,
        on_validation_epoch_start: Hook | None = None,
        on_validation_epoch_end: Hook | None = None,
        on_test_epoch_start: Hook | None = None,
        on_test_epoch_end: Hook | None = None,
        on_validation_batch_start: Hook | None = None,
        on_validation_batch_end: Hook | None = None,
        on_test_batch_start: Hook | None = None,
        on_test_batch_end: Hook | None = None,
        on_train_start: Hook | None = None,
        on_train_end: Hook | None = None,
        on_validation_start: Hook | None = None,
        on_validation_end: Hook | None = None,
        on_test_start: Hook | None = None,
        on_test_end: Hook | None = None,
        on_exception: Hook | None = None,
        on_save_checkpoint: Hook | None = None,
        on_load_checkpoint: Hook | None = None,
        on_before_backward: Hook | None = None,
        on_after_backward: Hook | None = None,
        on_before_optimizer_step: Hook | None = None,
        on_before_zero_grad: Hook | None = None,
        on_predict_start: Hook | None = None,
        on_predict_end: Hook | None = None,
        on_predict_batch_start: Hook | None = None,
        on_predict_batch_end: Hook | None = None,
        on_predict_epoch_start: Hook | None = None,
        on_predict_epoch_end: Hook | None = None,
        on_log_metrics: Hook | None = None,
    ) -> None:
        hooks = {name: fn for name, fn in locals().items() if name not in ("self", "__class__") and fn is not None}
        for name, fn in hooks.items():
            if not callable(fn):
                raise TypeError(f"LambdaCallback({name}={fn!r}) must be a function taking (trainer, module, ...) or None")
            setattr(self, name, fn)  # an instance attribute: `callbacks.base.overrides` counts it as the hook
