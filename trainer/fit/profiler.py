"""``Trainer(profiler=...)``: Lightning's profilers, timing the main actions and hooks of a ``fit``.

    trainer = Trainer(profiler="simple")     # or "advanced", "pytorch", or SimpleProfiler(...)/AdvancedProfiler(...)/PyTorchProfiler(...)
    trainer.fit(module)                      # the summary at the end of fit: printed (rank 0), or written to
                                             # <dirpath>/fit-<filename>[-<rank>].txt when `filename` is given
    trainer.profiler.recorded                # SimpleProfiler: {"training_step": [0.0012, ...], "[Callback]...": [...]}

Each profiler is a `Profiler` (Lightning's interface: ``start``/``stop``/``profile``/``summary``/``describe``,
``setup``/``teardown``, ``dirpath``/``filename``). The loops time actions only through `profile`, which returns a shared
no-op context when the profiler is off, and hooks through `ProfiledDispatcher`, used instead of `HookDispatcher` only
when the profiler is on: the default per-step path does not read the clock. ``PyTorchProfiler`` (torch.profiler traces)
lives in `trainer.fit.torch_profiler`.
"""

from __future__ import annotations

import contextlib
import cProfile
import io
import math
import os
import pstats
import re
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from callbacks.base import Callback
from trainer.fit.dispatch import HookDispatcher

if TYPE_CHECKING:
    from callbacks.view import TrainerView
    from trainer.fit.module import TrainModule
    from trainer.fit.trainer import Trainer

_OFF = contextlib.nullcontext()


class Profiler:
    """Lightning's profiler interface: time named actions with ``start``/``stop`` (or the ``profile`` context) and
    report them with ``summary``; ``describe`` writes the summary where `filename` and `dirpath` say.

    Args:
        dirpath: the directory of the files written (the summary, traces); None: the Trainer's ``log_dir``.
        filename: the summary goes to ``<dirpath>/<stage>-<filename>[-<rank>].txt`` instead of standard output.
    """

    def __init__(self, dirpath: str | os.PathLike[str] | None = None, filename: str | None = None) -> None:
        self.dirpath = dirpath
        self.filename = filename
        self._stage: str | None = None
        self._local_rank: int | None = None
        self.epoch_batches: int | float = math.inf  # the running epoch's training batches, set by the loop

    def start(self, action_name: str) -> None:
        """Begin timing `action_name`."""

    def stop(self, action_name: str) -> None:
        """End timing `action_name`."""

    def summary(self) -> str:
        """The report of what was recorded; empty when nothing was."""
        return ""

    @contextlib.contextmanager
    def profile(self, action_name: str) -> Iterator[str]:
        """Time the block as `action_name` (``start`` on entry, ``stop`` on exit)."""
        try:
            self.start(action_name)
            yield action_name
        finally:
            self.stop(action_name)

    def time(self, action_name: str) -> contextlib.AbstractContextManager[Any]:
        """The context the loops time `action_name` with (``profile``)."""
        return self.profile(action_name)

    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | None = None) -> None:
        """Called by the Trainer before `stage` runs: `local_rank` names the files (None in one process), `log_dir`
        is the directory used when ``dirpath`` is None."""
        self._stage = stage
        self._local_rank = local_rank
        self.dirpath = self.dirpath or log_dir

    def teardown(self, stage: str | None) -> None:
        """Called after `stage`: release what the profiler holds."""

    def describe(self) -> None:
        """Write the summary (to ``<dirpath>/<stage>-<filename>[-<rank>].txt`` with `filename`, else printed on
        rank 0), then ``teardown``."""
        text = self.summary()
        if text and self.filename and self.dirpath:
            os.makedirs(self.dirpath, exist_ok=True)
            with open(os.path.join(self.dirpath, self._prepare_filename()), "a", encoding="utf-8") as stream:
                stream.write(text)
        elif text and self._local_rank in (None, 0):
            print(text)
        self.teardown(self._stage)

    @property
    def local_rank(self) -> int:
        return 0 if self._local_rank is None else self._local_rank

    def _prepare_filename(self, action_name: str | None = None, extension: str = ".txt") -> str:
        """``<stage>-<filename>-<rank>-<action>`` + `extension`, path-unsafe characters replaced (Lightning's)."""
        parts = [self._stage, self.filename, None if self._local_rank is None else str(self._local_rank), action_name]
        base = re.sub(r"_+", "_", re.sub(r"[\\/:*?\"<>|\n\r\t]", "_", "-".join(p for p in parts if p))).strip()
        return (base or "profile") + extension

    def _stats_to_str(self, stats: dict[str, str]) -> str:
        lines = [(f"{self._stage.upper()} " if self._stage else "") + "Profiler Report"]
        for action, value in stats.items():
            lines += [f"Profile stats for: {action}" + (f" rank: {self._local_rank}" if self._local_rank is not None else ""), value]
        return os.linesep.join(lines)


class PassThroughProfiler(Profiler):
    """Records nothing (Lightning's default profiler object); ``Trainer(profiler=None)`` uses no profiler at all."""


class SimpleProfiler(Profiler):
    """Records ``time.perf_counter`` durations per action name and formats them as a table.

    Args:
        dirpath, filename: see `Profiler`.
        extended: accepted for Lightning's signature; the table always has the mean, calls, total and share.
    """

    def __init__(self, dirpath: str | os.PathLike[str] | None = None, filename: str | None = None, extended: bool = True) -> None:
        super().__init__(dirpath=dirpath, filename=filename)
        self.extended = extended
        self.recorded: dict[str, list[float]] = {}
        self._current: dict[str, float] = {}
        self._started = time.perf_counter()

    def reset(self) -> None:
        self.recorded.clear()
        self._current.clear()
        self._started = time.perf_counter()

    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | None = None) -> None:
        super().setup(stage, local_rank, log_dir)
        self.reset()

    def start(self, action_name: str) -> None:
        if action_name in self._current:
            raise ValueError(f"Attempted to start {action_name} which has already started.")
        self._current[action_name] = time.perf_counter()

    def stop(self, action_name: str) -> None:
        end = time.perf_counter()
        if action_name not in self._current:
            raise ValueError(f"Attempting to stop recording an action ({action_name}) which was never started.")
        self.recorded.setdefault(action_name, []).append(end - self._current.pop(action_name))

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


class AdvancedProfiler(Profiler):
    """``cProfile`` per action (Lightning's): the summary has, per action, ``pstats`` sorted by cumulative time.

    Actions nest (an epoch holds its steps) and one interpreter runs one ``cProfile`` at a time, so while an inner
    action runs the outer one is paused: an action's figures leave out the actions timed inside it.

    Args:
        dirpath, filename: see `Profiler`.
        line_count_restriction: how many lines of each action's stats to keep (an int, or a fraction of them).
        dump_stats: also write each action's raw stats to ``<dirpath>/<stage>-<filename>-<rank>-<action>.prof``.
    """

    def __init__(self, dirpath: str | os.PathLike[str] | None = None, filename: str | None = None,
                 line_count_restriction: float = 1.0, dump_stats: bool = False) -> None:
        super().__init__(dirpath=dirpath, filename=filename)
        self.profiled_actions: dict[str, cProfile.Profile] = {}
        self.line_count_restriction = line_count_restriction
        self.dump_stats = dump_stats
        self._active: list[cProfile.Profile] = []

    def start(self, action_name: str) -> None:
        if self._active:
            self._active[-1].disable()
        profile = self.profiled_actions.setdefault(action_name, cProfile.Profile())
        self._active.append(profile)
        profile.enable()

    def stop(self, action_name: str) -> None:
        profile = self.profiled_actions.get(action_name)
        if profile is None:
            raise ValueError(f"Attempting to stop recording an action ({action_name}) which was never started.")
        profile.disable()
        if self._active and self._active[-1] is profile:
            self._active.pop()
            if self._active:
                self._active[-1].enable()

    def summary(self) -> str:
        stats = {}
        for action, profile in self.profiled_actions.items():
            if self.dump_stats and self.dirpath:
                os.makedirs(self.dirpath, exist_ok=True)
                profile.dump_stats(os.path.join(self.dirpath, self._prepare_filename(action_name=action, extension=".prof")))
            stream = io.StringIO()
            pstats.Stats(profile, stream=stream).strip_dirs().sort_stats("cumulative").print_stats(self.line_count_restriction)
            stats[action] = stream.getvalue()
        return self._stats_to_str(stats)

    def teardown(self, stage: str | None) -> None:
        for profile in self._active:
            profile.disable()
        self._active = []
        self.profiled_actions = {}


def profile(trainer: Trainer, action: str) -> Any:
    """A context timing `action` when ``trainer.profiler`` is on; a shared no-op context otherwise."""
    profiler = trainer.profiler
    return _OFF if profiler is None else profiler.time(action)


class ProfiledDispatcher(HookDispatcher):
    """A `HookDispatcher` that times each hook it calls, named as Lightning's profiler names them
    (``[Callback]ModelCheckpoint.on_validation_end``, ``[LightningModule]Model.on_train_epoch_end``)."""

    def __init__(self, module: TrainModule | None, module_base: type, callbacks: Sequence[Callback], owner: TrainerView,
                 profiler: Profiler) -> None:
        super().__init__(module, module_base, callbacks, owner)
        name = type(module).__name__
        self._module_hooks = {event: timed(profiler, f"[LightningModule]{name}.{event}", hook) for event, hook in self._module_hooks.items()}
        self._callback_hooks = {
            event: [(cb, timed(profiler, f"[Callback]{type(cb).__name__}.{event}", method)) for cb, method in hooks]
            for event, hooks in self._callback_hooks.items()
        }


def timed(profiler: Profiler, action: str, hook: Callable[..., Any]) -> Callable[..., Any]:
    """`hook`, timed under `action` by `profiler` at every call."""

    def timed_hook(*args: Any) -> Any:
        with profiler.time(action):
            return hook(*args)

    return timed_hook
