"""``Trainer(profiler="simple")``: wall time of the main actions and hooks of a ``fit``, as Lightning's ``SimpleProfiler``.

    trainer = Trainer(profiler="simple")
    trainer.fit(module)          # prints the summary at the end of fit (main process)
    trainer.profiler.recorded    # {"training_step": [0.0012, ...], "[Callback]ModelCheckpoint.on_train_epoch_end": [...], ...}

The loops time actions only through `profile`, which returns a shared no-op context when the profiler is off, and
hooks through `ProfiledDispatcher`, used instead of `HookDispatcher` only when the profiler is on: the default
per-step path does not read the clock.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from callbacks.base import Callback
from trainer.fit.dispatch import HookDispatcher

_OFF = contextlib.nullcontext()


class SimpleProfiler:
    """Records ``time.perf_counter`` durations per action name and formats them as a table."""

    def __init__(self) -> None:
        self.recorded: dict[str, list[float]] = {}
        self._started = time.perf_counter()

    def reset(self) -> None:
        self.recorded.clear()
        self._started = time.perf_counter()

    @contextlib.contextmanager
    def time(self, action: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.recorded.setdefault(action, []).append(time.perf_counter() - start)

    def summary(self) -> str:
        """One row per action: mean and total seconds, calls, and the share of the time since `reset`."""
        total = max(time.perf_counter() - self._started, 1e-12)
        rows = sorted(self.recorded.items(), key=lambda item: -sum(item[1]))
        width = max([len("Action"), *(len(name) for name in self.recorded)])
        lines = ["Profiler report (profiler='simple')",
                 f"{'Action':<{width}}  {'Mean (s)':>10}  {'Calls':>7}  {'Total (s)':>10}  {'Percent':>8}",
                 f"{'Total':<{width}}  {'-':>10}  {'-':>7}  {total:>10.4f}  {100.0:>7.1f}%"]
        for name, times in rows:
            lines.append(f"{name:<{width}}  {sum(times) / len(times):>10.6f}  {len(times):>7}  {sum(times):>10.4f}  "
                         f"{100 * sum(times) / total:>7.1f}%")
        return "\n".join(lines)


def profile(trainer: Any, action: str) -> Any:
    """A context timing `action` when ``trainer.profiler`` is on; a shared no-op context otherwise."""
    profiler = trainer.profiler
    return _OFF if profiler is None else profiler.time(action)


class ProfiledDispatcher(HookDispatcher):
    """A `HookDispatcher` that times each hook it calls, named as Lightning's profiler names them
    (``[Callback]ModelCheckpoint.on_validation_end``, ``[LightningModule]Model.on_train_epoch_end``)."""

    def __init__(self, module: Any, module_base: type, callbacks: Sequence[Callback], owner: Any, profiler: SimpleProfiler) -> None:
        super().__init__(module, module_base, callbacks, owner)
        name = type(module).__name__
        self._module_hooks = {event: timed(profiler, f"[LightningModule]{name}.{event}", hook) for event, hook in self._module_hooks.items()}
        self._callback_hooks = {
            event: [(cb, timed(profiler, f"[Callback]{type(cb).__name__}.{event}", method)) for cb, method in hooks]
            for event, hooks in self._callback_hooks.items()
        }


def timed(profiler: SimpleProfiler, action: str, hook: Callable[..., Any]) -> Callable[..., Any]:
    """`hook`, timed under `action` by `profiler` at every call."""

    def timed_hook(*args: Any) -> Any:
        with profiler.time(action):
            return hook(*args)

    return timed_hook
