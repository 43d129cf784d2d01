"""``Trainer(plugins=[MixedPrecision(...)])`` and the other precision plugins Lightning users pass: each names the
precision as ``Trainer(precision=...)`` does (Lightning 2.6.6's results for the same script, run in a side
environment), with Lightning's errors for a plugin beside ``precision=`` or two precision plugins."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from strategies.precision import Precision
from trainer import Trainer, TrainModule
from trainer.plugins import BitsandbytesPrecision, DeepSpeedPrecision, DoublePrecision, FSDPPrecision, HalfPrecision, MixedPrecision
from trainer.plugins.io import AsyncCheckpointIO

QUIET = {"log_with": None, "enable_progress_bar": False, "enable_model_summary": False, "enable_checkpointing": False}


class Line(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(4, 1)
        self.dtypes: list[str] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (x,) = batch
        out = self.layer(x)
        self.dtypes.append(str(out.dtype))
        return out.float().pow(2).mean()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(tmp_path: Any, **kwargs: Any) -> Line:
    module = Line()
    Trainer(max_epochs=1, project_dir=tmp_path, accelerator="cpu", **QUIET, **kwargs).fit(
        module, DataLoader(TensorDataset(torch.arange(16.0).reshape(4, 4) / 10), batch_size=2))
    return module


# Lightning 2.6.6, the same script with Trainer(plugins=[plugin], accelerator="cpu"): the step's output dtype, the
# parameter dtype and the weights after two steps
LIGHTNING = {
    "bf16-mixed": ("torch.bfloat16", "torch.float32", [0.14391283690929413, 0.4367764890193939, -0.22109286487102509, -0.15586012601852417]),
    "bf16-true": ("torch.bfloat16", "torch.bfloat16", [0.1435546875, 0.435546875, -0.2216796875, -0.154296875]),
    "64-true": ("torch.float64", "torch.float64", [0.14359314149488966, 0.43696777104492746, -0.221367154892973, -0.15640466676437742]),
}


@pytest.mark.parametrize(("plugin", "precision"), [
    (lambda: MixedPrecision("bf16-mixed", "cpu"), "bf16-mixed"),
    (lambda: HalfPrecision("bf16-true"), "bf16-true"),
    (lambda: DoublePrecision(), "64-true"),
])
def test_a_precision_plugin_trains_as_lightnings(tmp_path: Any, plugin: Any, precision: str) -> None:
    module = _fit(tmp_path / "plugin", plugins=[plugin()])
    out_dtype, parameter_dtype, weights = LIGHTNING[precision]
    assert module.dtypes == [out_dtype, out_dtype]
    assert str(module.layer.weight.dtype) == parameter_dtype
    assert [float(v) for v in module.layer.weight.detach().flatten()] == pytest.approx(weights, abs=1e-6)
    same = _fit(tmp_path / "string", precision=precision)  # the plugin is the precision= string said another way
    assert torch.equal(same.layer.weight, module.layer.weight)


def test_plugins_that_name_the_precision_of_a_sharded_strategy_map_to_their_mode() -> None:
    trainer = Trainer(plugins=[FSDPPrecision("bf16-mixed")], accelerator="cpu", **QUIET)
    assert trainer.accelerator.mixed_precision == "bf16"
    trainer = Trainer(plugins=(DeepSpeedPrecision("bf16-mixed"), AsyncCheckpointIO()), accelerator="cpu", **QUIET)
    assert trainer.accelerator.mixed_precision == "bf16" and trainer._args.async_checkpoint


def test_a_mixed_precision_plugins_loss_scaler_is_the_one_used() -> None:
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    trainer = Trainer(plugins=[MixedPrecision("16-mixed", "cpu", scaler=scaler)], accelerator="cpu", **QUIET)
    assert trainer.accelerator.strategy.precision.scaler is scaler


@pytest.mark.parametrize(("make", "error", "match"), [
    (lambda: Trainer(precision="bf16-mixed", plugins=[MixedPrecision("bf16-mixed", "cpu")]), ValueError,
     r"Received both precision='bf16-mixed' and plugins=\[MixedPrecision\('bf16'\)\]; choose one"),
    (lambda: Trainer(plugins=[DoublePrecision(), HalfPrecision()]), ValueError, "2 precision plugins.*pass one"),
    (lambda: Trainer(plugins=[type("Mine", (Precision,), {})("bf16")]), ValueError, r"Mine\(...\).*strategy.precision = MyPrecision"),
    (lambda: Trainer(plugins=[BitsandbytesPrecision("nf4")]), NotImplementedError, "quantized training is not offered"),
    (lambda: Trainer(plugins=[AsyncCheckpointIO(), AsyncCheckpointIO()]), ValueError, "AsyncCheckpointIO\\(\\) twice"),
    (lambda: Trainer(plugins=[FSDPPrecision("bf16-mixed", policy=object())], accelerator="cpu", **QUIET), ValueError,
     "a MixedPrecisionPolicy is for strategy='fsdp'"),
])
def test_a_precision_plugin_is_refused_where_lightning_refuses_it_or_cannot_be_mapped(make: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        make()


def test_a_mixed_precision_plugin_for_another_device_is_an_error() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch: a CUDA GradScaler without CUDA is disabled
        plugin = MixedPrecision("16-mixed", "cuda")
    with pytest.raises(ValueError, match=r"device='cuda'\)\]\) but this Trainer runs on 'cpu'.*Pass device='cpu'"):
        Trainer(plugins=[plugin], accelerator="cpu", **QUIET)
