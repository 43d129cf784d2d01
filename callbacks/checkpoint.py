"""`ModelCheckpoint`: save checkpoints during `fit`, keep the best k, and (``save_last``) a ``last`` checkpoint.

Every checkpoint is a complete directory written atomically by the trainer (``trainer.save_checkpoint``, through the
checkpoint store, `strategies.checkpoint_store`, which alone knows the layout on disk). The callback decides *when* to save (every n optimizer steps, every n epochs, after validation), *which*
checkpoints to keep (the top ``save_top_k`` by a monitored metric, or the newest ones without a monitor),
and with ``save_last`` writes a ``last-...`` checkpoint of the newest state each time; the store keeps
``<dirpath>/last.json`` and the link ``<dirpath>/last.ckpt`` naming it, so a script that opens ``last.ckpt`` finds it.
``fit(ckpt_path="last")`` finds the newest checkpoint either way.
"""

from __future__ import annotations

import math
import re
import time
import warnings
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from callbacks.base import Callback, in_fit, overrides
from strategies import checkpoint_store as store

if TYPE_CHECKING:
    from callbacks.view import TrainerView
    from trainer.fit.module import TrainModule

_MODES = ("min", "max")


class ModelCheckpoint(Callback):
    """Save checkpoint directories during training.

    Args:
        dirpath: directory for the checkpoints; default ``<project_dir>/checkpoints``.
        filename: name template, formatted with ``epoch``, ``step`` and the logged metrics, e.g.
            ``"{epoch:02d}-{val_loss:.3f}"`` → ``epoch=03-val_loss=0.123`` (``auto_insert_metric_name``).
            Default ``"{epoch}-{step}"``.
        monitor: metric (a key of ``trainer.callback_metrics``) ranking the checkpoints. None ranks them
            by recency, so ``save_top_k`` keeps the newest ones.
        mode: ``"min"`` or ``"max"``: whether a lower or higher `monitor` is better.
        save_top_k: how many checkpoints to keep; ``-1`` keeps all, ``0`` keeps none (only ``last``).
        save_last: ``True`` also writes a checkpoint of the newest state whenever one is due (``last-<name>``, its
            own write, as Lightning's ``last.ckpt`` is), names it in ``last.json``, the link ``<dirpath>/last.ckpt``
            and `last_model_path`, and removes the previous one. ``"link"`` (Lightning's symlink) names the top-k checkpoint just written
            instead of writing a copy (a separate ``last-<name>`` when none was). ``None``/``False``: no ``last``.
        save_on_exception: when ``fit`` raises, save a checkpoint of the state it stopped in (and ``last`` with
            `save_last`), unless one was saved at this step already; then the error goes on. One process only: with
            several, the others may not be where a collective save needs them, so it is skipped with a warning.
        every_n_train_steps: save every n optimizer steps (at the end of the batch that made the step).
        train_time_interval: save every so much training time (a ``timedelta``), at the end of a batch. The processes
            agree on it the way the loop agrees on stopping (`trainer.fit.agreement`): any process's clock makes a save
            due, and every process saves at the same batch, the batch after the agreement (with one process, the batch
            where the time ran out, as Lightning), with no collective of its own.
        every_n_epochs: save every n epochs; default 1 when neither `every_n_train_steps` nor `train_time_interval`
            is given, else off. The three are mutually exclusive (as in Lightning).
        save_on_train_epoch_end: save at the end of the training epoch (True) or after validation (False);
            default: after validation when it runs other than once per epoch, else at epoch end.
        auto_insert_metric_name: write ``name=value`` for each template field.
        verbose: print each checkpoint written (global rank 0).
        save_weights_only: write the model weights and hyperparameters alone (``load_from_checkpoint`` and
            ``validate/test/predict(ckpt_path=...)`` load them; ``fit(ckpt_path=...)`` refuses them, as Lightning does,
            and ``ckpt_path="last"`` passes over them to the newest full checkpoint).
        enable_version_counter: True: a name already taken gets a ``-v1``, ``-v2`` ... suffix. False: the new checkpoint
            replaces the one of the same name, once it is complete (the old one stays until then).
        async_save: write each checkpoint in the background: training goes on once the state is copied out of the
            training tensors, and the checkpoint counts (``last.json``, best/last paths on disk, older ones removed)
            only once every process's write finished. None: the trainer's default (True with
            ``Trainer(plugins=[AsyncCheckpointIO()])``).

    Raises:
        ValueError: on an invalid argument (the message names it and the accepted values).
    """

    runs_last = True
    monitors_metrics = True  # runs after the module's on_train_epoch_end, to see what it logs (as in Lightning)
    CHECKPOINT_EQUALS_CHAR = "="
    CHECKPOINT_NAME_LAST = "last"

    def __init__(  # Lightning's argument order, so positional calls port too
        self,
        dirpath: str | Path | None = None,
        filename: str | None = None,
        monitor: str | None = None,
        verbose: bool = False,
        save_last: bool | str | None = None,
        save_top_k: int = 1,
        save_on_exception: bool = False,
        save_weights_only: bool = False,
        mode: str = "min",
        auto_insert_metric_name: bool = True,
        every_n_train_steps: int | None = None,
        train_time_interval: Any = None,
        every_n_epochs: int | None = None,
        save_on_train_epoch_end: bool | None = None,
        enable_version_counter: bool = True,
        async_save: bool | None = None,
    ) -> None:
        for name, flag in (("verbose", verbose), ("save_weights_only", save_weights_only), ("save_on_exception", save_on_exception),
                           ("enable_version_counter", enable_version_counter)):
            if not isinstance(flag, bool):
                raise TypeError(f"ModelCheckpoint({name}={flag!r}) must be True or False")
        if train_time_interval is not None and not isinstance(train_time_interval, timedelta):
            raise TypeError(f"ModelCheckpoint(train_time_interval={train_time_interval!r}) must be a datetime.timedelta, "
                            "e.g. timedelta(minutes=30), or None")
        if train_time_interval is not None and train_time_interval.total_seconds() < 0:
            raise ValueError(f"ModelCheckpoint(train_time_interval={train_time_interval!r}) must not be negative")
        triggers = [(n, v) for n, v in (("every_n_train_steps", every_n_train_steps), ("every_n_epochs", every_n_epochs)) if v]
        if train_time_interval is not None and triggers:
            raise ValueError(
                f"ModelCheckpoint(train_time_interval={train_time_interval!r}, {triggers[0][0]}={triggers[0][1]!r}): the save "
                "triggers every_n_train_steps, every_n_epochs and train_time_interval are mutually exclusive (as in "
                "Lightning); pick one, or use two ModelCheckpoint callbacks"
            )
        self.save_weights_only = save_weights_only
        self.save_on_exception = save_on_exception
        self.train_time_interval = train_time_interval
        self.enable_version_counter = enable_version_counter
        self._last_time_checked: float | None = None
        if async_save is not None and not isinstance(async_save, bool):
            raise TypeError(f"ModelCheckpoint(async_save={async_save!r}) must be True, False or None (the trainer's default)")
        self.async_save = async_save
        self.verbose = verbose
        if mode not in _MODES:
            raise ValueError(f"ModelCheckpoint(mode={mode!r}) is not supported; use mode='min' or mode='max'")
        if save_last not in (None, True, False, "link"):
            raise ValueError(f"ModelCheckpoint(save_last={save_last!r}) is not supported; use True, False, None or 'link'")
        if not isinstance(save_top_k, int) or save_top_k < -1:
            raise ValueError(f"ModelCheckpoint(save_top_k={save_top_k!r}) must be an int >= -1 (-1 keeps all, 0 none)")
        for name, value in (("every_n_train_steps", every_n_train_steps), ("every_n_epochs", every_n_epochs)):
            if value is not None and (not isinstance(value, int) or value < 0):
                raise ValueError(f"ModelCheckpoint({name}={value!r}) must be None or an int >= 0 (0 disables it)")
        if dirpath is not None and Path(dirpath).is_file():
            raise ValueError(f"ModelCheckpoint(dirpath={str(dirpath)!r}) is an existing file; pass a directory path")
        self.dirpath = Path(dirpath).absolute() if dirpath is not None else None
        self._dirpath_arg = str(dirpath) if dirpath is not None else None
        self.filename = filename
        self.monitor = monitor
        self.mode = mode
        self.save_top_k = save_top_k
        self.save_last = save_last
        self.every_n_train_steps = every_n_train_steps or 0
        timed = train_time_interval is not None
        self.every_n_epochs = every_n_epochs if every_n_epochs is not None else (0 if every_n_train_steps or timed else 1)
        self.save_on_train_epoch_end = save_on_train_epoch_end
        self.auto_insert_metric_name = auto_insert_metric_name
        self.best_k_models: dict[str, float] = {}
        self.kth_best_model_path = ""
        self.kth_value: float | None = None
        self.best_model_path = ""
        self.best_model_score: float | None = None
        self.last_model_path = ""
        self._last_global_step_saved = -1
        self._warned_missing: set[str] = set()

    # ----------------------------------------------------------------------------------- state
    @property
    def state_key(self) -> str:
        return f"ModelCheckpoint{{monitor={self.monitor!r}, mode={self.mode!r}, dirpath={self._dirpath_arg!r}}}"

    def state_dict(self) -> dict[str, Any]:
        return {
            "monitor": self.monitor,
            "dirpath": str(self.dirpath) if self.dirpath is not None else None,
            "best_k_models": dict(self.best_k_models),
            "kth_best_model_path": self.kth_best_model_path,
            "kth_value": self.kth_value,
            "best_model_path": self.best_model_path,
            "best_model_score": self.best_model_score,
            "last_model_path": self.last_model_path,
            "last_global_step_saved": self._last_global_step_saved,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.best_model_score = state_dict.get("best_model_score")
        self.best_model_path = state_dict.get("best_model_path", "")
        if self.dirpath is not None and state_dict.get("dirpath") != str(self.dirpath):
            return  # another directory: keep only the record of the best model
        self.best_k_models = {str(k): float(v) for k, v in (state_dict.get("best_k_models") or {}).items()}
        self.kth_best_model_path = state_dict.get("kth_best_model_path", "")
        self.kth_value = state_dict.get("kth_value")
        self.last_model_path = state_dict.get("last_model_path", "")
        self._last_global_step_saved = int(state_dict.get("last_global_step_saved", -1))

    # ----------------------------------------------------------------------------------- hooks
    def setup(self, trainer: TrainerView, module: TrainModule, stage: str) -> None:
        self.dirpath = self.resolve_dirpath(trainer)
        if self.train_time_interval is not None and stage == "fit":
            trainer.agreement.register(self._time_key)

    @property
    def _time_key(self) -> str:
        return f"save-after-time:{self.state_key}"

    def idle_batch_hooks(self, trainer: TrainerView) -> frozenset[str]:
        # saving by epoch only, this class's per-batch hook returns at once (a subclass's own hook is its business)
        own = not overrides(self, "on_train_batch_end", ModelCheckpoint)
        idle = self.every_n_train_steps < 1 and self.train_time_interval is None
        return frozenset({"on_train_batch_end"}) if own and idle else frozenset()

    def on_train_start(self, trainer: TrainerView, module: TrainModule) -> None:
        self._last_time_checked = time.monotonic()

    def on_train_batch_end(self, trainer: TrainerView, module: TrainModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        n = self.every_n_train_steps
        due_steps = n >= 1 and trainer.global_step != 0 and trainer.global_step % n == 0
        due_time = self.train_time_interval is not None and self._time_due(trainer)
        if (due_steps or due_time) and self._may_save(trainer):
            self.save(trainer, monitor_required=False)

    def _time_due(self, trainer: TrainerView) -> bool:
        """Whether `train_time_interval` ran out: any process's clock asks, every process learns it at the same batch."""
        assert self.train_time_interval is not None
        now = time.monotonic()
        if self._last_time_checked is None:
            self._last_time_checked = now
        if now - self._last_time_checked >= self.train_time_interval.total_seconds():
            trainer.agreement.request(self._time_key)
        if not trainer.agreement.take(self._time_key):
            return False
        self._last_time_checked = now
        return True

    def on_exception(self, trainer: TrainerView, module: TrainModule, exception: BaseException) -> None:
        """`save_on_exception`: save the state `fit` stopped in (Lightning 2.6), keeping the error the one raised."""
        if not self.save_on_exception or not self._may_save(trainer):
            return
        if trainer.world_size > 1:
            warnings.warn(
                f"ModelCheckpoint(save_on_exception=True) did not save after {type(exception).__name__}: with "
                f"{trainer.world_size} processes a save is collective, and the others may not be where it needs them (they "
                "could wait forever). Preemption signals are answered by a checkpoint anyway (docs/checkpoints.md)",
                stacklevel=2,
            )
            return
        self.dirpath = self.resolve_dirpath(trainer)
        name = self.format_checkpoint_name(self._metrics(trainer))
        path = str(self._unique_path(name))
        plan: dict[str, Any] = {"topk": "", "last": "", "score": None, "remove": []}
        if self.save_last:
            plan["last"] = path if self.save_last == "link" else str(self._unique_path(f"{self.CHECKPOINT_NAME_LAST}-{name}"))
            previous = self.last_model_path
            if previous and previous != plan["last"] and previous not in self.best_k_models:
                plan["remove"].append(previous)
        self._apply_plan(plan, trainer.global_step)
        try:
            for target in dict.fromkeys(p for p in (path, plan["last"]) if p):
                trainer.save_checkpoint(target, self.save_weights_only, async_save=False)
            trainer.checkpoints.after_commit(lambda: self._after_commit(plan))
        except Exception as err:  # the error that stopped fit stays the one raised
            warnings.warn(f"ModelCheckpoint(save_on_exception=True) could not save {path!r}: {type(err).__name__}: {err}", stacklevel=2)
            return
        print(f"{type(exception).__name__} was raised with message: {exception}; saved checkpoint to {path}", flush=True)

    def on_train_epoch_end(self, trainer: TrainerView, module: TrainModule) -> None:
        if self._may_save(trainer) and self._epoch_due(trainer) and self._saves_on_train_epoch_end(trainer):
            self.save(trainer, monitor_required=True)

    def on_validation_end(self, trainer: TrainerView, module: TrainModule) -> None:
        if self._may_save(trainer) and self._epoch_due(trainer) and not self._saves_on_train_epoch_end(trainer):
            self.save(trainer, monitor_required=True)

    def _may_save(self, trainer: TrainerView) -> bool:
        return in_fit(trainer) and trainer.global_step != self._last_global_step_saved

    def _epoch_due(self, trainer: TrainerView) -> bool:
        return self.every_n_epochs >= 1 and (trainer.current_epoch + 1) % self.every_n_epochs == 0

    def _saves_on_train_epoch_end(self, trainer: TrainerView) -> bool:
        if self.save_on_train_epoch_end is not None:
            return self.save_on_train_epoch_end
        num_val = trainer.num_val_batches
        num_val = sum(num_val) if isinstance(num_val, (list, tuple)) else (num_val or 0)
        return num_val == 0 or trainer.validation_schedule.once_per_epoch

    # ----------------------------------------------------------------------------------- saving
    def resolve_dirpath(self, trainer: TrainerView) -> Path:
        """The directory this callback saves into (``<project_dir>/checkpoints`` unless `dirpath` was given)."""
        return self.dirpath if self.dirpath is not None else store.default_dir(trainer.project_dir)

    def save(self, trainer: TrainerView, *, monitor_required: bool) -> None:
        """Save the checkpoints due now (all ranks call this); rank 0 then removes those that dropped out."""
        self.dirpath = self.resolve_dirpath(trainer)
        metrics = self._metrics(trainer)
        score = self._score(trainer, metrics, monitor_required)  # on every rank: a missing monitor raises everywhere
        plan = self._plan(metrics, score) if trainer.is_global_zero else {}
        if trainer.world_size > 1:
            plan = trainer.strategy.broadcast_object(plan, src=0)
        self._apply_plan(plan, trainer.global_step)
        for path in dict.fromkeys(p for p in (plan["topk"], plan["last"]) if p):
            trainer.save_checkpoint(path, self.save_weights_only, async_save=self.async_save)
            if self.verbose and trainer.is_global_zero:
                about = f"{self.monitor!r} = {score:.5g}, " if score is not None and self.monitor else ""
                print(f"Epoch {trainer.current_epoch}, global step {trainer.global_step}: {about}saved {path}", flush=True)
        if trainer.is_global_zero:  # once the checkpoint is committed (now, or when its background write finished)
            trainer.checkpoints.after_commit(lambda: self._after_commit(plan))

    def _after_commit(self, plan: dict[str, Any]) -> None:
        if plan["last"]:
            store.write_last_pointer(self.dirpath or Path(plan["last"]).parent, Path(plan["last"]))
        for path in plan["remove"]:
            self._remove(Path(path))

    def _plan(self, metrics: dict[str, Any], score: float | None) -> dict[str, Any]:
        """Decide (on rank 0) which checkpoints to write and which to delete."""
        name = self.format_checkpoint_name(metrics)
        topk = ""
        if score is not None and self._enters_top_k(score):
            topk = str(self._unique_path(name))
        last = ""
        if self.save_last == "link" and topk:
            last = topk  # like Lightning's symlink: the pointer names the top-k checkpoint just written
        elif self.save_last:
            last = str(self._unique_path(f"{self.CHECKPOINT_NAME_LAST}-{name}"))  # its own write, as Lightning's last.ckpt
        remove = []
        if topk and self.save_top_k > 0 and len(self.best_k_models) >= self.save_top_k:
            remove.append(self.kth_best_model_path)
        previous_last = self.last_model_path
        if previous_last and last and previous_last != last and previous_last not in self.best_k_models:
            remove.append(previous_last)
        return {"topk": topk, "last": last, "score": score, "remove": [p for p in remove if p and p not in (topk, last)]}

    def _apply_plan(self, plan: dict[str, Any], global_step: int) -> None:
        """Update the bookkeeping (identically on every rank) before the checkpoint is written, so it saves it."""
        self._last_global_step_saved = global_step
        for path in plan["remove"]:
            self.best_k_models.pop(path, None)
        if plan["topk"]:
            self.best_k_models[plan["topk"]] = plan["score"]
            self._update_best_and_kth()
        if plan["last"]:
            self.last_model_path = plan["last"]

    def _update_best_and_kth(self) -> None:
        ordered = sorted(self.best_k_models.items(), key=lambda kv: kv[1], reverse=self._ranking_mode == "max")
        self.best_model_path, best_score = ordered[0]
        self.best_model_score = best_score if self.monitor is not None else None
        self.kth_best_model_path, self.kth_value = ordered[-1]

    @property
    def _ranking_mode(self) -> str:
        return self.mode if self.monitor is not None else "max"

    def _enters_top_k(self, score: float) -> bool:
        if self.save_top_k == 0:
            return False
        if self.save_top_k == -1 or len(self.best_k_models) < self.save_top_k or self.kth_value is None:
            return True
        return score < self.kth_value if self._ranking_mode == "min" else score > self.kth_value

    def _metrics(self, trainer: TrainerView) -> dict[str, Any]:
        metrics: dict[str, Any] = {}
        for key, value in trainer.callback_metrics.items():
            item = getattr(value, "item", None)
            metrics[key] = item() if callable(item) else value
        metrics["epoch"] = int(trainer.current_epoch)
        metrics["step"] = int(trainer.global_step)
        return metrics

    def _score(self, trainer: TrainerView, metrics: dict[str, Any], monitor_required: bool) -> float | None:
        if self.monitor is None:
            return float(trainer.global_step)  # without a monitor the newest ranks best
        if self.monitor not in metrics:
            message = (
                f"ModelCheckpoint(monitor={self.monitor!r}) could not find {self.monitor!r} in the logged metrics "
                f"{sorted(trainer.callback_metrics)}; log it with self.log({self.monitor!r}, value) "
                "or change `monitor`"
            )
            if monitor_required:
                raise RuntimeError(message)
            if self.monitor not in self._warned_missing:
                self._warned_missing.add(self.monitor)
                warnings.warn(message + " (skipping the top-k save until it is logged)", stacklevel=2)
            return None
        score = float(metrics[self.monitor])
        if math.isnan(score):
            score = math.inf if self.mode == "min" else -math.inf
        return score

    def format_checkpoint_name(
        self, metrics: dict[str, Any], filename: str | None = None, ver: int | None = None, prefix: str | None = None,
    ) -> str:
        """Fill the filename template with `metrics` (missing fields become 0, with a warning); Lightning's `prefix` goes
        before it and `ver` after it (``prefix-name-v2``). The name of a checkpoint directory in `dirpath`, without
        Lightning's ``.ckpt``."""
        name = self._fill_template(metrics, filename)
        if prefix:
            name = f"{prefix}-{name}"
        return f"{name}-v{ver}" if ver is not None else name

    def _fill_template(self, metrics: dict[str, Any], filename: str | None) -> str:
        template = filename or self.filename or "{epoch}-{step}"
        values = dict(metrics)
        groups = sorted(set(re.findall(r"(\{.*?)[:\}]", template)), key=len, reverse=True)
        for group in groups:
            name = group[1:]
            if self.auto_insert_metric_name:
                template = template.replace(group, name + self.CHECKPOINT_EQUALS_CHAR + "{" + name)
            template = template.replace(group, "{0[" + name + "]")
            if name not in values:
                if name not in self._warned_missing:
                    self._warned_missing.add(name)
                    warnings.warn(f"ModelCheckpoint filename field {name!r} is not a logged metric; it is written as 0", stacklevel=4)
                values[name] = 0
        return template.format(values).replace("/", "_")

    def _unique_path(self, name: str) -> Path:
        assert self.dirpath is not None
        if not self.enable_version_counter:
            return self.dirpath / name  # replaced once the new one is complete (the store's atomic replace)
        path, version = self.dirpath / name, 0
        while path.exists() or str(path) in self.best_k_models or str(path) == self.last_model_path:
            version += 1
            path = self.dirpath / f"{name}-v{version}"
        return path

    def _remove(self, path: Path) -> None:
        if self.dirpath is not None and path.parent == self.dirpath:
            store.remove_checkpoint(path)
