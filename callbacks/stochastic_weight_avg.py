"""`StochasticWeightAveraging`: Lightning 2.6's SWA callback (Izmailov et al., 2018), over ``torch.optim.swa_utils``.

From epoch ``swa_start`` on, the optimizer's learning rate follows ``SWALR`` (annealed to `swa_lrs` over
`annealing_epochs`, replacing the module's scheduler), and at the start of every epoch up to the last the current
weights are added to an equal-weight running average (or `avg_fn`'s). When ``fit`` reaches ``max_epochs`` the average
is copied into the module; a module with BatchNorm then gets its running statistics recomputed for those weights by
one pass over the training data (``training_step`` without backward, cumulative averages), as Lightning's extra epoch
does. Checkpoints written during ``fit`` hold the average and the SWALR state in ``averaged_model.bin``, so a resumed run
continues the same average bit for bit. Sharded parameters (FSDP, DeepSpeed) are refused, as Lightning does.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn
from torch.optim.swa_utils import SWALR

from callbacks.base import Callback
from callbacks.weight_averaging import AveragedModelSlot, refuse_sharded, trainer_detached

if TYPE_CHECKING:
    from callbacks.view import TrainerView
    from trainer.fit.module import TrainModule

AvgFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class StochasticWeightAveraging(Callback):
    """Average the weights of the epochs from `swa_epoch_start` on, with the SWALR learning-rate schedule.

    Args:
        swa_lrs: the SWA learning rate: one positive float for every parameter group, or a list with one per group.
        swa_epoch_start: an int: the 1-based epoch where SWA starts; a float in [0, 1]: that fraction of ``max_epochs``.
        annealing_epochs: epochs of the annealing to `swa_lrs`.
        annealing_strategy: ``"cos"`` or ``"linear"`` annealing.
        avg_fn: ``avg_fn(averaged, current, n_averaged)`` gives the new averaged tensor; the equal-weight mean by default.
        device: where the averaged copy lives (``"cpu"`` by default, as Lightning's); None: the module's device.

    Raises:
        ValueError: a bad argument (at construction), or at ``fit``'s start: several optimizers or schedulers, or a
            float `swa_epoch_start` with ``max_epochs=-1``.
        NotImplementedError: at ``setup``, under FSDP or DeepSpeed.
    """

    def __init__(self, swa_lrs: float | list[float], swa_epoch_start: int | float = 0.8, annealing_epochs: int = 10,
                 annealing_strategy: str = "cos", avg_fn: AvgFn | None = None, device: torch.device | str | None = "cpu") -> None:
        if isinstance(swa_epoch_start, bool) or not isinstance(swa_epoch_start, (int, float)) or (
            isinstance(swa_epoch_start, int) and swa_epoch_start < 1) or (isinstance(swa_epoch_start, float) and not 0 <= swa_epoch_start <= 1):
            raise ValueError(f"StochasticWeightAveraging(swa_epoch_start={swa_epoch_start!r}) should be a >0 integer or a float between 0 and 1")
        lrs = swa_lrs if isinstance(swa_lrs, list) else [swa_lrs]
        if not isinstance(swa_lrs, (float, list)) or not lrs or not all(isinstance(lr, float) and lr > 0 for lr in lrs):
            raise ValueError(f"StochasticWeightAveraging(swa_lrs={swa_lrs!r}) should be a positive float, or a list of positive floats (e.g. 1e-2)")
        if annealing_strategy not in ("cos", "linear"):
            raise ValueError(f"StochasticWeightAveraging(annealing_strategy={annealing_strategy!r}): choose 'cos' or 'linear'")
        if not isinstance(annealing_epochs, int) or annealing_epochs < 0:
            raise ValueError(f"StochasticWeightAveraging(annealing_epochs={annealing_epochs!r}) should be an int >= 0")
        if avg_fn is not None and not callable(avg_fn):
            raise ValueError(f"StochasticWeightAveraging(avg_fn={avg_fn!r}) should be callable(averaged, current, n_averaged)")
        if device is not None and not isinstance(device, (torch.device, str)):
            raise ValueError(f"StochasticWeightAveraging(device={device!r}) should be a torch.device, a str or None")
        self._swa_epoch_start = swa_epoch_start
        self._swa_lrs = swa_lrs
        self._annealing_epochs = annealing_epochs
        self._annealing_strategy = annealing_strategy
        self._avg_fn: AvgFn = avg_fn or self.avg_fn
        self._device = device
        self.n_averaged: torch.Tensor | None = None
        self._average_model: nn.Module | None = None
        self._swa_scheduler: SWALR | None = None
        self._scheduler_state: dict[str, Any] | None = None  # a resumed run's SWALR state, loaded when SWALR is built
        self._initialized = False
        self._init_n_averaged = 0
        self._latest_update_epoch = -1
        self._start_epoch = 0  # swa_epoch_start as an int (1-based), fixed at fit start
        self._max_epochs = -1
        self._contains_batch_norm = False
        self._slot = AveragedModelSlot()
        self.momenta: dict[nn.Module, float | None] = {}  # the BatchNorm momenta while their statistics are recomputed

    @property
    def swa_start(self) -> int:
        """The first SWA epoch, 0-based."""
        return max(self._start_epoch - 1, 0)

    @property
    def swa_end(self) -> int | float:
        """The last SWA epoch, 0-based (``inf`` with ``max_epochs=-1``)."""
        return float("inf") if self._max_epochs == -1 else self._max_epochs - 1

    @property
    def average_model(self) -> nn.Module | None:
        """The averaged copy of the module (None before ``fit``'s setup)."""
        return self._average_model

    @staticmethod
    def pl_module_contains_batch_norm(pl_module: nn.Module) -> bool:
        return any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in pl_module.modules())

    @staticmethod
    def avg_fn(averaged_model_parameter: torch.Tensor, model_parameter: torch.Tensor, num_averaged: torch.Tensor) -> torch.Tensor:
        """The equal-weight running mean."""
        return averaged_model_parameter + (model_parameter - averaged_model_parameter) / (num_averaged + 1)

    # ------------------------------------------------------------------ the fit
    def setup(self, trainer: TrainerView, module: TrainModule, stage: str) -> None:
        if stage != "fit":
            return
        refuse_sharded(self, trainer.strategy)
        self._slot.attach(self, trainer, _SWAState(self))
        self._average_model = _copy_without_trainer(module)

    def teardown(self, trainer: TrainerView, module: TrainModule, stage: str) -> None:
        if stage == "fit":
            self._slot.detach()

    def on_fit_start(self, trainer: TrainerView, module: TrainModule) -> None:
        if len(trainer.optimizers) != 1:
            raise ValueError(f"StochasticWeightAveraging works with 1 optimizer; the module configures {len(trainer.optimizers)}")
        if len(trainer.lr_scheduler_configs) > 1:
            raise ValueError(f"StochasticWeightAveraging works with at most 1 lr scheduler; the module configures {len(trainer.lr_scheduler_configs)}")
        max_epochs = trainer.max_epochs if trainer.max_epochs is not None else -1
        if isinstance(self._swa_epoch_start, float):
            if max_epochs == -1:
                raise ValueError("StochasticWeightAveraging(swa_epoch_start=<float>) needs max_epochs; with max_epochs=-1 give it as an int")
            self._start_epoch = int(max_epochs * self._swa_epoch_start)
        else:
            self._start_epoch = self._swa_epoch_start
        self._max_epochs = max_epochs
        self._contains_batch_norm = self.pl_module_contains_batch_norm(module)
        if self._scheduler_state is not None:  # resumed after SWA began: SWALR replaces the module's scheduler again,
            trainer.lr_scheduler_configs.clear()  # now, so that an epoch-end step still due at the checkpoint steps it
            self._initialized = True
            self._start_swalr(trainer, module)

    def on_train_epoch_start(self, trainer: TrainerView, module: TrainModule) -> None:
        epoch = trainer.current_epoch
        in_swa = self.swa_start <= epoch <= self.swa_end
        if not self._initialized and in_swa:
            self._initialized = True
            self._start_swalr(trainer, module)
        if in_swa and epoch > self._latest_update_epoch:
            assert self._average_model is not None and self.n_averaged is not None
            self.update_parameters(self._average_model, module, self.n_averaged, self._avg_fn)
            self._latest_update_epoch = epoch

    def on_train_end(self, trainer: TrainerView, module: TrainModule) -> None:
        if self._average_model is None:
            return
        if trainer.current_epoch - 1 == self.swa_end or self._max_epochs == -1:
            self.transfer_weights(self._average_model, module)
            if self._contains_batch_norm:
                self._update_batch_norm(trainer, module)

    # ------------------------------------------------------------------ Lightning's helpers
    @staticmethod
    def transfer_weights(src_pl_module: nn.Module, dst_pl_module: nn.Module) -> None:
        for src, dst in zip(src_pl_module.parameters(), dst_pl_module.parameters()):
            dst.detach().copy_(src.to(dst.device))

    @staticmethod
    def update_parameters(average_model: nn.Module, model: nn.Module, n_averaged: torch.Tensor, avg_fn: AvgFn) -> None:
        for p_swa, p_model in zip(average_model.parameters(), model.parameters()):
            swa, current = p_swa.detach(), p_model.detach().to(p_swa.device)
            swa.copy_(current if n_averaged == 0 else avg_fn(swa, current, n_averaged.to(p_swa.device)))
        n_averaged += 1

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        return {"n_averaged": 0 if self.n_averaged is None else int(self.n_averaged.item()), "latest_update_epoch": self._latest_update_epoch}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._init_n_averaged = int(state_dict["n_averaged"])
        self._latest_update_epoch = int(state_dict["latest_update_epoch"])

    # ------------------------------------------------------------------ internals
    def _start_swalr(self, trainer: TrainerView, module: TrainModule) -> None:
        assert self._average_model is not None
        self._average_model = self._average_model.to(self._device or module.device)
        optimizer = trainer.optimizers[0]
        lrs = self._swa_lrs if isinstance(self._swa_lrs, list) else [self._swa_lrs] * len(optimizer.param_groups)
        if len(lrs) != len(optimizer.param_groups):
            raise ValueError(f"StochasticWeightAveraging(swa_lrs={self._swa_lrs!r}) has {len(lrs)} values for "
                             f"{len(optimizer.param_groups)} parameter groups; give one per group or one float")
        for lr, group in zip(lrs, optimizer.param_groups):
            group["initial_lr"] = lr
        max_epochs = trainer.max_epochs if trainer.max_epochs is not None else -1
        restored_lrs = [group["lr"] for group in optimizer.param_groups]  # SWALR's constructor steps them
        # Lightning's last_epoch: max_epochs for "cos" (its first annealing step starts there), -1 for "linear"
        self._swa_scheduler = SWALR(optimizer, swa_lr=lrs, anneal_epochs=self._annealing_epochs,  # type: ignore[arg-type]
                                    anneal_strategy=self._annealing_strategy,  # type: ignore[arg-type]
                                    last_epoch=max_epochs if self._annealing_strategy == "cos" else -1)
        if self._scheduler_state is not None:  # a resumed run: the schedule and the learning rates as they were saved
            self._swa_scheduler.load_state_dict(self._scheduler_state)
            for lr, group in zip(restored_lrs, optimizer.param_groups):
                group["lr"] = lr
        elif trainer.current_epoch != self.swa_start:
            import warnings

            warnings.warn("SWA is initializing after swa_start without any checkpoint data", UserWarning, stacklevel=2)
        configs = trainer.lr_scheduler_configs
        if configs:
            if configs[0].interval != "epoch" or configs[0].frequency != 1:
                import warnings

                warnings.warn(f"SWA is only supported every epoch; replacing the scheduler configured as {configs[0]}", UserWarning, stacklevel=2)
            configs[0] = cast(Any, _SWALRConfig(self._swa_scheduler))
        else:
            configs.append(cast(Any, _SWALRConfig(self._swa_scheduler)))
        if self.n_averaged is None:
            self.n_averaged = torch.tensor(self._init_n_averaged, dtype=torch.long, device=module.device)

    def reset_batch_norm_and_save_state(self, pl_module: nn.Module) -> None:
        """Zero the BatchNorm running statistics and switch them to cumulative averages (``momentum=None``), keeping
        each layer's momentum in `momenta` (torch's ``update_bn``)."""
        self.momenta = {}
        for module in pl_module.modules():
            if not isinstance(module, nn.modules.batchnorm._BatchNorm) or module.running_mean is None or module.running_var is None:
                continue
            module.running_mean = torch.zeros_like(module.running_mean)
            module.running_var = torch.ones_like(module.running_var)
            self.momenta[module] = module.momentum
            module.momentum = None
            if module.num_batches_tracked is not None:
                module.num_batches_tracked *= 0

    def reset_momenta(self) -> None:
        """Give the BatchNorm layers back the momentum `reset_batch_norm_and_save_state` kept."""
        for module, momentum in self.momenta.items():
            module.momentum = momentum  # type: ignore[assignment]

    def _update_batch_norm(self, trainer: TrainerView, module: TrainModule) -> None:
        """Recompute BatchNorm running statistics for the averaged weights: cumulative averages over one pass of
        the training data through ``training_step`` (no backward), as Lightning's extra epoch."""
        self.reset_batch_norm_and_save_state(module)
        limit = trainer.num_training_batches
        was_training = module.training
        module.train()
        try:
            with torch.no_grad():
                for batch_idx, batch in enumerate(trainer.train_step_batches()):  # (a CombinedLoader's: the batch alone)
                    if batch_idx >= limit:
                        break
                    module.training_step(batch, batch_idx)
        finally:
            module.train(was_training)
            self.reset_momenta()



@dataclass
class _SWALRConfig:
    """SWALR's entry in ``trainer.lr_scheduler_configs``: the fields the Trainer reads of a scheduler configuration
    (``trainer.fit.module.LRSchedulerConfig``'s, with its defaults: stepped after every epoch), defined here because
    callbacks import nothing of the Trainer face."""

    scheduler: Any
    interval: str = "epoch"
    frequency: int = 1
    monitor: str | None = None
    name: str | None = None
    strict: bool = True
    opt_idx: int = 0


class _SWAState:
    """The checkpoint part of `StochasticWeightAveraging`: the averaged weights and the SWALR state."""

    def __init__(self, callback: StochasticWeightAveraging) -> None:
        self.callback = callback

    def state_dict(self) -> dict[str, Any]:
        cb = self.callback
        scheduler = cb._swa_scheduler.state_dict() if cb._swa_scheduler is not None else None
        average = dict(cb._average_model.state_dict()) if cb._average_model is not None else {}
        return {"average_model_state": average, "scheduler_state": scheduler}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        cb = self.callback
        cb._scheduler_state = state.get("scheduler_state")
        if cb._average_model is not None and state.get("average_model_state"):
            cb._average_model.load_state_dict(state["average_model_state"])


def _copy_without_trainer(module: TrainModule) -> nn.Module:
    with trainer_detached(module):
        return copy.deepcopy(module)


__all__ = ["StochasticWeightAveraging"]
