"""The store behind ``TrainModule.log``: step values, epoch accumulators, and their reduction.

Nothing here forces a device sync on the hot path. A logged tensor is detached and kept; epoch
accumulators are updated on the device (``total += value * batch_size``). Values become Python floats
only when they are written to the loggers (every ``log_every_n_steps`` steps, one conversion for all
names) and at epoch end (one conversion for all names).

Across processes, reductions are collectives that every rank joins the same number of times: once per
epoch end and once per logger write, never per batch. Before reducing, the ranks agree on the set of
names (a rank that saw no batch of an uneven evaluation loader still joins, contributing nothing), so
an epoch mean with ``sync_dist=True`` is the exact mean over every sample of the dataset.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

_REDUCE_FX = ("mean", "sum", "max", "min")
_FX_ALIASES: dict[Any, str] = {torch.mean: "mean", torch.sum: "sum", torch.max: "max", torch.min: "min", sum: "sum", max: "max", min: "min"}


def normalize_reduce_fx(reduce_fx: Any) -> str:
    """Map ``"mean"``/``"sum"``/``"max"``/``"min"`` (or torch.mean, torch.sum, ...) to its name."""
    if isinstance(reduce_fx, str) and reduce_fx.lower() in _REDUCE_FX:
        return reduce_fx.lower()
    if reduce_fx in _FX_ALIASES:
        return _FX_ALIASES[reduce_fx]
    raise ValueError(f"reduce_fx={reduce_fx!r} is not supported; choose one of 'mean', 'sum', 'max', 'min'")


def _is_metric(value: Any) -> bool:
    """True for a torchmetrics `Metric` (checked without importing torchmetrics)."""
    return any(cls.__name__ == "Metric" and cls.__module__.startswith("torchmetrics") for cls in type(value).__mro__)


def infer_batch_size(batch: Any) -> int:
    """The size of the first dimension of the first tensor found in `batch` (1 when there is none)."""
    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.ndim > 0 else 1
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for item in batch:
            size = infer_batch_size(item)
            if size != -1:
                return size
        return -1 if batch else 1
    return -1


@dataclass
class _Entry:
    """One logged name within one stage."""

    on_step: bool
    on_epoch: bool
    prog_bar: bool
    logger: bool
    sync_dist: bool
    reduce_fx: str
    metric: Any = None
    step_value: Any = None
    step_dirty: bool = False
    step_sent: float | None = None  # training: the step value last sent to the loggers this epoch (sent with later rows too)
    total: Any = None
    weight: Any = 0.0
    updates: int = 0
    epoch_end: bool = False  # logged in an epoch-end hook: reduced after those hooks ran (see ResultsStore.reduce_epoch)
    suffix: str = ""  # "/dataloader_idx_<i>": the name's loader suffix, which goes after _step/_epoch

    def forked(self, name: str, kind: str) -> str:
        """Lightning's name of a value logged per step and per epoch: ``x_step``, ``x_epoch/dataloader_idx_1``."""
        return f"{name[: len(name) - len(self.suffix)]}_{kind}{self.suffix}"

    def accumulate(self, value: Any, batch_size: int) -> None:
        if self.reduce_fx == "mean":
            self.total = value * batch_size if self.total is None else self.total + value * batch_size
            self.weight = self.weight + batch_size
        elif self.reduce_fx == "sum":
            self.total = value if self.total is None else self.total + value
        elif self.total is None:
            self.total = value
        else:
            pick = torch.maximum if self.reduce_fx == "max" else torch.minimum
            self.total = pick(torch.as_tensor(self.total), torch.as_tensor(value))
        self.updates += 1

    def reset_epoch(self) -> None:
        self.total, self.weight, self.updates = None, 0.0, 0


class ResultsStore:
    """Everything ``self.log`` recorded, per stage (``"train"``, ``"validation"``, ``"test"``).

    Args:
        device: where new accumulator tensors are created.
        reduce: ``reduce(tensor, reduction)`` across processes (identity in one process).
        gather_object: ``gather_object(obj) -> list`` across processes (one entry per rank).
        world_size: number of processes.
    """

    def __init__(
        self,
        *,
        device: torch.device,
        reduce: Callable[[torch.Tensor, str], torch.Tensor],
        gather_object: Callable[[Any], list[Any]],
        world_size: int = 1,
    ) -> None:
        self.device = device
        self._reduce = reduce
        self._gather_object = gather_object
        self.world_size = world_size
        self.stage = "train"
        self.step_context = True
        self.epoch_end = False
        self.dataloader_suffix = ""  # "/dataloader_idx_<i>" while one of several evaluation loaders runs
        self.enabled = True
        self._entries: dict[str, dict[str, _Entry]] = {}
        # a call repeating one already checked (same name, stage, context and arguments) -> what it does with its value
        self._checked: dict[tuple[Any, ...], Callable[[Any], None]] = {}
        self._batch: Any = None
        self._batch_size: int | None = None
        # the last tensor the per-step path logged, and its detached copy (see `detached`); dropped at the next batch
        self._logged: Any = None
        self._logged_detached: Any = None
        self.callback_metrics: dict[str, Any] = {}
        self.logged_metrics: dict[str, Any] = {}
        self.progress_bar_metrics: dict[str, Any] = {}

    # context, set by the loop
    def set_context(self, stage: str, step_context: bool, *, epoch_end: bool = False) -> None:
        """Say which loop is running, whether the current hook is per-batch training code, and whether it is an
        epoch-end hook (``on_*_epoch_end``: what it logs is reduced by ``reduce_epoch(stage, epoch_end=True)``)."""
        self.stage, self.step_context, self.epoch_end = stage, step_context, epoch_end

    def set_batch(self, batch: Any) -> None:
        """Remember the current batch; its size is inferred only if a logged mean needs it."""
        self._batch, self._batch_size, self._logged = batch, None, None

    def begin_batch(self, batch: Any, stage: str, step_context: bool) -> None:
        """`set_context` and `set_batch` in one call (once per training batch)."""
        self.stage, self.step_context, self.epoch_end = stage, step_context, False
        self._batch, self._batch_size, self._logged = batch, None, None

    def _current_batch_size(self) -> int:
        if self._batch_size is None:
            size = infer_batch_size(self._batch)
            self._batch_size = 1 if size < 1 else size
        return self._batch_size

    # logging
    def log(
        self,
        name: str,
        value: Any,
        on_step: bool | None = None,
        on_epoch: bool | None = None,
        prog_bar: bool = False,
        logger: bool = True,
        sync_dist: bool = False,
        reduce_fx: Any = "mean",
        batch_size: int | None = None,
        add_dataloader_idx: bool = True,
        enable_graph: bool = False,
        sync_dist_group: Any = None,
        metric_attribute: str | None = None,
        rank_zero_only: bool = False,
    ) -> None:
        """Record `value` under `name` in the current stage (see ``TrainModule.log`` for the semantics)."""
        key = (name, self.stage, self.step_context, self.epoch_end, self.dataloader_suffix, on_step, on_epoch, prog_bar, logger,
               sync_dist, reduce_fx, batch_size, add_dataloader_idx, enable_graph, sync_dist_group, metric_attribute, rank_zero_only)
        # The per-step path: this exact call, with a scalar tensor, was validated before, and its recorder kept. Only
        # such calls with a string reduce_fx are remembered, and never in predict (disabled; its stage is in the key).
        record = self._checked.get(key)
        if record is not None and isinstance(value, torch.Tensor) and value.dim() == 0:
            self._logged, self._logged_detached = value, value.detach()
            record(value if enable_graph else self._logged_detached)
            return
        if not self.enabled:
            raise RuntimeError(f"self.log({name!r}, ...) is not supported during predict; return predictions from predict_step instead")
        if not isinstance(name, str) or not name:
            raise ValueError(f"self.log needs a non-empty string name, got {name!r}")
        suffix = self.dataloader_suffix if add_dataloader_idx else ""
        name += suffix
        fx = normalize_reduce_fx(reduce_fx)
        on_step = self.step_context if on_step is None else bool(on_step)
        on_epoch = (not self.step_context) if on_epoch is None else bool(on_epoch)
        if not on_step and not on_epoch:
            raise ValueError(f"self.log({name!r}, ...) with on_step=False and on_epoch=False logs nothing; set one of them to True")
        if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
            raise ValueError(f"batch_size={batch_size!r} must be a positive int")
        if metric_attribute is not None and not isinstance(metric_attribute, str):
            raise TypeError(f"self.log({name!r}, ..., metric_attribute={metric_attribute!r}) must be the name of the module attribute holding the Metric")
        metric = value if _is_metric(value) else None
        sync_dist = self._sync_dist(name, sync_dist, sync_dist_group, rank_zero_only, metric is not None)
        if metric is None:
            source, value = value, self._as_value(name, value)
            if isinstance(source, torch.Tensor) and source.dim() == 0:
                self._logged, self._logged_detached = source, value
            if enable_graph and isinstance(source, torch.Tensor):
                value = source if source.dim() == 0 else source.reshape(())  # the step value keeps its graph
        entries = self._entries.setdefault(self.stage, {})
        entry = entries.get(name)
        if entry is None:
            entry = entries[name] = _Entry(on_step, on_epoch, prog_bar, logger, sync_dist, fx, metric, epoch_end=self.epoch_end, suffix=suffix)
        elif entry.epoch_end != self.epoch_end:
            where = ("an epoch-end hook", "a step or batch hook") if entry.epoch_end else ("a step or batch hook", "an epoch-end hook")
            raise ValueError(
                f"self.log({name!r}, ...) was called in {where[0]} and now in {where[1]} of the same {self.stage} epoch; "
                "their epoch values are computed at different points, so log the epoch-end value under another name"
            )
        elif (entry.on_step, entry.on_epoch, entry.reduce_fx, entry.metric is not None) != (on_step, on_epoch, fx, metric is not None):
            raise ValueError(
                f"self.log({name!r}, ...) was called before with on_step={entry.on_step}, on_epoch={entry.on_epoch}, "
                f"reduce_fx={entry.reduce_fx!r}; log one name with the same settings every time, or use another name"
            )
        step_key = entry.forked(name, "step") if on_epoch else name
        if metric is not None:
            entry.metric = metric
            value = getattr(metric, "_forward_cache", None) if on_step else None
            entry.updates += 1
            if on_step and value is not None:
                self._recorder(entry, name, step_key, batch_size, on_step, False, logger, prog_bar)(value)
            return
        record = self._recorder(entry, name, step_key, batch_size, on_step, on_epoch, logger, prog_bar, enable_graph)
        record(value)
        if isinstance(value, torch.Tensor) and isinstance(reduce_fx, str):
            self._checked[key] = record

    def _sync_dist(self, name: str, sync_dist: bool, group: Any, rank_zero_only: bool, is_metric: bool) -> bool:
        """Whether a call's value is reduced across processes, after checking `sync_dist_group` and `rank_zero_only`."""
        if group is not None and not (torch.distributed.is_available() and group is torch.distributed.group.WORLD):
            raise NotImplementedError(
                f"self.log({name!r}, ..., sync_dist_group={group!r}): reducing over a sub-group of processes is not supported; "
                "pass sync_dist_group=None to reduce over all processes, or reduce the value yourself "
                "(torch.distributed.all_reduce(value, group=group)) and log it with sync_dist=False"
            )
        if rank_zero_only and is_metric and self.world_size > 1:
            raise ValueError(
                f"self.log({name!r}, metric, rank_zero_only=True): a torchmetrics Metric synchronizes itself in compute(), "
                "which every process must join; log it on every process without rank_zero_only"
            )
        return bool(sync_dist) and not rank_zero_only  # rank_zero_only: never a collective (Lightning's no-op sync)

    def detached(self, output: Any) -> Any:
        """A training step's `output` detached (for ``on_train_batch_end``): a loss this batch logged is detached once."""
        if output is self._logged:
            return self._logged_detached
        if isinstance(output, torch.Tensor):
            return output.detach()
        if isinstance(output, dict) and isinstance(output.get("loss"), torch.Tensor):
            return {**output, "loss": self.detached(output["loss"])}
        return output

    def _recorder(self, entry: _Entry, name: str, step_key: str, batch_size: int | None,
                  on_step: bool, accumulate: bool, logger: bool, prog_bar: bool, keep_graph: bool = False) -> Callable[[Any], None]:
        """What a call does with its value, all else settled: accumulate it into the epoch value (`accumulate`),
        keep it as the step value (`on_step`). A repeated call runs only this (a step value: four writes).
        With `keep_graph` the step value keeps its autograd graph; the accumulator gets it detached."""
        metrics, logged, shown = self.callback_metrics, self.logged_metrics, self.progress_bar_metrics  # cleared, never replaced
        # Lightning's rule: callback_metrics take step values in training only; an evaluation value reaches them as its
        # epoch value (``val_loss``, ``val_loss_epoch``), never as ``val_loss_step``
        to_callbacks = self.stage == "train"

        def record(value: Any) -> None:
            if accumulate:
                total = value.detach() if keep_graph and isinstance(value, torch.Tensor) else value
                entry.accumulate(total, batch_size or (self._current_batch_size() if entry.reduce_fx == "mean" else 1))
            if on_step:
                entry.step_value, entry.step_dirty = value, True
                if to_callbacks:
                    metrics[step_key] = metrics[name] = value
                if logger:  # kept after the epoch, as in Lightning (a tensor: no host sync per step)
                    logged[step_key] = value
                if prog_bar:
                    shown[step_key] = value

        return record

    def _as_value(self, name: str, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ValueError(
                    f"self.log({name!r}, ...) got a tensor of shape {tuple(value.shape)}; log a scalar "
                    "(e.g. value.mean()) or a torchmetrics Metric"
                )
            value = value.detach()
            return value if value.dim() == 0 else value.reshape(())
        if isinstance(value, dict):
            raise TypeError(
                f"self.log({name!r}, ...) got a dict; log each entry under its own name with "
                f"self.log_dict({{'{name}/<key>': ...}}) (a dict value of self.log, which Lightning's TensorBoardLogger "
                "writes with add_scalars, is not supported)"
            )
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(
                f"self.log({name!r}, ...) got a value of type {type(value).__name__}; "
                "log a number, a one-element tensor or a torchmetrics Metric"
            )
        return float(value)

    # reduction
    def _agree(self, local: dict[str, str], about: dict[str, Any] | None = None) -> tuple[dict[str, str], set[str], dict[str, Any]]:
        """The union over ranks of ``{name: kind}`` (sorted, identical on every rank), the names some rank lacks, and
        the union of `about` (what a rank that lacks a name needs to know of it; the first rank that has it says)."""
        if self.world_size == 1:
            return dict(sorted(local.items())), set(), dict(about or {})
        merged: dict[str, str] = {}
        told: dict[str, Any] = {}
        per_rank = self._gather_object((dict(local), about or {}))
        for rank_items, rank_about in per_rank:
            for name, kind in rank_items.items():
                if merged.setdefault(name, kind) != kind:
                    raise ValueError(f"{name!r} was logged with reduce_fx={kind!r} on one process and {merged[name]!r} on another")
            for name, value in rank_about.items():
                told.setdefault(name, value)
        missing = {name for name in merged if any(name not in rank_items for rank_items, _ in per_rank)}
        return dict(sorted(merged.items())), missing, told

    def _reduce_values(self, pairs: dict[str, tuple[str, Any, Any]]) -> dict[str, Any]:
        """Reduce ``{name: (kind, a, b)}`` across ranks: a mean is ``sum(a) / sum(b)``; None means absent."""
        out: dict[str, Any] = {}
        for kind in _REDUCE_FX:
            names = [n for n, (k, _, _) in pairs.items() if k == kind]
            if not names:
                continue
            identity = {"max": -math.inf, "min": math.inf}.get(kind, 0.0)
            a = [identity if pairs[n][1] is None else pairs[n][1] for n in names]
            b = [0.0 if pairs[n][2] is None else pairs[n][2] for n in names]
            packed = torch.stack([torch.as_tensor(v, dtype=torch.float64, device=self.device).reshape(()) for v in a + b])
            op = "sum" if kind in ("mean", "sum") else kind
            packed = self._reduce(packed, op) if self.world_size > 1 else packed
            for i, name in enumerate(names):
                out[name] = packed[i] / packed[len(names) + i] if kind == "mean" else packed[i]
        return out

    def flush_step(self, stage: str = "train") -> dict[str, float]:
        """The step values of `stage` logged since the last call, as floats; in training also (as Lightning's rows) those
        logged earlier in the epoch and not since, with the value last sent.

        In training, ``sync_dist`` ones are reduced across ranks, and every rank must call this at the same steps
        when more than one process runs. In evaluation each process runs its own number of batches (every sample
        once), so step values are this process's own and nothing is reduced (``sync_dist`` applies to the epoch value).
        """
        entries = self._entries.get(stage, {})
        dirty = {n: e for n, e in entries.items() if e.on_step and e.step_dirty}
        sync = stage == "train"
        synced, _, _ = self._agree({n: "mean" for n, e in dirty.items() if e.sync_dist and e.metric is None}) if sync else ({}, set(), {})
        # the agreed names are the same on every rank: all of them reduce, or none does
        reduced = self._reduce_values({n: ("mean", dirty[n].step_value, 1.0) if n in dirty else ("mean", None, None) for n in synced}) if synced else {}
        values: dict[str, Any] = {}
        for name, entry in dirty.items():
            entry.step_dirty = False
            if entry.logger:
                values[entry.forked(name, "step") if entry.on_epoch else name] = reduced.get(name, entry.step_value)
        floats = self._to_floats(values)
        self.logged_metrics.update(floats)  # the synced values, where sync_dist asked for them
        if not sync:
            return floats
        # Lightning's rows: a training step value logged earlier in the epoch goes with every later row of the epoch
        # (its value from the last step that logged it), as in a GAN's generator loss logged every other batch
        rows: dict[str, float] = {}
        for name, entry in entries.items():
            if entry.on_step and entry.logger:
                key = entry.forked(name, "step") if entry.on_epoch else name
                if key in floats:
                    entry.step_sent = rows[key] = floats[key]
                elif entry.step_sent is not None:
                    rows[key] = entry.step_sent
        return rows

    def reduce_epoch(self, stage: str, *, epoch_end: bool = False) -> tuple[dict[str, float], dict[str, float]]:
        """Compute the epoch values of `stage` and reset their accumulators; every rank calls this twice per epoch.

        First (``epoch_end=False``) for what the steps and batch hooks logged, before the epoch-end hooks run (so
        they see those values, as in Lightning); then (``epoch_end=True``) for what the epoch-end hooks logged.

        Returns:
            ``(all epoch values, the ones meant for the loggers)``, as floats. `callback_metrics`,
            `logged_metrics` and `progress_bar_metrics` are updated.
        """
        if not epoch_end:  # the epoch's rows are over: a step value is sent again only once logged again
            for logged in self._entries.get(stage, {}).values():
                logged.step_sent = None
        entries = {n: e for n, e in self._entries.get(stage, {}).items() if e.on_epoch and e.epoch_end == epoch_end}
        local = {n: "metric" if e.metric is not None else e.reduce_fx for n, e in entries.items() if e.metric is not None or e.updates > 0}
        # what a process that logged nothing under a name (no batch of this loop: evaluation is never padded here) needs
        # to file the others' value: synced?, its epoch key, progress bar?, loggers?
        about = {n: (entries[n].sync_dist, entries[n].forked(n, "epoch") if entries[n].on_step else n, entries[n].prog_bar,
                     entries[n].logger) for n in local}
        agreed, missing, told = self._agree(local, about)
        lacking = sorted(n for n in missing if agreed[n] == "metric")
        if lacking:
            raise RuntimeError(
                f"the torchmetrics Metric(s) {lacking} were logged on some processes but not on others; log them on every "
                "process (each must join compute()), e.g. call self.log in validation_step even when a rank has no batch"
            )
        values: dict[str, Any] = {}
        for name in (n for n, kind in agreed.items() if kind == "metric"):
            values[name] = entries[name].metric.compute()
            entries[name].metric.reset()
        # reduced across processes: the synced names and, in evaluation, a name some process logged nothing under (it
        # ran no batch: it takes the others' value, so a monitor finds the name on every process)
        fill = missing if stage != "train" else set()
        to_reduce = {}
        for name, kind in agreed.items():
            if kind != "metric" and (told[name][0] or name in fill):
                entry = entries.get(name)
                if entry is not None and entry.updates > 0:
                    to_reduce[name] = (kind, entry.total, entry.weight if kind == "mean" else 1.0)
                else:
                    to_reduce[name] = (kind, None, None)
        reduced = self._reduce_values(to_reduce) if to_reduce else {}
        values.update({n: v for n, v in reduced.items() if told[n][0] or n not in entries or entries[n].updates == 0})
        for name, entry in entries.items():
            if name not in values and entry.updates > 0 and entry.metric is None:
                values[name] = entry.total / entry.weight if entry.reduce_fx == "mean" else entry.total
            entry.reset_epoch()
        floats = self._to_floats({told[n][1]: v for n, v in values.items()})
        out: dict[str, float] = {}
        for name in [n for n in entries if n in values] + [n for n in values if n not in entries]:
            _, key, prog_bar, logger = told[name]
            self.callback_metrics[key] = self.callback_metrics[name] = floats[key]
            if prog_bar:
                self.progress_bar_metrics[key] = floats[key]
            if logger:
                out[key] = floats[key]
        self.logged_metrics.update(out)
        return floats, out

    def _to_floats(self, values: dict[str, Any]) -> dict[str, float]:
        """Convert all values with one device-to-host transfer."""
        if not values:
            return {}
        names = list(values)
        tensors = [v for v in values.values() if isinstance(v, torch.Tensor)]
        host: list[float] = []
        if len(tensors) == 1:  # one read either way, without building a stack (exact, as the float64 conversion)
            host = [tensors[0].item()]
        elif tensors:
            host = torch.stack([t.detach().reshape(()).to(self.device, torch.float64) for t in tensors]).tolist()
        it = iter(host)
        return {n: float(next(it)) if isinstance(values[n], torch.Tensor) else float(values[n]) for n in names}

    def state_dict(self) -> dict[str, Any]:
        """The open training-epoch accumulators as JSON data, so an epoch value survives a mid-epoch resume.

        torchmetrics ``Metric`` states are not included (they live in the module's own state).
        """
        entries = {}
        for name, entry in self._entries.get("train", {}).items():
            if entry.on_epoch and entry.metric is None and entry.updates:
                settings = {k: getattr(entry, k) for k in ("on_step", "on_epoch", "prog_bar", "logger", "sync_dist", "reduce_fx")}
                entries[name] = {**settings, "total": float(entry.total), "weight": float(entry.weight), "updates": entry.updates}
        return {"train": entries}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what `state_dict` returned (called when a checkpoint is restored, before training resumes)."""
        entries = self._entries.setdefault("train", {})
        self._checked.clear()
        for name, saved in (state.get("train") or {}).items():
            settings = {k: saved[k] for k in ("on_step", "on_epoch", "prog_bar", "logger", "sync_dist", "reduce_fx")}
            entry = entries[name] = _Entry(**settings)
            entry.total, entry.weight, entry.updates = float(saved["total"]), float(saved["weight"]), int(saved["updates"])

    def reset(self) -> None:
        """Forget all entries (a new ``fit``/``validate``/``test`` run)."""
        self.enabled, self.epoch_end = True, False
        self._entries.clear()
        self._checked.clear()
        self.callback_metrics.clear()
        self.logged_metrics.clear()
        self.progress_bar_metrics.clear()
