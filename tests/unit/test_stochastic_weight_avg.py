"""`StochasticWeightAveraging` (Lightning 2.6's): SWALR replaces the scheduler from ``swa_start``, the module ends
with the equal-weight mean of the weights at the start of the SWA epochs, BatchNorm statistics are recomputed for
them, a resumed run ends bit for bit the same, and bad input is refused."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.optim.swa_utils import update_bn
from torch.utils.data import DataLoader, TensorDataset

from callbacks import Callback, ModelCheckpoint, StochasticWeightAveraging
from trainer import Trainer, TrainModule

MAX_EPOCHS = 5


class Net(TrainModule):
    def __init__(self, batch_norm: bool = False) -> None:
        super().__init__()
        layers = [nn.Linear(4, 8), *([nn.BatchNorm1d(8)] if batch_norm else []), nn.Tanh(), nn.Linear(8, 1)]
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self.net(x).squeeze(1), y)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)]


class EpochStarts(Callback):
    """The learning rate and the weights at each training epoch's start (what SWA averages)."""

    def __init__(self) -> None:
        self.lrs: list[float] = []
        self.weights: dict[int, list[torch.Tensor]] = {}

    def on_train_epoch_start(self, trainer: Any, module: Any) -> None:
        self.lrs.append(trainer.optimizers[0].param_groups[0]["lr"])
        self.weights[trainer.current_epoch] = [p.detach().clone() for p in module.parameters()]


def loader() -> DataLoader:
    x = torch.randn(48, 4, generator=torch.Generator().manual_seed(0))
    return DataLoader(TensorDataset(x, x @ torch.tensor([1.0, -2.0, 0.5, 3.0])), batch_size=12)


def fit(root: Path, swa: StochasticWeightAveraging, *, batch_norm: bool = False, extra: tuple[Callback, ...] = (),
        ckpt_path: str | None = None, max_epochs: int = MAX_EPOCHS, checkpoints: bool = False) -> tuple[Net, Trainer]:
    torch.manual_seed(5)
    module = Net(batch_norm)
    callbacks: list[Callback] = [swa, *extra]
    if checkpoints:
        callbacks.append(ModelCheckpoint(dirpath=root / "ckpts", every_n_epochs=1, save_top_k=-1))
    trainer = Trainer(max_epochs=max_epochs, callbacks=callbacks, log_with=None, enable_checkpointing=checkpoints,
                      enable_progress_bar=False, enable_model_summary=False, project_dir=str(root), seed=3)
    trainer.fit(module, loader(), ckpt_path=ckpt_path)
    return module, trainer


def test_the_module_ends_with_the_mean_of_the_swa_epochs_and_swalr_takes_over(tmp_path: Path) -> None:
    starts = EpochStarts()
    swa = StochasticWeightAveraging(swa_lrs=0.05, swa_epoch_start=0.6, annealing_epochs=2)
    module, _ = fit(tmp_path, swa, extra=(starts,))
    assert swa.swa_start == 2 and swa.swa_end == MAX_EPOCHS - 1  # int(5 * 0.6) = 3, 1-based
    expected = [torch.stack([starts.weights[e][i] for e in (2, 3, 4)]).mean(0) for i in range(len(starts.weights[0]))]
    assert swa.n_averaged is not None and int(swa.n_averaged) == 3
    for got, want in zip(module.parameters(), expected):
        torch.testing.assert_close(got.detach(), want, rtol=1e-6, atol=1e-7)
    lrs = starts.lrs
    assert lrs[:3] == pytest.approx([0.1, 0.09, 0.081])  # StepLR until SWA starts
    assert 0.05 < lrs[3] < 0.081 and lrs[4] == pytest.approx(0.05)  # SWALR anneals to swa_lrs in 2 epochs


def test_batch_norm_statistics_are_recomputed_for_the_average(tmp_path: Path) -> None:
    starts = EpochStarts()
    swa = StochasticWeightAveraging(swa_lrs=0.05, swa_epoch_start=3, annealing_epochs=1, annealing_strategy="linear", device=None)
    module, _ = fit(tmp_path, swa, batch_norm=True, extra=(starts,))
    reference = copy.deepcopy(module.net)
    for p, *epochs in zip(reference.parameters(), *(starts.weights[e] for e in (2, 3, 4))):
        p.data.copy_(torch.stack(epochs).mean(0))
    update_bn(((x,) for x, _ in loader()), reference)  # torch's own recomputation for the averaged weights
    got, want = module.net[1], reference[1]
    assert isinstance(got, nn.BatchNorm1d) and isinstance(want, nn.BatchNorm1d)
    torch.testing.assert_close(got.running_mean, want.running_mean)
    torch.testing.assert_close(got.running_var, want.running_var)
    assert got.momentum == 0.1  # restored after the pass


class TwoLoaderNet(Net):
    """Trained on a list of two loaders: each step gets the combined batch (one batch of each), and learns from the first."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        first, _ = batch
        return super().training_step(first, batch_idx)


def test_batch_norm_statistics_are_recomputed_from_the_combined_batches_of_several_train_loaders(tmp_path: Path) -> None:
    # the recomputation gives training_step what a step gets: the combined batch, not the CombinedLoader's
    # (batch, batch_idx, dataloader_idx) (before, that triple reached the step, which failed to unpack it)
    torch.manual_seed(5)
    module = TwoLoaderNet(batch_norm=True)
    swa = StochasticWeightAveraging(swa_lrs=0.05, swa_epoch_start=3, annealing_epochs=1, device=None)
    trainer = Trainer(max_epochs=MAX_EPOCHS, callbacks=[swa], log_with=None, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, project_dir=str(tmp_path), seed=3)
    trainer.fit(module, [loader(), loader()])
    reference = copy.deepcopy(module.net)
    update_bn(((x,) for x, _ in loader()), reference)  # the first loader's inputs, through the averaged weights
    got, want = module.net[1], reference[1]
    assert isinstance(got, nn.BatchNorm1d) and isinstance(want, nn.BatchNorm1d)
    torch.testing.assert_close(got.running_mean, want.running_mean)
    torch.testing.assert_close(got.running_var, want.running_var)


def test_a_resumed_run_ends_bit_for_bit_the_same(tmp_path: Path) -> None:
    def make() -> StochasticWeightAveraging:
        return StochasticWeightAveraging(swa_lrs=0.05, swa_epoch_start=2, annealing_epochs=3)

    straight, _ = fit(tmp_path / "straight", make())
    fit(tmp_path / "resumed", make(), max_epochs=MAX_EPOCHS, checkpoints=True)
    middle = sorted((tmp_path / "resumed" / "ckpts").iterdir())
    epoch3 = next(p for p in middle if p.name.startswith("epoch=2-"))  # after epoch index 2: SWA began at epoch 1
    resumed, _ = fit(tmp_path / "again", make(), ckpt_path=str(epoch3))
    for a, b in zip(straight.state_dict().values(), resumed.state_dict().values()):
        assert torch.equal(a, b)


def test_bad_input_is_refused() -> None:
    for kwargs, match in (({"swa_lrs": 0}, "swa_lrs"), ({"swa_lrs": [0.1, -1.0]}, "swa_lrs"),
                          ({"swa_lrs": 0.1, "swa_epoch_start": 0}, "swa_epoch_start"),
                          ({"swa_lrs": 0.1, "swa_epoch_start": 1.5}, "swa_epoch_start"),
                          ({"swa_lrs": 0.1, "annealing_strategy": "cosine"}, "'cos' or 'linear'"),
                          ({"swa_lrs": 0.1, "avg_fn": 3}, "avg_fn"), ({"swa_lrs": 0.1, "device": 0}, "device")):
        with pytest.raises(ValueError, match=match):
            StochasticWeightAveraging(**kwargs)

    class Sharded:
        sharded = True

    class View:
        strategy = Sharded()

    with pytest.raises(NotImplementedError, match="shards or owns the parameters"):
        StochasticWeightAveraging(0.1).setup(View(), None, "fit")  # type: ignore[arg-type]


def test_two_optimizers_are_refused(tmp_path: Path) -> None:
    class Two(Net):
        def configure_optimizers(self) -> Any:
            return [torch.optim.SGD(self.net[0].parameters(), lr=0.1), torch.optim.SGD(self.net[2].parameters(), lr=0.1)]

        def training_step(self, batch: Any, batch_idx: int) -> None:
            self.automatic_optimization = False

    trainer = Trainer(max_epochs=1, callbacks=[StochasticWeightAveraging(0.1)], log_with=None, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, project_dir=str(tmp_path))
    module = Two()
    module.automatic_optimization = False
    with pytest.raises(ValueError, match="works with 1 optimizer; the module configures 2"):
        trainer.fit(module, loader())
