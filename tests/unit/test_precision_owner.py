"""The strategy owns its precision: a `Precision` is built from `PrecisionSettings`, by the strategy's constructor and by
`Strategy.configure_precision`, which the faces call with what they translated (Accelerate's handlers and
``mixed_precision="fp8"``, Lightning's precision plugins); no module of the faces or the callbacks sets an attribute of a
precision (read from the source with `ast`)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch

from strategies.precision import DeepSpeedPrecision, FSDPPrecision, Precision, PrecisionSettings
from strategies.single_device import SingleDeviceStrategy

ROOT = Path(__file__).resolve().parents[2]


# --- nothing outside strategies/ sets an attribute of a precision ------------------------------------------------------

def _names_a_precision(node: ast.expr) -> bool:
    """`precision`, `self.precision`, `strategy.precision`, `self._precision`, ... (the expression's last name)."""
    last = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return "precision" in last.lower()


def _precision_classes(tree: ast.Module) -> set[str]:
    """Classes in the module that derive from a ``...Precision`` class (their ``self`` is a precision)."""
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
            and any("precision" in ast.unparse(base).lower() for base in node.bases)}


def precision_writes(source: str, name: str = "<source>") -> list[str]:
    """Every ``<a precision>.<attr> = ...`` (also ``+=``, annotated and tuple targets, ``setattr(<a precision>, ...)``),
    ``<not self>.precision = ...`` (a strategy's precision replaced) and ``self.<attr> = ...`` inside a class deriving
    from a precision class, in `source`."""
    tree = ast.parse(source)
    found = []
    inside: dict[int, str] = {}  # id(node) -> the precision class it is in
    for cls in ast.walk(tree):
        if isinstance(cls, ast.ClassDef) and cls.name in _precision_classes(tree):
            for node in ast.walk(cls):
                inside[id(node)] = cls.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" and node.args:
            if _names_a_precision(node.args[0]):
                found.append(f"{name}:{node.lineno} setattr({ast.unparse(node.args[0])}, ...)")
            continue
        else:
            continue
        for leaf in (leaf for target in targets for leaf in (target.elts if isinstance(target, ast.Tuple) else [target])):
            if not isinstance(leaf, ast.Attribute):
                continue
            owner = leaf.value
            is_self = isinstance(owner, ast.Name) and owner.id == "self"
            if _names_a_precision(owner) or (leaf.attr == "precision" and not is_self) or (is_self and id(node) in inside):
                found.append(f"{name}:{node.lineno} {ast.unparse(leaf)}")
    return found


def test_no_module_of_the_faces_or_the_callbacks_sets_an_attribute_of_a_precision() -> None:
    files = sorted((ROOT / "trainer").rglob("*.py")) + sorted((ROOT / "callbacks").rglob("*.py"))
    writes = [w for path in files for w in precision_writes(path.read_text(), str(path.relative_to(ROOT)))]
    assert writes == [], "set a precision through Strategy.configure_precision(PrecisionSettings(...)) instead: " + "; ".join(writes)


@pytest.mark.parametrize("source", [
    "self.strategy.precision.float8 = fp8_backend is not None",  # the Accelerator, before the strategy owned it
    "precision.policy = plugin.policy",  # the Trainer's precision plugin
    "precision.scaler = scaler",
    "a.precision.scaler, b = None, 1",
    "strategy.precision = Precision('bf16')",
    "setattr(strategy.precision, 'float8', True)",
    "class MixedPrecision(Precision):\n    def __init__(self, scaler):\n        self.scaler = scaler",
])
def test_the_scan_finds_each_kind_of_write(source: str) -> None:
    assert precision_writes(source)


def test_the_scan_lets_reads_and_the_faces_own_attributes_through() -> None:
    assert precision_writes("self.precision = strategy.precision\nx = strategy.precision.scaler\nself.plain = True") == []


# --- the settings and configure_precision --------------------------------------------------------------------------

def test_settings_are_normalized_and_checked() -> None:
    assert PrecisionSettings("16-mixed").mode == "fp16"
    assert PrecisionSettings("bf16", scaler_kwargs={}, autocast={}) == PrecisionSettings("bf16")  # empty: the defaults
    with pytest.raises(ValueError, match=r"float8=True\) runs FP8 under bf16 autocast, but mode is 'fp16'; use mode='bf16'"):
        PrecisionSettings("fp16", float8=True)
    with pytest.raises(ValueError, match=r"scaler_kwargs=...\) has \['init'\].*choose from \['init_scale'"):
        PrecisionSettings("fp16", scaler_kwargs={"init": 2.0})
    with pytest.raises(ValueError, match="pass one"):
        PrecisionSettings("fp16", scaler=torch.amp.GradScaler("cpu"), scaler_kwargs={"init_scale": 2.0})
    with pytest.raises(ValueError, match="mixed_precision='fp61' is not supported"):
        PrecisionSettings("fp61")


def test_a_strategy_rebuilds_its_precision_from_the_settings() -> None:
    strategy = SingleDeviceStrategy(cpu=True, precision="fp16")
    built = strategy.precision
    assert built.settings == PrecisionSettings("fp16")
    strategy.configure_precision(PrecisionSettings("fp16"))  # the same settings change nothing
    assert strategy.precision is built
    settings = PrecisionSettings("fp16", scaler_kwargs={"init_scale": 8.0}, autocast={"enabled": False})
    strategy.configure_precision(settings)
    precision = strategy.precision
    assert precision is not built and type(precision) is Precision and precision.settings == settings
    assert precision.scaler is not None and precision.scaler.get_scale() == 8.0
    with precision.autocast():
        assert not torch.is_autocast_enabled("cpu")  # enabled=False: float32 inside
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0)
    strategy.configure_precision(PrecisionSettings("fp16", scaler=scaler))  # back to the mode's autocast, with this scaler
    assert strategy.precision.scaler is scaler and strategy.precision.autocast_settings == {}
    bf16 = SingleDeviceStrategy(cpu=True, precision="bf16")
    bf16.configure_precision(PrecisionSettings("bf16", float8=True))
    assert bf16.precision.float8 and bf16.precision.mode == "bf16"


def test_fsdp_takes_a_policy_through_the_settings() -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from strategies.fsdp import FSDPStrategy

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
    strategy = FSDPStrategy(cpu=True, precision="bf16")
    assert strategy.precision.mp_policy().reduce_dtype == torch.float32  # the mode's
    strategy.configure_precision(dataclasses.replace(strategy.precision.settings, policy=policy))
    assert isinstance(strategy.precision, FSDPPrecision) and strategy.precision.mp_policy() is policy
    assert FSDPStrategy(cpu=True, mixed_precision_policy=policy).precision.mp_policy() is policy  # the constructor's way
    with pytest.raises(AttributeError):
        strategy.precision.policy = None  # type: ignore[misc]  # read-only: the settings say it


@pytest.mark.parametrize(("mode", "settings", "match"), [
    ("bf16", PrecisionSettings("fp16"), (r"has mode 'fp16', but the SingleDeviceStrategy was built with precision='bf16', which it "
                                        r"keeps; pass precision='fp16' to the strategy's constructor")),
    ("bf16", PrecisionSettings("bf16", policy=object()), (r"a MixedPrecisionPolicy is for strategy='fsdp', but this strategy's "
                                                         r"precision is a Precision; drop the policy or use strategy='fsdp'")),
    ("bf16", PrecisionSettings("bf16", scaler_kwargs={"init_scale": 2.0}), (r"loss-scaler settings \{'init_scale': 2.0\} need "
                                                                          r"mixed_precision='fp16'")),
    ("bf16", PrecisionSettings("bf16", scaler=torch.amp.GradScaler("cpu")), (r"GradScaler, as MixedPrecision\(..., scaler=...\)\) "
                                                                            r"needs a precision with loss scaling.*drop the scaler")),
    ("bf16-true", PrecisionSettings("bf16-true", autocast={"enabled": False}), (r"autocast settings \(enabled=False, "
                                                                               r"cache_enabled=None\) need a mixed precision")),
])
def test_what_a_precision_cannot_take_is_refused(mode: str, settings: PrecisionSettings, match: str) -> None:
    strategy = SingleDeviceStrategy(cpu=True, precision=mode)
    built = strategy.precision
    with pytest.raises(ValueError, match=match):
        strategy.configure_precision(settings)
    assert strategy.precision is built  # unchanged


def test_deepspeed_and_fsdp_precisions_refuse_what_they_do_not_run() -> None:
    with pytest.raises(ValueError, match="DeepSpeed scales fp16 losses itself"):
        DeepSpeedPrecision.from_settings(PrecisionSettings("bf16", scaler_kwargs={"init_scale": 2.0}))
    with pytest.raises(ValueError, match="FSDPPrecision with mode 'bf16' runs none"):
        FSDPPrecision.from_settings(PrecisionSettings("bf16", autocast={"enabled": False}))


def test_settings_are_refused_once_a_module_was_set_up_with_the_precision() -> None:
    strategy = SingleDeviceStrategy(cpu=True, precision="fp16")
    strategy.setup_module(torch.nn.Linear(2, 1))
    with pytest.raises(ValueError, match=r"after a module was set up with this SingleDeviceStrategy's precision.*before prepare\(\)"):
        strategy.configure_precision(PrecisionSettings("fp16", scaler_kwargs={"init_scale": 2.0}))
    strategy.configure_precision(PrecisionSettings("fp16"))  # what it already is: nothing to refuse


def test_a_precision_set_on_the_strategy_by_hand_is_not_rebuilt() -> None:
    class Mine(Precision):
        pass

    strategy = SingleDeviceStrategy(cpu=True, precision="fp16")
    strategy.precision = Mine("fp16")
    strategy.configure_precision(PrecisionSettings("fp16"))  # nothing to change: kept
    with pytest.raises(ValueError, match=r"precision is a Mine set on it, which the strategy does not rebuild"):
        strategy.configure_precision(PrecisionSettings("fp16", scaler_kwargs={"init_scale": 2.0}))
    assert type(strategy.precision) is Mine


def test_the_accelerator_hands_its_handlers_to_the_strategy_as_settings() -> None:
    from trainer import Accelerator
    from trainer.state import AcceleratorState
    from trainer.utils import AutocastKwargs, GradScalerKwargs

    acc = Accelerator(cpu=True, mixed_precision="fp16", kwargs_handlers=[GradScalerKwargs(init_scale=16.0), AutocastKwargs(cache_enabled=False)])
    assert acc.strategy.precision.settings == PrecisionSettings("fp16", scaler_kwargs={"init_scale": 16.0},
                                                                autocast={"enabled": True, "cache_enabled": False})
    assert acc.scaler is acc.strategy.precision.scaler and acc.scaler.get_scale() == 16.0
    AcceleratorState._reset_state(True)


def test_the_trainer_hands_a_plugins_scaler_to_the_strategy_and_its_step_uses_it(tmp_path: Any) -> None:
    from torch.utils.data import DataLoader, TensorDataset

    from trainer import Trainer, TrainModule
    from trainer.plugins import MixedPrecision

    class Line(TrainModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return self.layer(batch[0]).float().pow(2).mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def fit(**kwargs: Any) -> tuple[Trainer, torch.Tensor]:
        torch.manual_seed(0)
        module = Line()
        trainer = Trainer(accelerator="cpu", max_steps=2, log_with=None, project_dir=tmp_path, enable_progress_bar=False,
                          enable_model_summary=False, enable_checkpointing=False, gradient_clip_val=0.01, **kwargs)
        trainer.fit(module, DataLoader(TensorDataset(torch.randn(4, 2)), batch_size=2))
        return trainer, module.layer.weight.detach().clone()

    scaler = torch.amp.GradScaler("cpu", init_scale=4.0, growth_interval=1)
    trainer, weights = fit(plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)])
    assert trainer.strategy.precision.settings.scaler is scaler and trainer.strategy.precision.scaler is scaler
    assert scaler.get_scale() == 16.0  # two steps taken by this scaler, growing it each time (growth_interval=1)
    # clipping unscaled the gradients through the same (rebuilt) precision: the weights of a run with another scale
    other = torch.amp.GradScaler("cpu", init_scale=8.0, growth_interval=1)
    assert torch.equal(weights, fit(plugins=[MixedPrecision("16-mixed", "cpu", scaler=other)])[1])


# --- abilities ---------------------------------------------------------------------------------------------------

def test_the_float8_all_gather_refresh_is_an_ability_of_the_strategy() -> None:
    from strategies.abilities import Float8AllGather
    from strategies.fsdp import FSDPStrategy

    assert isinstance(FSDPStrategy(cpu=True), Float8AllGather)
    assert not isinstance(SingleDeviceStrategy(cpu=True), Float8AllGather)


def test_the_accelerator_asks_the_strategy_for_the_float8_refresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under FP8 with float8 all-gather, `prepare` asks a strategy with the ability to refresh the scales, whatever its
    name; a strategy without it, or a recipe without float8 all-gather, is not asked. (The GPU check is lifted: torch
    converts and runs float8 layers on CPU too.)"""
    pytest.importorskip("torchao.float8")
    from strategies.abilities import Float8AllGather
    from trainer import Accelerator
    from trainer.accelerator import accelerator as accelerator_module
    from trainer.state import AcceleratorState
    from trainer.utils import AORecipeKwargs

    monkeypatch.setattr(accelerator_module, "check_fp8", lambda *args: None)
    calls: list[tuple[Any, Any]] = []

    class Refreshing(SingleDeviceStrategy, Float8AllGather):
        name = "mine"

        def precompute_float8_scales_after_step(self, optimizer: torch.optim.Optimizer, module: torch.nn.Module) -> None:
            calls.append((optimizer, module))

    asked, prepared = [], []
    for strategy, all_gather in ((Refreshing(cpu=True, precision="bf16"), True), (Refreshing(cpu=True, precision="bf16"), False),
                                 (SingleDeviceStrategy(cpu=True, precision="bf16"), True)):
        acc = Accelerator(strategy=strategy, mixed_precision="fp8", kwargs_handlers=[AORecipeKwargs(enable_fsdp_float8_all_gather=all_gather)])
        model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 32), torch.nn.Linear(32, 32))
        model, optimizer = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
        asked.append(len(calls))
        prepared.append((optimizer.optimizer, model))
        AcceleratorState._reset_state(True)
    assert asked == [1, 1, 1]  # the first only
    assert calls[0][0] is prepared[0][0] and calls[0][1] is prepared[0][1]  # its optimizer and model
