"""True precision ("bf16-true", "16-true", "64-true"): parameters, gradients, optimizer states and compute in one dtype.

What the dtype reaches, in both faces: the parameters (``module.to(dtype)`` before the strategy wraps it), AdamW's
states, the floating-point inputs of the module's forward, and torch's default dtype inside the forward and the
Trainer's steps (so ``torch.randn`` there is in the dtype). Outputs of a prepared forward come back in the caller's
default dtype: float32 in an Accelerator loop (Lightning Fabric), the dtype inside ``training_step``, where the
batch's floating-point tensors are cast too (Lightning's Trainer), so the loss a step returns is in the dtype.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from strategies.precision import (
    DeepSpeedPrecision,
    FSDPPrecision,
    Precision,
    PrecisionSettings,
    check_precision_supported,
    normalize_precision,
)
from trainer import Accelerator, Trainer, TrainModule

QUIET: dict[str, Any] = {"log_with": None, "enable_progress_bar": False, "enable_model_summary": False, "enable_checkpointing": False}
MODES = [("bf16-true", torch.bfloat16), ("16-true", torch.float16), ("64-true", torch.float64)]


@pytest.mark.parametrize(
    ("given", "mode"),
    [("bf16-true", "bf16-true"), ("BF16-True", "bf16-true"), ("16-true", "fp16-true"), ("fp16-true", "fp16-true"),
     ("64-true", "fp64-true"), ("64", "fp64-true"), (64, "fp64-true"), ("double", "fp64-true"), ("fp64", "fp64-true"),
     ("fp64-true", "fp64-true"), ("bf16-mixed", "bf16"), ("16-mixed", "fp16"), (32, "no")],
)
def test_spellings_in_both_faces(given: Any, mode: str, tmp_path: Any) -> None:
    assert normalize_precision(given) == mode
    assert Trainer(project_dir=tmp_path, accelerator="cpu", precision=given, **QUIET).accelerator.mixed_precision == mode
    accelerator = Accelerator(cpu=True, mixed_precision=given)
    assert accelerator.mixed_precision == accelerator.state.mixed_precision == mode


@pytest.mark.parametrize("face", ["trainer", "accelerator"])
def test_environment_variable_names_a_true_mode(face: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINWRIGHT_MIXED_PRECISION", "bf16-true")
    acc = Trainer(project_dir=tmp_path, accelerator="cpu", **QUIET).accelerator if face == "trainer" else Accelerator(cpu=True)
    assert acc.mixed_precision == "bf16-true" and acc.strategy.precision.parameter_dtype == torch.bfloat16


def test_error_messages_list_the_true_modes(tmp_path: Any) -> None:
    from trainer.cli.config import LaunchSettings

    for call in (lambda: normalize_precision("fp61"), lambda: Accelerator(cpu=True, mixed_precision="fp61"),
                 lambda: LaunchSettings(mixed_precision="fp61")):
        with pytest.raises(ValueError, match=r"mixed_precision='fp61' is not supported; choose one of 'no', 'fp16', 'bf16', 'fp16-true', "
                                             r"'bf16-true', 'fp64-true' \(or .*'16-true', .*'64-true'"):
            call()
    with pytest.raises(ValueError, match=r"precision='fp61' is not supported; choose one of 32, 16, 'bf16', .*'16-true', 'bf16-true', '64-true'"):
        Trainer(project_dir=tmp_path, precision="fp61", **QUIET)
    with pytest.raises(ValueError, match="mixed_precision=True is not supported"):
        normalize_precision(True)


def test_launcher_spellings_agree_with_the_strategies_registry() -> None:
    from trainer.cli.config import MIXED_PRECISION_ALIASES, LaunchSettings

    assert {name: normalize_precision(name) for name in MIXED_PRECISION_ALIASES} == MIXED_PRECISION_ALIASES
    for given, mode in (("bf16-true", "bf16-true"), ("16-true", "fp16-true"), ("64-true", "fp64-true"), ("double", "fp64-true")):
        assert LaunchSettings(mixed_precision=given).mixed_precision == mode  # what `Trainer(devices=2)` hands its processes


class Recorder(TrainModule):
    """A tiny regressor that records the dtypes its step sees."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Linear(3, 1)
        self.seen: dict[str, torch.dtype] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen["forward_input"] = x.dtype
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y, index = batch
        out = self(x)
        loss = nn.functional.mse_loss(out, y)
        self.seen.update(batch_x=x.dtype, index=index.dtype, output=out.dtype, loss=loss.dtype, randn=torch.randn(2).dtype)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=0.1)


def _loader() -> DataLoader:
    g = torch.Generator().manual_seed(1)
    return DataLoader(TensorDataset(torch.randn(4, 3, generator=g), torch.randn(4, 1, generator=g), torch.arange(4)), batch_size=4)


def _exp_avg(optimizer: Any, param: torch.Tensor) -> torch.Tensor:
    return getattr(optimizer, "optimizer", optimizer).state[param]["exp_avg"]


@pytest.mark.parametrize(("precision", "dtype"), MODES)
def test_trainer_trains_in_the_dtype(precision: str, dtype: torch.dtype, tmp_path: Any) -> None:
    module = Recorder()
    before = module.net.weight.detach().clone()
    trainer = Trainer(project_dir=tmp_path, accelerator="cpu", precision=precision, max_steps=1, **QUIET)
    trainer.fit(module, _loader())
    weight = module.net.weight
    assert weight.dtype == module.net.bias.dtype == dtype and weight.grad is not None and weight.grad.dtype == dtype
    assert _exp_avg(trainer.optimizers[0], weight).dtype == dtype
    assert not torch.equal(weight.detach().double(), before.to(dtype).double())  # it stepped
    assert module.seen == {"forward_input": dtype, "batch_x": dtype, "index": torch.int64, "output": dtype, "loss": dtype, "randn": dtype}
    assert torch.get_default_dtype() == torch.float32  # restored after the step
    assert trainer.accelerator.scaler is None


def test_evaluation_steps_get_the_batch_in_the_dtype(tmp_path: Any) -> None:
    class Evaluated(Recorder):
        def validation_step(self, batch: Any, batch_idx: int) -> None:
            x, y, index = batch
            self.seen.update(val_x=x.dtype, val_index=index.dtype, val_randn=torch.randn(1).dtype)
            self.log("val_loss", nn.functional.mse_loss(self(x), y))

        def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return self(batch[0])

    module = Evaluated()
    trainer = Trainer(project_dir=tmp_path, accelerator="cpu", precision="bf16-true", **QUIET)
    metrics = trainer.validate(module, _loader())
    predictions = trainer.predict(module, _loader())
    assert module.seen == {"forward_input": torch.bfloat16, "val_x": torch.bfloat16, "val_index": torch.int64, "val_randn": torch.bfloat16}
    assert isinstance(metrics[0]["val_loss"], float) and predictions[0].dtype == torch.bfloat16
    assert torch.get_default_dtype() == torch.float32


@pytest.mark.parametrize(("precision", "dtype"), MODES)
def test_accelerator_trains_in_the_dtype(precision: str, dtype: torch.dtype) -> None:
    accelerator = Accelerator(cpu=True, mixed_precision=precision)
    module = Recorder()
    made: list[torch.dtype] = []
    module.net.register_forward_hook(lambda *_: made.append(torch.randn(1).dtype))
    optimizer = torch.optim.AdamW(module.parameters(), lr=0.1)  # built on the float32 parameters, before prepare
    model, optimizer = accelerator.prepare(module, optimizer)
    x, y, _ = next(iter(_loader()))
    out = model(x)
    assert module.seen["forward_input"] == dtype and made == [dtype]  # inside the forward: the dtype
    assert out.dtype == torch.float32  # outside it: the caller's default dtype (Lightning Fabric's convert_output)
    accelerator.backward(nn.functional.mse_loss(out, y))
    optimizer.step()
    weight = module.net.weight
    assert weight.dtype == dtype and weight.grad is not None and weight.grad.dtype == dtype
    assert _exp_avg(optimizer, weight).dtype == dtype
    assert accelerator.scaler is None and torch.get_default_dtype() == torch.float32


def test_default_dtype_is_restored_after_an_exception(tmp_path: Any) -> None:
    class Failing(Recorder):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            assert torch.get_default_dtype() == torch.bfloat16
            raise RuntimeError("boom")

    trainer = Trainer(project_dir=tmp_path, accelerator="cpu", precision="bf16-true", max_steps=1, **QUIET)
    with pytest.raises(RuntimeError, match="boom"):
        trainer.fit(Failing(), _loader())
    assert torch.get_default_dtype() == torch.float32

    class FailingForward(nn.Linear):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise RuntimeError(f"boom in {torch.get_default_dtype()}")

    model = Accelerator(cpu=True, mixed_precision="64-true").prepare(FailingForward(2, 2))
    with pytest.raises(RuntimeError, match=r"boom in torch\.float64"):
        model(torch.ones(1, 2))
    assert torch.get_default_dtype() == torch.float32


@pytest.mark.parametrize(("precision", "dtype"), [*MODES, ("no", torch.float32), ("bf16-mixed", torch.float32)])
def test_module_init_context(precision: str, dtype: torch.dtype) -> None:
    for cls in (Precision, FSDPPrecision):
        with cls(precision).module_init_context():
            layer = nn.Linear(2, 2)
        assert layer.weight.dtype == layer.bias.dtype == dtype
        assert torch.get_default_dtype() == torch.float32
    with pytest.raises(RuntimeError, match="inside"), Precision("bf16-true").module_init_context():
        raise RuntimeError("inside")
    assert torch.get_default_dtype() == torch.float32


def test_precision_objects_of_the_true_modes() -> None:
    for mode, dtype in (("bf16-true", torch.bfloat16), ("fp16-true", torch.float16), ("fp64-true", torch.float64)):
        for precision in (Precision(mode), FSDPPrecision(mode)):
            assert precision.scaler is None and precision.dtype == precision.parameter_dtype == dtype
            with precision.forward_context():
                assert torch.get_default_dtype() == dtype
        assert FSDPPrecision(mode).mp_policy() is None  # FSDP shards the converted parameters; no policy
    assert Precision("bf16").parameter_dtype is None and FSDPPrecision("fp16").scaler is not None


def test_fsdp_precision_takes_an_explicit_policy() -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
    assert FSDPPrecision("bf16", policy=policy).mp_policy() is policy
    precision = FSDPPrecision("no")
    assert precision.mp_policy() is None
    assert FSDPPrecision.from_settings(PrecisionSettings("no", policy=policy)).mp_policy() is policy  # as a strategy rebuilds it
    assert FSDPPrecision("bf16").mp_policy().reduce_dtype == torch.float32  # the mode's own without one


def test_deepspeed_refuses_the_true_modes_naming_bf16() -> None:
    from strategies.deepspeed import DeepSpeedStrategy

    with pytest.raises(ValueError, match=r"mixed_precision='bf16-true' is not supported by strategy='deepspeed': its engine keeps "
                                         r"float32 master weights .*; use 'bf16'"):
        DeepSpeedPrecision("bf16-true")
    with pytest.raises(ValueError, match=r"'fp16-true' is not supported by strategy='deepspeed'.*use 'bf16'"):
        DeepSpeedStrategy(cpu=True, precision="16-true")
    with pytest.raises(ValueError, match=r"'bf16-true' is not supported by strategy='deepspeed'"):  # before the config's bf16 section
        DeepSpeedStrategy(cpu=True, precision="bf16-true", config={"bf16": {"enabled": True}})
    with pytest.raises(ValueError, match=r"'fp64-true' is not supported by strategy='deepspeed'.*use 'no'"):
        Accelerator(cpu=True, strategy="deepspeed", mixed_precision="64-true")


def test_xla_refuses_the_true_modes_before_importing_torch_xla() -> None:
    from strategies.xla import XLAStrategy

    with pytest.raises(ValueError, match=r"mixed_precision='bf16-true' is not supported by strategy='xla'.*; use 'bf16'"):
        XLAStrategy(precision="bf16-true")
    with pytest.raises(ValueError, match=r"mixed_precision='fp64-true' is not supported by strategy='xla'.*; use 'no'"):
        XLAStrategy(precision="double")


def test_hardware_checks() -> None:
    with pytest.raises(ValueError, match="'fp64-true' is not supported on MPS, which has no float64"):
        check_precision_supported("fp64-true", torch.device("mps"))
    check_precision_supported("fp16-true", torch.device("cpu"))


def test_bf16_true_checkpoint_round_trip_keeps_dtype_and_values(tmp_path: Any) -> None:
    # Accelerator face: save_state, then load_state into a fresh bf16-true model and optimizer
    def build(seed: int) -> tuple[Accelerator, nn.Module, Any]:
        accelerator = Accelerator(cpu=True, mixed_precision="bf16-true")
        torch.manual_seed(seed)
        model = nn.Linear(3, 2)
        return accelerator, *accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=0.1))

    accelerator, model, optimizer = build(0)
    x, _, _ = next(iter(_loader()))
    accelerator.backward(model(x).square().mean())
    optimizer.step()
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    saved_avg = _exp_avg(optimizer, model.weight).clone()
    accelerator.save_state(tmp_path / "state")
    accelerator, model, optimizer = build(1)
    accelerator.load_state(tmp_path / "state")
    for name, value in model.state_dict().items():
        assert value.dtype == torch.bfloat16 and torch.equal(value, saved[name])
    restored_avg = _exp_avg(optimizer, model.weight)
    assert restored_avg.dtype == torch.bfloat16 and torch.equal(restored_avg, saved_avg)

    # Trainer face: save_checkpoint, then resume a fresh module from it (max_steps reached: nothing more runs)
    module = Recorder()
    trainer = Trainer(project_dir=tmp_path, accelerator="cpu", precision="bf16-true", max_steps=2, **QUIET)
    trainer.fit(module, _loader())
    path = trainer.save_checkpoint(tmp_path / "ckpt")
    weights = {k: v.clone() for k, v in module.state_dict().items()}
    resumed = Recorder()
    resumed.net.weight.data.fill_(3.0)
    trainer = Trainer(project_dir=tmp_path, accelerator="cpu", precision="bf16-true", max_steps=2, **QUIET)
    trainer.fit(resumed, _loader(), ckpt_path=str(path))
    assert trainer.global_step == 2 and "loss" not in resumed.seen
    for name, value in resumed.state_dict().items():
        assert value.dtype == torch.bfloat16 and torch.equal(value, weights[name])
    assert _exp_avg(trainer.optimizers[0], resumed.net.weight).dtype == torch.bfloat16
