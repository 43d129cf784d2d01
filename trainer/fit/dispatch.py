"""Hook dispatch: call one event on the callbacks, then on the module, cheaply (Lightning's order).

The dispatcher is built once per run (`fit`, `validate`, ...). For every event it precomputes the list of
bound methods to call: each callback's in list order, with callbacks whose class sets ``_runs_last = True``
(checkpointing) moved behind the others, then the module's hook (without the ``trainer, module`` arguments).
Objects that do not override a hook are left out, so an unused event costs one dict lookup.

At the end of a training epoch the loop splits the callbacks as Lightning does: those that monitor a metric
(class attribute ``_monitors_metrics = True``: `ModelCheckpoint`, `EarlyStopping`) run after the module's
``on_train_epoch_end``, so they see what it logs; the others run before it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from callbacks.base import Callback
from callbacks.events import ALL_EVENTS


def add_note(err: BaseException, note: str) -> None:
    """Attach `note` to `err` (shown under the traceback; Python 3.11+, ignored before)."""
    if hasattr(err, "add_note"):
        err.add_note(note)


def order_callbacks(callbacks: Iterable[Callback]) -> list[Callback]:
    """Return `callbacks` in dispatch order: list order, with ``_runs_last`` callbacks moved to the end."""
    callbacks = list(callbacks)
    first = [cb for cb in callbacks if not getattr(cb, "_runs_last", False)]
    last = [cb for cb in callbacks if getattr(cb, "_runs_last", False)]
    return first + last


def monitors_metrics(callback: Callback) -> bool:
    """True for a callback that decides on a logged metric (checkpointing, early stopping): it sets ``_monitors_metrics``."""
    return bool(getattr(callback, "_monitors_metrics", False))


def _overrides(obj: Any, name: str, base: type) -> bool:
    """True when `obj`'s class defines `name` differently from `base` (or `base` lacks it)."""
    impl = getattr(type(obj), name, None)
    if impl is None or not callable(impl):
        return False
    return impl is not getattr(base, name, None)


class HookDispatcher:
    """Calls events on a module and a list of callbacks.

    Args:
        module: the user's module (its hooks take no ``trainer, module`` arguments); None to skip it.
        module_base: the class whose no-op hooks mean "not overridden" for the module.
        callbacks: callbacks, already in the order they should run (see `order_callbacks`); they run before the module.
        owner: the object passed as ``trainer`` to callback hooks.
    """

    def __init__(self, module: Any, module_base: type, callbacks: Sequence[Callback], owner: Any) -> None:
        self.module = module
        self.callbacks = list(callbacks)
        self.owner = owner
        self._module_hooks: dict[str, Callable[..., Any]] = {}
        self._callback_hooks: dict[str, list[tuple[Callback, Callable[..., Any]]]] = {}
        for event in ALL_EVENTS:
            if module is not None and _overrides(module, event, module_base):
                self._module_hooks[event] = getattr(module, event)
            hooks = [(cb, getattr(cb, event)) for cb in self.callbacks if _overrides(cb, event, Callback)]
            if hooks:
                self._callback_hooks[event] = hooks

    def has(self, event: str) -> bool:
        """True when at least one object overrides `event` (lets callers skip building arguments)."""
        return event in self._module_hooks or event in self._callback_hooks

    def call(self, event: str, *args: Any) -> None:
        """Fire `event`: each callback's hook with ``(owner, module, *args)``, then the module's with ``*args``."""
        if event in self._callback_hooks:
            self.call_callbacks(event, *args)
        if event in self._module_hooks:
            self.call_module(event, *args)

    def caller(self, event: str) -> Callable[..., None] | None:
        """A function firing `event` as `call` does, its hooks looked up now (for events fired every batch, where
        the lookups of `call` add up); None when nothing overrides `event`."""
        callbacks, module_hook = self._callback_hooks.get(event, []), self._module_hooks.get(event)
        if not callbacks and module_hook is None:
            return None
        owner, module, call_module = self.owner, self.module, self.call_module

        def fire(*args: Any) -> None:
            for callback, method in callbacks:
                try:
                    method(owner, module, *args)
                except Exception as err:
                    add_note(err, f"raised in callback {type(callback).__name__}.{event}")
                    raise
            if module_hook is not None:
                call_module(event, *args)

        return fire

    def call_callbacks(self, event: str, *args: Any, monitoring: bool | None = None) -> None:
        """Fire `event` on the callbacks only: all of them, or (`monitoring` True/False) only those that do / do not
        monitor a metric (see `monitors_metrics`)."""
        for callback, method in self._callback_hooks.get(event, ()):
            if monitoring is not None and monitors_metrics(callback) != monitoring:
                continue
            try:
                method(self.owner, self.module, *args)
            except Exception as err:
                add_note(err, f"raised in callback {type(callback).__name__}.{event}")
                raise

    def call_module(self, event: str, *args: Any) -> None:
        """Fire `event` on the module only (the loop reduces epoch metrics around the module's epoch-end hooks)."""
        hook = self._module_hooks.get(event)
        if hook is not None:
            try:
                hook(*args)
            except Exception as err:
                add_note(err, f"raised in the module's hook {type(self.module).__name__}.{event}")
                raise
