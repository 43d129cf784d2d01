"""``Trainer(profiler="pytorch")`` / ``PyTorchProfiler(...)``: ``torch.profiler`` over a ``fit``, as Lightning's.

    profiler = PyTorchProfiler(dirpath="prof", schedule=torch.profiler.schedule(wait=1, warmup=1, active=3),
                               record_shapes=True, profile_memory=True)
    Trainer(profiler=profiler).fit(module)
    # prof/fit-<rank>-training_step.<host>_<pid>.<time>.pt.trace.json (Chrome trace / TensorBoard), one per rank;
    # the summary table (key_averages, sorted by sort_by_key) printed, or written with filename=

The torch profiler starts at the first timed action and wraps every action in ``record_function("[pl][profile]...")``;
each ``training_step`` advances the schedule (``prof.step()``). As in Lightning, the schedule runs one cycle (the trace
of its first ``active`` window is written, then recording stops), and the default schedule (wait=1, warmup=1, active=3)
gives way to recording every step when the epoch has fewer than 5 batches.
"""

from __future__ import annotations

import inspect
import os
import warnings
from collections.abc import Callable
from functools import cache
from typing import Any

import torch
from torch.autograd.profiler import EventList, record_function
from torch.profiler import ProfilerAction, ProfilerActivity, tensorboard_trace_handler

from trainer.fit.profiler import Profiler

_STEP = "training_step"


@cache
def _default_schedule() -> Callable[[int], ProfilerAction]:
    return torch.profiler.schedule(wait=1, warmup=1, active=3)


class _OneCycle:
    """`schedule`, stopped (``NONE``) after its first ``RECORD_AND_SAVE`` (Lightning's ``ScheduleWrapper``)."""

    def __init__(self, schedule: Callable[[int], ProfilerAction]) -> None:
        self.schedule = schedule
        self.finished = False

    def __call__(self, num_step: int) -> ProfilerAction:
        if self.finished:
            return ProfilerAction.NONE
        action = self.schedule(num_step)
        self.finished = action == ProfilerAction.RECORD_AND_SAVE
        return action


class PyTorchProfiler(Profiler):
    """Lightning's ``PyTorchProfiler``: a ``torch.profiler.profile`` trace per rank and a table of its ops.

    Args:
        dirpath, filename: see `Profiler`; traces go to `dirpath` (the Trainer's ``log_dir`` when None).
        group_by_input_shapes: group the table's rows by input shapes (needs ``record_shapes=True``).
        export_to_chrome: write the trace (``<stage>-<rank>-training_step.<worker>.pt.trace.json``, read by Chrome's
            ``chrome://tracing``, Perfetto and TensorBoard's profiler plugin) each time the schedule saves.
        row_limit: rows of the table (-1: all).
        sort_by_key: the table's order: one of `AVAILABLE_SORT_KEYS`; ``cuda_time_total`` where CUDA is profiled,
            else ``cpu_time_total``.
        table_kwargs: more arguments of ``EventList.table``.
        **profiler_kwargs: ``torch.profiler.profile``'s: ``schedule`` (e.g. ``torch.profiler.schedule(wait=1, warmup=1,
            active=3)``, the default), ``activities``, ``record_shapes``, ``profile_memory``, ``with_stack``,
            ``with_flops``, ``with_modules``, ``on_trace_ready`` (replaces the export), ...

    Raises:
        ValueError: `sort_by_key` or a `table_kwargs` key is unknown, or `schedule` is no torch schedule.
    """

    AVAILABLE_SORT_KEYS = frozenset({"cpu_time", "cuda_time", "cpu_time_total", "cuda_time_total", "cpu_memory_usage", "cuda_memory_usage",
                           "self_cpu_memory_usage", "self_cuda_memory_usage", "count"})

    def __init__(self, dirpath: str | os.PathLike[str] | None = None, filename: str | None = None, group_by_input_shapes: bool = False,
                 export_to_chrome: bool = True, row_limit: int = 20, sort_by_key: str | None = None,
                 table_kwargs: dict[str, Any] | None = None, **profiler_kwargs: Any) -> None:
        super().__init__(dirpath=dirpath, filename=filename)
        self._group_by_input_shapes = group_by_input_shapes and bool(profiler_kwargs.get("record_shapes", False))
        self._export_to_chrome = export_to_chrome
        self._row_limit = row_limit
        self._table_kwargs = dict(table_kwargs or {})
        schedule = profiler_kwargs.get("schedule", _default_schedule())
        if schedule is not None and (not callable(schedule) or not isinstance(schedule(0), ProfilerAction)):
            raise ValueError(f"schedule={schedule!r} must be a torch.profiler.schedule(wait=..., warmup=..., active=...)")
        self._user_schedule = schedule
        self._has_on_trace_ready = "on_trace_ready" in profiler_kwargs
        activities = profiler_kwargs.get("activities") or [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        self._profiler_kwargs = {**profiler_kwargs, "activities": activities}
        self._sort_by_key = sort_by_key or ("cuda_time_total" if ProfilerActivity.CUDA in activities else "cpu_time_total")
        if self._sort_by_key not in self.AVAILABLE_SORT_KEYS:
            raise ValueError(f"sort_by_key={self._sort_by_key!r} is unknown; choose one of {sorted(self.AVAILABLE_SORT_KEYS)}")
        allowed = set(inspect.signature(EventList.table).parameters) - {"self", "sort_by", "row_limit"}
        for key in self._table_kwargs:
            if key not in allowed:
                raise ValueError(f"table_kwargs key {key!r} is invalid (sort_by and row_limit are arguments of their own); "
                                 f"choose from {sorted(allowed)}")
        self.profiler: torch.profiler.profile | None = None
        self.function_events: EventList | None = None
        self._schedule: _OneCycle | None = None
        self._recording: dict[str, record_function] = {}

    def start(self, action_name: str) -> None:
        if self.profiler is None:
            self._create_profiler()
        if action_name not in self._recording:
            recording = record_function("[pl][profile]" + action_name)
            recording.__enter__()
            self._recording[action_name] = recording

    def _create_profiler(self) -> None:
        if torch.autograd._profiler_enabled():
            torch.autograd._disable_profiler()
        self._schedule = None if self._user_schedule is None else _OneCycle(self._user_schedule)
        accepted = inspect.signature(torch.profiler.profile.__init__).parameters
        kwargs = {k: v for k, v in self._profiler_kwargs.items() if k in accepted}
        kwargs["schedule"] = self._schedule
        if not self._has_on_trace_ready:
            kwargs["on_trace_ready"] = self._export
        self.profiler = torch.profiler.profile(**kwargs)
        self.profiler.__enter__()

    def _export(self, profiler: torch.profiler.profile) -> None:
        if self._export_to_chrome and self.dirpath is not None:
            tensorboard_trace_handler(str(self.dirpath), self._prepare_filename(action_name=_STEP, extension=""))(profiler)

    def stop(self, action_name: str) -> None:
        recording = self._recording.pop(action_name, None)
        if recording is not None:
            recording.__exit__(None, None, None)
        if self.profiler is not None and action_name.endswith(_STEP):
            if self._schedule is not None and self._schedule.schedule is _default_schedule() and self.epoch_batches < 5:
                # too few steps for wait + warmup + active: record them all (Lightning warns and does the same)
                warnings.warn("The PyTorchProfiler's default schedule (wait=1, warmup=1, active=3) is replaced by recording "
                              f"every step: the epoch has {self.epoch_batches} batches", stacklevel=2)
                self._schedule = None
                self.profiler.schedule = torch.profiler.profiler._default_schedule_fn
            self.profiler.step()

    def summary(self) -> str:
        if not self._profiler_kwargs.get("enabled", True):
            return ""
        self._delete_profiler()
        if not self.function_events:
            return ""
        data = self.function_events.key_averages(group_by_input_shapes=self._group_by_input_shapes)
        return self._stats_to_str({"records": data.table(sort_by=self._sort_by_key, row_limit=self._row_limit, **self._table_kwargs)})

    def _delete_profiler(self) -> None:
        for recording in reversed(list(self._recording.values())):
            recording.__exit__(None, None, None)
        self._recording = {}
        if self.profiler is not None:
            self.profiler.__exit__(None, None, None)
            self.function_events = self.profiler.events()
            self.profiler = None

    def teardown(self, stage: str | None) -> None:
        self._delete_profiler()
