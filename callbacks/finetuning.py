"""`BaseFinetuning` and `BackboneFinetuning`: freeze parts of the module before training and unfreeze them later,
adding their parameters to the optimizer as a new parameter group (Lightning 2.6's callbacks).

`BaseFinetuning` calls `freeze_before_training(module)` at ``setup`` (before ``configure_optimizers``, so the optimizer
can be built from the parameters that still require grad) and `finetune_function(module, epoch, optimizer)` at the
start of every training epoch. The parameter groups it added are saved in checkpoints (by parameter name) and put back
on resume, so a resumed run optimizes the same groups with the same learning rates.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Generator, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.nn import Module, ModuleDict
from torch.nn.modules.batchnorm import _BatchNorm
from torch.optim import Optimizer

from callbacks.base import Callback
from strategies.abilities import Engine

if TYPE_CHECKING:
    from callbacks.view import TrainerView
    from trainer.fit.module import TrainModule

log = logging.getLogger(__name__)
Modules = Module | Iterable[Any]


def multiplicative(epoch: int) -> float:
    """`BackboneFinetuning`'s default ``lambda_func``: the backbone's learning rate doubles every epoch."""
    return 2.0


class BaseFinetuning(Callback):
    """Override `freeze_before_training` (freeze with `freeze`) and `finetune_function` (unfreeze with
    `unfreeze_and_add_param_group`); build the optimizer from ``filter(lambda p: p.requires_grad, self.parameters())``.

    Example::

        class UnfreezeAt(BaseFinetuning):
            def freeze_before_training(self, module):
                self.freeze(module.feature_extractor)

            def finetune_function(self, module, epoch, optimizer):
                if epoch == 10:
                    self.unfreeze_and_add_param_group(module.feature_extractor, optimizer, train_bn=True)

    Raises:
        NotImplementedError: at ``setup``, under DeepSpeed (the engine owns the optimizer's groups).
    """

    def __init__(self) -> None:
        self._internal_optimizer_metadata: dict[int, list[dict[str, Any]]] = {}
        self._restarting = False
        self._load_hook: Any = None  # the accelerator's load-state pre-hook of the running fit

    def state_dict(self) -> dict[str, Any]:
        return {"internal_optimizer_metadata": {str(k): v for k, v in self._internal_optimizer_metadata.items()}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._restarting = True
        metadata = state_dict.get("internal_optimizer_metadata", state_dict)
        self._internal_optimizer_metadata = {int(k): v for k, v in metadata.items()}

    def setup(self, trainer: TrainerView, module: TrainModule, stage: str) -> None:
        if isinstance(trainer.strategy, Engine):
            raise NotImplementedError(
                f"{type(self).__name__} does not support the DeepSpeed strategy (its engine owns the optimizer's parameter "
                "groups); choose another strategy or remove the callback"
            )
        self.freeze_before_training(module)
        if stage == "fit":
            self._remove_hook()
            self._load_hook = trainer.accelerator.register_load_state_pre_hook(
                lambda models, directory: self._restore_groups(trainer, module, Path(directory)))

    def teardown(self, trainer: TrainerView, module: TrainModule, stage: str) -> None:
        if stage == "fit":
            self._remove_hook()

    def on_fit_start(self, trainer: TrainerView, module: TrainModule) -> None:
        self._restarting = False  # (the groups were put back before the optimizers' state loaded: `_restore_groups`)

    def _restore_groups(self, trainer: TrainerView, module: Module, directory: Path) -> None:
        """A resumed fit: give the optimizers the parameter groups saved in the checkpoint (by parameter name) before
        their state loads, which needs the same groups."""
        extra = directory / "extra_state.json"
        if not extra.is_file():
            return
        state = json.loads(extra.read_text()).get("callbacks", {}).get(self.state_key)
        if not state:
            return
        metadata = state.get("internal_optimizer_metadata", {})
        named = dict(module.named_parameters())
        for opt_idx, optimizer in enumerate(trainer.optimizers):
            groups = metadata.get(str(opt_idx))
            if groups:
                inner = getattr(optimizer, "optimizer", optimizer)
                inner.param_groups = self._apply_mapping_to_param_groups(groups, named)
                for param in (p for g in inner.param_groups for p in g["params"]):
                    param.requires_grad_(True)

    def _remove_hook(self) -> None:
        if self._load_hook is not None:
            self._load_hook.remove()
            self._load_hook = None

    def on_train_epoch_start(self, trainer: TrainerView, module: TrainModule) -> None:
        for opt_idx, optimizer in enumerate(trainer.optimizers):
            num_param_groups = len(optimizer.param_groups)
            self.finetune_function(module, trainer.current_epoch, optimizer)
            self._store(module, opt_idx, num_param_groups, optimizer.param_groups)

    def finetune_function(self, pl_module: Module, epoch: int, optimizer: Optimizer) -> None:
        """Override to unfreeze (called at every training epoch's start)."""
        raise NotImplementedError(f"{type(self).__name__} must override finetune_function(pl_module, epoch, optimizer)")

    def freeze_before_training(self, pl_module: Module) -> None:
        """Override to freeze (called at ``setup``, before ``configure_optimizers``)."""
        raise NotImplementedError(f"{type(self).__name__} must override freeze_before_training(pl_module)")

    # ------------------------------------------------------------------ Lightning's static helpers
    @staticmethod
    def flatten_modules(modules: Modules) -> list[Module]:
        """The leaf modules of `modules` (a module or an iterable of them), and the parents with parameters of their own."""
        if isinstance(modules, ModuleDict):
            modules = modules.values()
        if isinstance(modules, Iterable) and not isinstance(modules, Module):
            flat: list[Module] = []
            for m in modules:
                flat.extend(BaseFinetuning.flatten_modules(m))
            found: Iterable[Module] = flat
        elif isinstance(modules, Module):
            found = modules.modules()
        else:
            raise TypeError(f"expected a torch.nn.Module or an iterable of modules, got {type(modules).__name__}")
        return [m for m in found if not list(m.children()) or m._parameters]

    @staticmethod
    def filter_params(modules: Modules, train_bn: bool = True, requires_grad: bool = True) -> Generator[torch.nn.Parameter, None, None]:
        """The parameters of `modules` whose ``requires_grad`` is `requires_grad` (BatchNorm's only with `train_bn`)."""
        for mod in BaseFinetuning.flatten_modules(modules):
            if isinstance(mod, _BatchNorm) and not train_bn:
                continue
            for param in mod.parameters(recurse=False):
                if param.requires_grad == requires_grad:
                    yield param

    @staticmethod
    def make_trainable(modules: Modules) -> None:
        """Unfreeze `modules` (BatchNorm layers track running statistics again)."""
        for module in BaseFinetuning.flatten_modules(modules):
            if isinstance(module, _BatchNorm):
                module.track_running_stats = True
            for param in module.parameters(recurse=False):
                param.requires_grad = True

    @staticmethod
    def freeze_module(module: Module) -> None:
        """Freeze one module's own parameters (a BatchNorm stops tracking running statistics)."""
        if isinstance(module, _BatchNorm):
            module.track_running_stats = False
        for param in module.parameters(recurse=False):
            param.requires_grad = False

    @staticmethod
    def freeze(modules: Modules, train_bn: bool = True) -> None:
        """Freeze `modules`; with `train_bn` their BatchNorm layers stay trainable."""
        for mod in BaseFinetuning.flatten_modules(modules):
            if isinstance(mod, _BatchNorm) and train_bn:
                BaseFinetuning.make_trainable(mod)
            else:
                BaseFinetuning.freeze_module(mod)

    @staticmethod
    def filter_on_optimizer(optimizer: Optimizer, params: Iterable[torch.nn.Parameter]) -> list[torch.nn.Parameter]:
        """`params` that are not in `optimizer` yet (with a warning naming the fix for those that are)."""
        present = {id(p) for group in optimizer.param_groups for p in group["params"]}
        out: list[torch.nn.Parameter] = []
        removed: list[torch.nn.Parameter] = []
        for param in params:
            (removed if id(param) in present else out).append(param)
        if removed:
            import warnings

            warnings.warn(
                "The provided params to be frozen already exist within another group of this optimizer. Those parameters "
                f"will be skipped. HINT: build the optimizer as {type(getattr(optimizer, 'optimizer', optimizer)).__name__}(filter(lambda p: p.requires_grad, "
                "self.parameters()), ...) in configure_optimizers", UserWarning, stacklevel=3,
            )
        return out

    @staticmethod
    def unfreeze_and_add_param_group(modules: Modules, optimizer: Optimizer, lr: float | None = None,
                                     initial_denom_lr: float = 10.0, train_bn: bool = True) -> None:
        """Unfreeze `modules` and add their parameters to `optimizer` as a new group with learning rate `lr`
        (by default the first group's divided by `initial_denom_lr`)."""
        BaseFinetuning.make_trainable(modules)
        params_lr = optimizer.param_groups[0]["lr"] if lr is None else float(lr)
        denom_lr = initial_denom_lr if lr is None else 1.0
        params = BaseFinetuning.filter_on_optimizer(optimizer, BaseFinetuning.filter_params(modules, train_bn=train_bn, requires_grad=True))
        if params:
            optimizer.add_param_group({"params": params, "lr": params_lr / denom_lr})

    # ------------------------------------------------------------------ internals
    @staticmethod
    def _apply_mapping_to_param_groups(param_groups: list[dict[str, Any]], mapping: dict[Any, Any]) -> list[dict[str, Any]]:
        output = []
        for g in param_groups:
            group_state = {k: v for k, v in g.items() if k != "params"}
            group_state["params"] = [mapping[p] for p in g["params"]]
            output.append(group_state)
        return output

    def _store(self, module: Module, opt_idx: int, num_param_groups: int, current_param_groups: list[dict[str, Any]]) -> None:
        mapping = {p: n for n, p in module.named_parameters()}
        groups = [{k: (v if k == "params" else _json_value(v)) for k, v in g.items()} for g in current_param_groups]
        if opt_idx not in self._internal_optimizer_metadata:
            self._internal_optimizer_metadata[opt_idx] = self._apply_mapping_to_param_groups(groups, mapping)
        elif num_param_groups != len(current_param_groups):
            self._internal_optimizer_metadata[opt_idx].extend(self._apply_mapping_to_param_groups(groups[num_param_groups:], mapping))


def _json_value(value: Any) -> Any:
    """A parameter group's setting as the JSON of a checkpoint holds it (tuples as lists, 0-dim tensors as numbers)."""
    if isinstance(value, tuple):
        return [_json_value(v) for v in value]
    if isinstance(value, torch.Tensor) and value.ndim == 0:
        return value.item()
    return value


class BackboneFinetuning(BaseFinetuning):
    """Freeze ``module.backbone`` until epoch `unfreeze_backbone_at_epoch`, then train it in its own parameter group
    whose learning rate starts at `backbone_initial_lr` (or the current one times `backbone_initial_ratio_lr`) and is
    multiplied by ``lambda_func(epoch + 1)`` every epoch, up to the current learning rate with `should_align`.

    Raises:
        AttributeError: at ``fit``'s start, the module has no ``backbone`` attribute that is a ``torch.nn.Module``.
    """

    def __init__(self, unfreeze_backbone_at_epoch: int = 10, lambda_func: Callable[[int], float] = multiplicative,
                 backbone_initial_ratio_lr: float = 10e-2, backbone_initial_lr: float | None = None, should_align: bool = True,
                 initial_denom_lr: float = 10.0, train_bn: bool = True, verbose: bool = False, rounding: int = 12) -> None:
        super().__init__()
        if not callable(lambda_func):
            raise TypeError(f"BackboneFinetuning(lambda_func={lambda_func!r}) must be callable(epoch) -> factor")
        self.unfreeze_backbone_at_epoch = unfreeze_backbone_at_epoch
        self.lambda_func = lambda_func
        self.backbone_initial_ratio_lr = backbone_initial_ratio_lr
        self.backbone_initial_lr = backbone_initial_lr
        self.should_align = should_align
        self.initial_denom_lr = initial_denom_lr
        self.train_bn = train_bn
        self.verbose = verbose
        self.rounding = rounding
        self.previous_backbone_lr: float | None = None

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "previous_backbone_lr": self.previous_backbone_lr}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.previous_backbone_lr = state_dict["previous_backbone_lr"]
        super().load_state_dict(state_dict)

    def on_fit_start(self, trainer: TrainerView, module: TrainModule) -> None:
        _backbone(module)
        super().on_fit_start(trainer, module)

    def freeze_before_training(self, pl_module: Module) -> None:
        self.freeze(_backbone(pl_module))

    def finetune_function(self, pl_module: Module, epoch: int, optimizer: Optimizer) -> None:
        current_lr = optimizer.param_groups[0]["lr"]
        if epoch == self.unfreeze_backbone_at_epoch:
            initial = self.backbone_initial_lr if self.backbone_initial_lr is not None else current_lr * self.backbone_initial_ratio_lr
            self.previous_backbone_lr = initial
            self.unfreeze_and_add_param_group(_backbone(pl_module), optimizer, initial, train_bn=self.train_bn,
                                              initial_denom_lr=self.initial_denom_lr)
            if self.verbose:
                log.info(f"Current lr: {round(current_lr, self.rounding)}, Backbone lr: {round(initial, self.rounding)}")
        elif epoch > self.unfreeze_backbone_at_epoch and self.previous_backbone_lr is not None:
            next_lr = self.lambda_func(epoch + 1) * self.previous_backbone_lr
            next_lr = current_lr if (self.should_align and next_lr > current_lr) else next_lr
            optimizer.param_groups[-1]["lr"] = next_lr
            self.previous_backbone_lr = next_lr
            if self.verbose:
                log.info(f"Current lr: {round(current_lr, self.rounding)}, Backbone lr: {round(next_lr, self.rounding)}")


def _backbone(module: Module) -> Module:
    backbone = getattr(module, "backbone", None)
    if not isinstance(backbone, Module):
        raise AttributeError(f"BackboneFinetuning needs {type(module).__name__}.backbone, a torch.nn.Module (the part to "
                             "freeze and unfreeze); set self.backbone in __init__")
    return backbone


__all__ = ["BackboneFinetuning", "BaseFinetuning", "multiplicative"]
