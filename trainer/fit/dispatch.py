"""Hook dispatch: every event of `callbacks.events` reaches the callbacks and the module through `HookDispatcher`.

The rules, Lightning's:

1. The callbacks run first, in list order, with those whose class sets ``runs_last = True`` (checkpointing) moved
   behind the others (`order_callbacks`, once, when the Trainer is built); then the module's hook (without the
   ``trainer, module`` arguments).
2. ``on_load_checkpoint`` is the exception: the module's hook runs first (`MODULE_FIRST`).
3. At the end of a training epoch the loop splits the callbacks: those that monitor a metric (class attribute
   ``monitors_metrics = True``: `ModelCheckpoint`, `EarlyStopping`) run after the module's ``on_train_epoch_end``,
   so they see what it logs; the others run before it (`HookDispatcher.call_callbacks` with `monitoring`).
4. Only objects whose class overrides a hook are called (`callbacks.base.overrides`). The dispatcher is built once
   per run (`fit`, `validate`, ...) and precomputes the bound methods of every event, so an unused event costs one
   dict lookup; the per-batch events are bound once per epoch (`HookDispatcher.caller`), without the hooks a callback
   declares idle for it (`Callback.idle_batch_hooks`).
5. An exception raised in a hook gets a note naming the callback (or the module) and the hook.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from callbacks.base import Callback, overrides
from callbacks.events import ALL_EVENTS
from trainer.fit.module import TrainModule

if TYPE_CHECKING:
    from callbacks.view import TrainerView

_EVENTS = frozenset(ALL_EVENTS)

MODULE_FIRST = frozenset({"on_load_checkpoint"})
"""Events whose module hook runs before the callbacks' (Lightning restores the module's part first)."""


def check_event(event: str) -> None:
    """An event name not in `callbacks.events.ALL_EVENTS` is a `ValueError` (it would fire nothing, silently)."""
    if event not in _EVENTS:
        import difflib

        close = difflib.get_close_matches(event, ALL_EVENTS, n=1)
        raise ValueError(f"no event is called {event!r}" + (f"; did you mean {close[0]!r}?" if close else "")
                         + " (the events are callbacks.events.ALL_EVENTS)")


def add_note(err: BaseException, note: str) -> None:
    """Attach `note` to `err` (shown under the traceback; Python 3.11+, ignored before)."""
    if hasattr(err, "add_note"):
        err.add_note(note)


def order_callbacks(callbacks: Iterable[Callback]) -> list[Callback]:
    """Return `callbacks` in dispatch order: list order, with ``runs_last`` callbacks moved to the end."""
    callbacks = list(callbacks)
    return [cb for cb in callbacks if not cb.runs_last] + [cb for cb in callbacks if cb.runs_last]


def with_module_callbacks(callbacks: Sequence[Callback], module_callbacks: Any) -> list[Callback]:
    """`callbacks` with those of the module's ``configure_callbacks()`` (a callback or a sequence), in dispatch order:
    a module callback replaces the Trainer's of its class or of a class it derives from (Lightning's rule)."""
    if not module_callbacks:
        return list(callbacks)
    added = list(module_callbacks) if isinstance(module_callbacks, Sequence) else [module_callbacks]
    replaced = {type(cb) for cb in callbacks if type(cb) is not Callback and any(isinstance(new, type(cb)) for new in added)}
    return order_callbacks([*(cb for cb in callbacks if type(cb) not in replaced), *added])


class HookDispatcher:
    """Calls events on a module and a list of callbacks.

    Args:
        module: the user's module (its hooks take no ``trainer, module`` arguments); None to skip it.
        module_base: the class whose no-op hooks mean "not overridden" for the module.
        callbacks: callbacks, already in the order they should run (see `order_callbacks`); they run before the module
            (after it for the events of `MODULE_FIRST`).
        owner: the object passed as ``trainer`` to callback hooks.

    Every way of firing an event goes through a function `_firing` builds, once per event and selection of hooks
    (kept for the run); the per-batch events get theirs from `caller` once per epoch.
    """

    def __init__(self, module: TrainModule | None, module_base: type, callbacks: Sequence[Callback], owner: TrainerView) -> None:
        self.module = module
        self.callbacks = list(callbacks)
        self.owner = owner
        self._module_hooks: dict[str, Callable[..., Any]] = {}
        self._callback_hooks: dict[str, list[tuple[Callback, Callable[..., Any]]]] = {}
        for event in ALL_EVENTS:
            if overrides(module, event, module_base):
                self._module_hooks[event] = getattr(module, event)
            hooks = [(cb, getattr(cb, event)) for cb in self.callbacks if overrides(cb, event, Callback)]
            if hooks:
                self._callback_hooks[event] = hooks
        self._fires: dict[tuple[str, str], Callable[..., None]] = {}  # (event, which hooks) -> its firing function

    def has(self, event: str) -> bool:
        """True when at least one object overrides `event` (lets callers skip building arguments)."""
        if event in self._module_hooks or event in self._callback_hooks:
            return True
        check_event(event)
        return False

    def call(self, event: str, *args: Any) -> None:
        """Fire `event`: each callback's hook with ``(owner, module, *args)``, then the module's with ``*args``
        (the module's first for the events of `MODULE_FIRST`)."""
        if event in self._callback_hooks or event in self._module_hooks:
            self._fire(event, "all")(*args)
        else:
            check_event(event)

    def caller(self, event: str) -> Callable[..., None] | None:
        """A function firing `event` as `call` does, for an event fired every batch of the coming training epoch:
        its hooks are looked up now, and a callback's hook it declares idle for the epoch (``idle_batch_hooks``,
        e.g. `ModelCheckpoint`'s per-batch hook when it saves by epoch only) is left out. None when no hook is left."""
        check_event(event)
        owner = self.owner
        callbacks = [(cb, hook) for cb, hook in self._callback_hooks.get(event, ()) if event not in cb.idle_batch_hooks(owner)]
        module_hook = self._module_hooks.get(event)
        if not callbacks and module_hook is None:
            return None
        return _firing(event, callbacks, module_hook, owner, self.module)

    def call_callbacks(self, event: str, *args: Any, monitoring: bool | None = None) -> None:
        """Fire `event` on the callbacks only: all of them, or (`monitoring` True/False) only those that do / do not
        monitor a metric (``Callback.monitors_metrics``)."""
        if event in self._callback_hooks:
            self._fire(event, {None: "callbacks", True: "monitoring", False: "not monitoring"}[monitoring])(*args)
        else:
            check_event(event)

    def call_module(self, event: str, *args: Any) -> None:
        """Fire `event` on the module only (the loop reduces epoch metrics around the module's epoch-end hooks)."""
        if event in self._module_hooks:
            self._fire(event, "module")(*args)
        else:
            check_event(event)

    def _fire(self, event: str, which: str) -> Callable[..., None]:
        """The function firing `event` on `which` hooks: "all", "module", "callbacks", "monitoring", "not monitoring"."""
        fire = self._fires.get((event, which))
        if fire is None:
            callbacks = [] if which == "module" else self._callback_hooks.get(event, [])
            if which in ("monitoring", "not monitoring"):
                callbacks = [(cb, hook) for cb, hook in callbacks if cb.monitors_metrics == (which == "monitoring")]
            module_hook = self._module_hooks.get(event) if which in ("all", "module") else None
            fire = self._fires[(event, which)] = _firing(event, callbacks, module_hook, self.owner, self.module)
        return fire


def _firing(event: str, callbacks: list[tuple[Callback, Callable[..., Any]]], module_hook: Callable[..., Any] | None,
            owner: TrainerView, module: TrainModule | None) -> Callable[..., None]:
    """A function calling each of `callbacks`' hooks with ``(owner, module, *args)``, then `module_hook` with ``*args``
    (`module_hook` first for an event of `MODULE_FIRST`); an error raised in one says where in a note ("raised in
    callback X.event")."""
    if event in MODULE_FIRST and module_hook is not None:
        call_module, call_callbacks = _callbacks_then_module(event, [], module_hook, owner, module), _callbacks_then_module(
            event, callbacks, None, owner, module)

        def module_first(*args: Any) -> None:
            call_module(*args)
            call_callbacks(*args)

        return module_first
    return _callbacks_then_module(event, callbacks, module_hook, owner, module)


def _callbacks_then_module(event: str, callbacks: list[tuple[Callback, Callable[..., Any]]], module_hook: Callable[..., Any] | None,
                           owner: TrainerView, module: TrainModule | None) -> Callable[..., None]:
    def fire(*args: Any) -> None:
        for callback, hook in callbacks:
            try:
                hook(owner, module, *args)
            except Exception as err:
                add_note(err, f"raised in callback {type(callback).__name__}.{event}")
                raise
        if module_hook is not None:
            try:
                module_hook(*args)
            except Exception as err:
                add_note(err, f"raised in the module's hook {type(module).__name__}.{event}")
                raise

    return fire


def refuse_hooks_not_called(module: TrainModule) -> None:
    """Lightning hooks this Trainer never calls: a module overriding one is refused rather than run without it."""
    if overrides(module, "backward", TrainModule):
        raise NotImplementedError(
            f"{type(module).__name__} defines backward(loss, ...), a Lightning hook this Trainer does not call: the backward "
            "(loss scaling, gradient sync, a DeepSpeed engine's step) belongs to the strategy. Move its work to "
            "on_before_backward/on_after_backward, or use manual optimization (self.manual_backward(loss, ...))"
        )
    if overrides(module, "on_validation_model_zero_grad", TrainModule):
        raise NotImplementedError(
            f"{type(module).__name__} defines on_validation_model_zero_grad(), a Lightning hook this Trainer does not call: "
            "validation leaves the gradients alone (it may run inside an accumulation window). Zero them in "
            "on_validation_start if you need to"
        )
