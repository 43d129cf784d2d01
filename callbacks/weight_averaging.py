"""`WeightAveraging` and `EMAWeightAveraging`: an averaged copy of the weights (SWA or EMA), as Lightning 2.6's.

The average is a `torch.optim.swa_utils.AveragedModel` of the module, updated after every optimizer step (or when
`WeightAveraging.should_update` says). It is swapped in for validation during ``fit`` and copied into the module at
the end of training. Checkpoints written during ``fit`` hold it as a file of their own, ``averaged_model.bin``
(tensors only, written by process 0: the weights are the same on every process), next to the module's current
weights in ``model.safetensors``; ``fit(ckpt_path=...)`` restores both, so a resumed run continues the same average
bit for bit.

Under FSDP (``strategy="fsdp"``) the average is sharded like the module: the averaged copy's parameters are DTensors
with the module's placements, so each process averages its own shard and no collective runs on update or swap. A
checkpoint gathers the full average into ``averaged_model.bin`` (process 0 writes it, the same file as without
sharding), and a resume slices it back into each process's shards. DeepSpeed, which owns the parameters, is refused.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch.optim.swa_utils import AveragedModel, get_ema_avg_fn

from callbacks.base import Callback
from strategies.abilities import Engine
from trainer.accelerator.state import Part

if TYPE_CHECKING:
    from callbacks.view import TrainerView
    from strategies.base import Strategy
    from trainer.fit.module import TrainModule

AVERAGED_MODEL_FILE = "averaged_model.bin"


class WeightAveraging(Callback):
    """Keep an averaged model (SWA by default, or any ``avg_fn``/``multi_avg_fn``) of the module during ``fit``.

    Lightning's ``WeightAveraging``: the keyword arguments go to `torch.optim.swa_utils.AveragedModel` (``avg_fn``,
    ``multi_avg_fn``); unlike ``AveragedModel``, ``use_buffers`` defaults to True (buffers such as BatchNorm statistics
    are averaged too). Override `should_update` to choose when the average is updated. During validation the module
    holds the averaged weights (swapped back afterwards), and after training it keeps them.

    The averaged model is built when ``fit`` starts (after ``configure_model``, on the module's device unless `device`
    says otherwise) and saved in every checkpoint of the fit as ``averaged_model.bin``; ``model.safetensors`` holds
    the weights being trained (Lightning puts the average in its ``state_dict`` and the trained weights beside it).

    Args:
        device: where the averaged model lives (``"cpu"`` to save accelerator memory); the module's device by default.
        use_buffers: average the buffers too; with False they are left to ``torch.optim.swa_utils.update_bn``.
        **kwargs: passed to ``AveragedModel``, e.g. ``avg_fn=get_ema_avg_fn(0.999)``.

    Under FSDP the average is sharded like the module (each process averages its own shard); `device` must then be
    left out, since the averaged shards live where the module's shards live.

    Raises:
        NotImplementedError: at ``setup``, under a strategy that owns the parameters (DeepSpeed) or shards them in a way
            other than FSDP's.
        ValueError: at ``setup``, with `device` under FSDP.

    Example::

        class EMAFrom100(WeightAveraging):
            def __init__(self):
                super().__init__(avg_fn=get_ema_avg_fn(0.999))

            def should_update(self, step_idx=None, epoch_idx=None):
                return step_idx is not None and step_idx >= 100

        Trainer(callbacks=[EMAFrom100()]).fit(module, loader)
    """

    def __init__(self, device: torch.device | str | int | None = None, use_buffers: bool = True, **kwargs: Any) -> None:
        self._device: torch.device | int | None = torch.device(device) if isinstance(device, str) else device
        self._use_buffers = use_buffers
        self._kwargs = kwargs
        self._average_model: AveragedModel | None = None
        self._slot = AveragedModelSlot()
        self._sharded = False  # whether this fit's module is sharded with FSDP (then so is the average)
        # optimizer steps taken at the last update: should_update is first asked after the first optimizer step
        self._latest_update_step = 0
        self._latest_update_epoch = -1  # the epoch after which the average was last updated

    @property
    def average_model(self) -> AveragedModel | None:
        """The `AveragedModel` (its ``module`` holds the averaged weights); None before the first ``fit``."""
        return self._average_model

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        """Update the average after optimizer step `step_idx` (0-based), or after epoch `epoch_idx`? One of them is
        given. By default: after every optimizer step."""
        return step_idx is not None

    # ------------------------------------------------------------------ the fit
    def setup(self, trainer: TrainerView, module: TrainModule, stage: str) -> None:
        if stage != "fit":
            return
        self._sharded = _check_strategy(self, trainer.strategy)
        self._average_model = None  # a new average for every fit, as Lightning's (built at on_fit_start, or by the resume)
        strategy = trainer.strategy if self._sharded else None
        self._slot.attach(self, trainer, _AveragedState(self, module, strategy))

    def teardown(self, trainer: TrainerView, module: TrainModule, stage: str) -> None:
        if stage == "fit":
            self._slot.detach()

    def on_fit_start(self, trainer: TrainerView, module: TrainModule) -> None:
        self._build(module)  # (unless a resumed checkpoint built and filled it already)

    def on_train_batch_end(self, trainer: TrainerView, module: TrainModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        if step > self._latest_update_step and self.should_update(step_idx=step - 1):
            self._build(module).update_parameters(module)
            self._latest_update_step = step

    def on_train_epoch_end(self, trainer: TrainerView, module: TrainModule) -> None:
        epoch = trainer.current_epoch
        if epoch > self._latest_update_epoch and self.should_update(epoch_idx=epoch):
            self._build(module).update_parameters(module)
            self._latest_update_epoch = epoch

    def on_train_end(self, trainer: TrainerView, module: TrainModule) -> None:
        average = self._build(module).module
        self._reshard(module)
        with torch.no_grad():
            for avg, current in zip(_tensors(average), _tensors(module)):
                _local(current).copy_(_local(avg))

    def on_validation_epoch_start(self, trainer: TrainerView, module: TrainModule) -> None:
        if self._average_model is not None:
            self._swap(module)

    def on_validation_epoch_end(self, trainer: TrainerView, module: TrainModule) -> None:
        if self._average_model is not None:
            self._swap(module)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {"latest_update_step": self._latest_update_step, "latest_update_epoch": self._latest_update_epoch}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._latest_update_step = int(state_dict["latest_update_step"])
        self._latest_update_epoch = int(state_dict.get("latest_update_epoch", -1))

    # ------------------------------------------------------------------ helpers
    def _build(self, module: TrainModule) -> AveragedModel:
        if self._average_model is None:
            with trainer_detached(module):  # the Trainer is not deep-copied with the module
                if self._sharded:  # (an FSDP module cannot be deep-copied: its weights are, shard by shard)
                    from strategies.fsdp import weights_view  # lazy: import cost (needed only under FSDP)

                    self._average_model = AveragedModel(weights_view(module), use_buffers=self._use_buffers, **self._kwargs)
                else:
                    device = self._device or module.device
                    self._average_model = AveragedModel(module, device=device, use_buffers=self._use_buffers, **self._kwargs)
        return self._average_model

    def _swap(self, module: TrainModule) -> None:
        assert self._average_model is not None
        self._reshard(module)
        with torch.no_grad():
            for avg, current in zip(_tensors(self._average_model.module), _tensors(module)):
                avg, current = _local(avg), _local(current)  # (under FSDP: this process's shards)
                saved = avg.clone()
                avg.copy_(current)
                current.copy_(saved)

    def _reshard(self, module: TrainModule) -> None:
        """Under FSDP: free any gathered parameters, so that `module` holds its shards and the next forward gathers
        them afresh (the swap writes the shards)."""
        if self._sharded:
            from strategies.fsdp import reshard  # lazy: import cost (needed only under FSDP)

            reshard(module)


class AveragedModelSlot:
    """The averaged model's place in a fit's checkpoints (`AVERAGED_MODEL_FILE`): one per Trainer, taken at the
    averaging callback's ``setup`` and given back at its ``teardown`` (`WeightAveraging`, `StochasticWeightAveraging`)."""

    def __init__(self) -> None:
        self._part: Part | None = None
        self._accelerator: Any = None  # whose checkpoint_parts hold `_part` during a fit

    def attach(self, owner: Callback, trainer: TrainerView, state: Any) -> None:
        """Add `state` (``state_dict``/``load_state_dict``) to the checkpoints; another averaging callback's is a `ValueError`."""
        parts = trainer.accelerator.checkpoint_parts
        if any(part.file == AVERAGED_MODEL_FILE and part is not self._part for part in parts):
            raise ValueError(f"{type(owner).__name__}: a Trainer takes one weight-averaging callback; remove the others")
        self.detach()
        self._part = Part(AVERAGED_MODEL_FILE, "torch", state, optional=True)
        self._accelerator = trainer.accelerator
        parts.append(self._part)

    def detach(self) -> None:
        if self._accelerator is not None and self._part is not None:
            parts = self._accelerator.checkpoint_parts
            parts[:] = [part for part in parts if part is not self._part]
        self._part, self._accelerator = None, None


class EMAWeightAveraging(WeightAveraging):
    """An exponential moving average of the weights (Lightning's ``EMAWeightAveraging``):
    ``average = decay * average + (1 - decay) * weights`` after every `update_every_n_steps`-th optimizer step, from
    step `update_starting_at_step` (0-based) on, and after each epoch from `update_starting_at_epoch` on if given; the
    first update copies the weights.

    Args:
        device: where the averaged model lives; the module's device by default.
        use_buffers: average the buffers too.
        decay: the EMA decay.
        update_every_n_steps: update after every n-th optimizer step (0: never after a step).
        update_starting_at_step: the first optimizer step (0-based) after which the average is updated.
        update_starting_at_epoch: also update after each epoch from this one (0-based) on.
        **kwargs: passed to ``AveragedModel``.
    """

    def __init__(
        self,
        device: torch.device | str | int | None = None,
        use_buffers: bool = True,
        decay: float = 0.999,
        update_every_n_steps: int = 1,
        update_starting_at_step: int | None = None,
        update_starting_at_epoch: int | None = None,
        **kwargs: Any,
    ) -> None:
        if not 0.0 <= decay <= 1.0:
            raise ValueError(f"EMAWeightAveraging(decay={decay!r}) must lie in [0, 1]; e.g. decay=0.999")
        super().__init__(device=device, use_buffers=use_buffers, **kwargs, avg_fn=get_ema_avg_fn(decay=decay))
        self.decay = decay
        self.update_every_n_steps = update_every_n_steps
        self.update_starting_at_step = update_starting_at_step
        self.update_starting_at_epoch = update_starting_at_epoch

    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        if step_idx is not None:
            started = self.update_starting_at_step is None or step_idx >= self.update_starting_at_step
            if started and self.update_every_n_steps > 0 and step_idx % self.update_every_n_steps == 0:
                return True
        return epoch_idx is not None and self.update_starting_at_epoch is not None and epoch_idx >= self.update_starting_at_epoch


def _check_strategy(callback: WeightAveraging, strategy: Strategy) -> bool:
    """Whether `strategy` shards the module with FSDP (the average is then sharded too); raise for the strategies
    the average cannot follow (DeepSpeed owns the parameters; another sharded strategy is unknown here)."""
    from strategies.fsdp import FSDPStrategy  # lazy: import cost (needed only under FSDP)

    if isinstance(strategy, FSDPStrategy):
        if callback._device is not None:
            raise ValueError(
                f"{type(callback).__name__}(device='{callback._device}') is not available with strategy='fsdp': the average "
                "is sharded like the module and its shards live where the module's shards live; leave device out "
                "(FSDPStrategy(cpu_offload=True) keeps both in CPU memory)"
            )
        return True
    if getattr(strategy, "sharded", False) or isinstance(strategy, Engine):
        raise NotImplementedError(
            f"{type(callback).__name__} does not support strategy {type(strategy).__name__}: it shards or owns the parameters, "
            "so each process holds only part of them and an averaged copy would need the same sharding; use FSDP "
            "(strategy='fsdp'), DDP or a single device, or keep the average yourself with "
            "torch.optim.swa_utils.AveragedModel on the gathered weights"
        )
    return False


@contextlib.contextmanager
def trainer_detached(module: TrainModule) -> Iterator[None]:
    """In the block `module` has no Trainer, so a copy made there (``copy.deepcopy``, an `AveragedModel`) leaves the
    Trainer out; it is attached again after."""
    try:
        trainer = module.trainer
    except RuntimeError:  # not attached: there is nothing to leave out
        yield
        return
    module.trainer = None
    try:
        yield
    finally:
        module.trainer = trainer


def refuse_sharded(callback: Callback, strategy: Strategy) -> None:
    """Raise NotImplementedError under a strategy that shards the parameters (FSDP) or owns them (DeepSpeed)."""
    if getattr(strategy, "sharded", False) or isinstance(strategy, Engine):
        raise NotImplementedError(
            f"{type(callback).__name__} does not support strategy {type(strategy).__name__}: it shards or owns the parameters, "
            "so each process holds only part of them and an averaged copy would need the same sharding; use DDP or a "
            "single device, or keep the average yourself with torch.optim.swa_utils.AveragedModel on the gathered weights"
        )


class _AveragedState:
    """The checkpoint part of a `WeightAveraging`: the ``AveragedModel``'s state dict (weights and ``n_averaged``).

    With a sharding `strategy` (FSDP) the averaged weights are gathered into full tensors on process 0 when saved
    (a collective: every process's ``state_dict`` runs in step) and sliced into each process's shards when loaded.
    """

    def __init__(self, callback: WeightAveraging, module: TrainModule, strategy: Strategy | None = None) -> None:
        self.callback, self.module, self.strategy = callback, module, strategy

    def state_dict(self) -> dict[str, Any]:
        average = self.callback.average_model
        if average is None:
            return {}
        if self.strategy is None:
            return dict(average.state_dict())
        full = self.strategy.module_state_dict(average.module)  # (process 0 only; the others get {})
        if not full:
            return {}
        return {"n_averaged": average.n_averaged.detach().cpu().clone(), **{f"module.{k}": v for k, v in full.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        average = self.callback._build(self.module)
        if self.strategy is None:
            average.load_state_dict(state)
            return
        if "n_averaged" not in state:
            raise ValueError(f"{AVERAGED_MODEL_FILE} holds no n_averaged entry: it was not written by a WeightAveraging callback")
        weights = {k[len("module."):]: v for k, v in state.items() if k.startswith("module.")}
        self.strategy.load_module_state_dict(average.module, weights)
        average.n_averaged.copy_(state["n_averaged"])


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This process's shard of a DTensor (a view that writes through), or the tensor itself."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if to_local is not None else tensor


def _tensors(module: torch.nn.Module) -> Any:
    return itertools.chain(module.parameters(), module.buffers())


__all__ = ["EMAWeightAveraging", "WeightAveraging"]
