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

    Every way of firing an event goes through a function `_firing` builds, once per event and selection of hooks
    (kept for the run); the per-batch events get theirs from `caller` once per epoch.
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
        self._fires: dict[tuple[str, str], Callable[..., None]] = {}  # (event, which hooks) -> its firing function

    def has(self, event: str) -> bool:
        """True when at least one object overrides `event` (lets callers skip building arguments)."""
        return event in self._module_hooks or event in self._callback_hooks

    def call(self, event: str, *args: Any) -> None:
        """Fire `event`: each callback's hook with ``(owner, module, *args)``, then the module's with ``*args``."""
        if event in self._callback_hooks or event in self._module_hooks:
            self._fire(event, "all")(*args)

    def caller(self, event: str) -> Callable[..., None] | None:
        """A function firing `event` as `call` does, for an event fired every batch of the coming training epoch:
        its hooks are looked up now, and a callback's hook it declares idle for the epoch (``_idle_batch_hooks``,
        e.g. `ModelCheckpoint`'s per-batch hook when it saves by epoch only) is left out. None when no hook is left."""
        owner = self.owner
        callbacks = [(cb, hook) for cb, hook in self._callback_hooks.get(event, ()) if event not in cb._idle_batch_hooks(owner)]
        module_hook = self._module_hooks.get(event)
        if not callbacks and module_hook is None:
            return None
        return _firing(event, callbacks, module_hook, owner, self.module)

    def call_callbacks(self, event: str, *args: Any, monitoring: bool | None = None) -> None:
        """Fire `event` on the callbacks only: all of them, or (`monitoring` True/False) only those that do / do not
        monitor a metric (see `monitors_metrics`)."""
        if event in self._callback_hooks:
            self._fire(event, {None: "callbacks", True: "monitoring", False: "not monitoring"}[monitoring])(*args)

    def call_module(self, event: str, *args: Any) -> None:
        """Fire `event` on the module only (the loop reduces epoch metrics around the module's epoch-end hooks)."""
        if event in self._module_hooks:
            self._fire(event, "module")(*args)

    def _fire(self, event: str, which: str) -> Callable[..., None]:
        """The function firing `event` on `which` hooks: "all", "module", "callbacks", "monitoring", "not monitoring"."""
        fire = self._fires.get((event, which))
        if fire is None:
            callbacks = [] if which == "module" else self._callback_hooks.get(event, [])
            if which in ("monitoring", "not monitoring"):
                callbacks = [(cb, hook) for cb, hook in callbacks if monitors_metrics(cb) == (which == "monitoring")]
            module_hook = self._module_hooks.get(event) if which in ("all", "module") else None
            fire = self._fires[(event, which)] = _firing(event, callbacks, module_hook, self.owner, self.module)
        return fire


def _firing(event: str, callbacks: list[tuple[Callback, Callable[..., Any]]], module_hook: Callable[..., Any] | None,
            owner: Any, module: Any) -> Callable[..., None]:
    """A function calling each of `callbacks`' hooks with ``(owner, module, *args)``, then `module_hook` with ``*args``;
    an error raised in one says where in a note ("raised in callback X.event")."""

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
