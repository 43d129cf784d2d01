"""The catalog of misuse: each case gets a built-in exception (or one warning) naming the bad value and the fix,
and loses nothing already saved. Listed in docs/faults.md."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from trainer import Accelerator, Trainer, TrainModule

QUIET = dict(log_with=None, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)


class Net(TrainModule):
    def __init__(self, skip_every: int = 0) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(2, 1)
        self.skip_every = skip_every

    def training_step(self, batch, batch_idx):
        if self.skip_every and batch_idx % self.skip_every == 0:
            return None
        x, y = batch
        return torch.nn.functional.mse_loss(self.lin(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _loader(n: int) -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(n, 2), torch.randn(n, 1)), batch_size=4)


def test_empty_training_loader_is_an_error_not_a_zero_step_success(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"the train dataloader has no batches \(dataset of 0 samples, batch_size=4"):
        Trainer(project_dir=tmp_path, max_epochs=1, **QUIET).fit(Net(), _loader(0))


def test_training_step_returning_none_warns_once_per_fit(tmp_path: Path) -> None:
    trainer = Trainer(project_dir=tmp_path, max_epochs=2, **QUIET)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(Net(skip_every=2), _loader(16))  # 4 batches per epoch, 2 skipped in each
    skipped = [w for w in caught if "training_step returned None for batch 0" in str(w.message)]
    assert len(skipped) == 1 and "every process skipped it" in str(skipped[0].message)
    assert trainer.global_step == 4  # the other batches trained


@pytest.mark.parametrize("obj", [42, "text", (i for i in range(3))], ids=["int", "str", "generator"])
def test_prepare_warns_about_what_it_does_not_prepare(obj) -> None:
    acc = Accelerator(cpu=True)
    with pytest.warns(UserWarning, match=rf"prepare\(\) got a {type(obj).__name__} .*which it does not prepare; it is returned unchanged"):
        assert acc.prepare(obj) is obj


def test_non_scalar_loss_names_its_shape() -> None:
    acc = Accelerator(cpu=True)
    model = acc.prepare(torch.nn.Linear(2, 3))
    with pytest.raises(ValueError, match=r"backward needs a scalar loss, got a tensor of shape \(5, 3\); reduce it first"):
        acc.backward(model(torch.randn(5, 2)))


def test_malformed_config_yaml_names_the_file_and_line(tmp_path: Path) -> None:
    from trainer.cli.config import load_config_file

    bad = tmp_path / "config.yaml"
    bad.write_text("num_processes: 2\nmixed_precision: [bf16\n")
    with pytest.raises(ValueError, match=r"config.yaml' is not valid YAML at line \d+, column \d+: .*recreate the file with `trainer config`"):
        load_config_file(bad)


class Exploding(Net):
    """The loss is NaN on batch 1 of every epoch."""

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return loss * float("nan") if batch_idx == 1 else loss


def test_nonfinite_loss_skip_keeps_the_weights_finite(tmp_path: Path) -> None:
    module = Exploding()
    trainer = Trainer(project_dir=tmp_path, max_epochs=2, on_nonfinite="skip", **QUIET)
    with pytest.warns(UserWarning, match=r"training loss is not finite at step 1, epoch 0, batch 1; every process skipped"):
        trainer.fit(module, _loader(16))
    assert trainer.nonfinite_skipped == 2 and trainer.global_step == 6
    assert all(bool(torch.isfinite(p).all()) for p in module.parameters())


def test_nonfinite_loss_stop_names_the_step(tmp_path: Path) -> None:
    with pytest.raises(FloatingPointError, match=r"not finite at step 1, epoch 0, batch 1 \(this process: nan\); the parameters are still finite"):
        Trainer(project_dir=tmp_path, max_epochs=1, on_nonfinite="stop", **QUIET).fit(Exploding(), _loader(16))


def test_without_on_nonfinite_nan_trains_on_as_in_lightning(tmp_path: Path) -> None:
    module = Exploding()
    Trainer(project_dir=tmp_path, max_epochs=1, **QUIET).fit(module, _loader(16))
    assert not all(bool(torch.isfinite(p).all()) for p in module.parameters())


def test_accelerator_mixed_precision_conflicting_with_a_strategy_instance_is_refused() -> None:
    """Was silently ignored: the instance kept its own precision and the run trained in float32."""
    from strategies import SingleDeviceStrategy
    from trainer import Accelerator

    with pytest.raises(ValueError, match=r"mixed_precision='bf16' but the SingleDeviceStrategy passed was built with precision='no'"):
        Accelerator(strategy=SingleDeviceStrategy(cpu=True), mixed_precision="bf16")
    assert Accelerator(strategy=SingleDeviceStrategy(cpu=True, precision="bf16"), mixed_precision="bf16-mixed").mixed_precision == "bf16"
