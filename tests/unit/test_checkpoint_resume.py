"""Bit-exact resume of a `Trainer` run from its checkpoints, and what a checkpoint directory holds.

Training N steps straight and training k steps, stopping, then ``fit(ckpt_path="last")`` to N must give
bitwise-identical weights and logged losses — with shuffling, dropout, gradient accumulation, bf16 autocast
and a per-step LR scheduler, whether k falls in the first epoch, on an epoch boundary or in a later epoch.
The model and run helpers here are also used by the distributed and kill tests.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from callbacks.base import Callback
from callbacks.checkpoint import ModelCheckpoint
from trainer import Trainer, TrainModule

DATASET_SIZE, BATCH_SIZE, ACCUMULATE = 40, 4, 2  # 10 batches = 5 optimizer steps per epoch (one process)
TOTAL_STEPS = 17  # ends mid-epoch 3


class ResumeNet(TrainModule):
    """A small regression net with dropout, AdamW and a per-step LR schedule; records every loss it computes."""

    def __init__(self, hidden: int = 16, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(4, hidden), nn.ReLU(), nn.Dropout(0.3), nn.Linear(hidden, 1))
        self.losses: dict[str, float] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self(x).float(), y)
        self.losses[f"{self.trainer.current_epoch}/{batch_idx}"] = loss.item()
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", F.mse_loss(self(x).float(), y))

    def configure_optimizers(self) -> Any:
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.8)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class LossRecorder(Callback):
    """Keeps what the Trainer sends to the trackers: step → logged train loss (and validation loss)."""

    def __init__(self) -> None:
        self.logged: dict[int, float] = {}
        self.validation: dict[int, float] = {}

    def on_log_metrics(self, trainer: Any, module: Any, metrics: dict[str, float], step: int) -> None:
        if "train_loss" in metrics:
            self.logged[step] = float(metrics["train_loss"])
        if "val_loss" in metrics:
            self.validation[step] = float(metrics["val_loss"])


def make_loader(size: int = DATASET_SIZE) -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(size, 4, generator=g)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True) + 0.1 * torch.randn(size, 1, generator=g)), batch_size=BATCH_SIZE, shuffle=True)


def run_fit(
    root: Path, max_steps: int, *, ckpt_path: str | None = None, every_n_train_steps: int | None = None,
    init_seed: int = 1, extra_callbacks: tuple[Callback, ...] = (), validate_every: int = 0, **trainer_kwargs: Any,
) -> tuple[ResumeNet, Trainer, LossRecorder]:
    """Fit a fresh `ResumeNet` (initialized from `init_seed`) to `max_steps` in `root`.

    ``validate_every=N`` validates on 12 samples every N training batches (and at each epoch end).
    """
    torch.manual_seed(init_seed)
    module = ResumeNet()
    recorder = LossRecorder()
    callbacks: list[Callback] = [recorder, *extra_callbacks]
    if every_n_train_steps:
        callbacks.append(ModelCheckpoint(dirpath=root / "ckpts", every_n_train_steps=every_n_train_steps, save_top_k=-1))
    settings = dict(
        max_steps=max_steps, max_epochs=100, accumulate_grad_batches=ACCUMULATE, precision="bf16-mixed", callbacks=callbacks,
        log_with=None, log_every_n_steps=1, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=bool(every_n_train_steps), project_dir=str(root), seed=1234,
    )
    val_loader = None
    if validate_every:
        settings.update(val_check_interval=validate_every, num_sanity_val_steps=0)
        val_loader = DataLoader(make_loader(12).dataset, batch_size=BATCH_SIZE)
    settings.update(trainer_kwargs)
    trainer = Trainer(**settings)
    trainer.fit(module, make_loader(), val_loader, ckpt_path=ckpt_path)
    return module, trainer, recorder


def assert_same_weights(a: nn.Module, b: nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    different = [k for k in sa if not torch.equal(sa[k], sb[k])]
    assert not different, f"weights differ after resume: {different}"


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[ResumeNet, Trainer, LossRecorder]:
    return run_fit(tmp_path_factory.mktemp("straight"), TOTAL_STEPS)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("stop_step", [3, 5, 12], ids=["epoch0-mid", "epoch0-end", "epoch2-mid"])
def test_resume_is_bit_exact(tmp_path: Path, straight_run: Any, stop_step: int) -> None:
    straight, straight_trainer, straight_log = straight_run
    first, first_trainer, first_log = run_fit(tmp_path, stop_step, every_n_train_steps=stop_step)
    assert first_trainer.global_step == stop_step
    # a different initialization proves the weights come from the checkpoint
    resumed, trainer, resumed_log = run_fit(tmp_path, TOTAL_STEPS, ckpt_path="last", every_n_train_steps=stop_step, init_seed=99)
    assert trainer.global_step == straight_trainer.global_step == TOTAL_STEPS
    assert_same_weights(straight, resumed)
    assert {**first.losses, **resumed.losses} == straight.losses
    assert not set(first.losses) & set(resumed.losses), "batches were replayed after resume"
    assert {**first_log.logged, **resumed_log.logged} == straight_log.logged
    assert sorted(straight_log.logged) == list(range(TOTAL_STEPS))  # Lightning's tracker steps, from 0
    lr = trainer.optimizers[0].param_groups[0]["lr"]
    assert lr == straight_trainer.optimizers[0].param_groups[0]["lr"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("validate_every", "stop_step"),
    [(10, 5), (3, 8), (3, 7)],
    ids=["epoch-end-validation", "validation-due-after-the-checkpointed-batch", "mid-epoch"],
)
def test_resume_with_validation_is_bit_exact(tmp_path: Path, validate_every: int, stop_step: int) -> None:
    # A checkpoint written at a batch's end comes before the validation due after that batch; the resumed run
    # must run that validation (its loader draws from the RNG), else every later batch sees other random numbers.
    straight, _, straight_log = run_fit(tmp_path / "straight", TOTAL_STEPS, validate_every=validate_every)
    first, _, _ = run_fit(tmp_path, stop_step, every_n_train_steps=stop_step, validate_every=validate_every)
    resumed, trainer, resumed_log = run_fit(tmp_path, TOTAL_STEPS, ckpt_path="last", every_n_train_steps=stop_step, init_seed=99,
                                            validate_every=validate_every)
    assert trainer.global_step == TOTAL_STEPS
    assert_same_weights(straight, resumed)
    assert {**first.losses, **resumed.losses} == straight.losses
    # the pending validation is logged at the step of the batch it followed, as in the uninterrupted run
    assert resumed_log.validation == {s: v for s, v in straight_log.validation.items() if s >= min(resumed_log.validation)}
    assert resumed_log.logged == {s: v for s, v in straight_log.logged.items() if s >= min(resumed_log.logged)}


def test_checkpoint_directory_layout(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    module, _trainer, _ = run_fit(tmp_path, 3, every_n_train_steps=3)
    ckpt = tmp_path / "ckpts" / "epoch=0-step=3"
    names = set(os.listdir(ckpt))
    assert {"model.safetensors", "optimizer.bin", "scheduler.bin", "extra_state.json", "hparams.json", "manifest.json"} <= names
    assert "random_states_0.safetensors" in names and "dataloaders.json" in names
    plain = ResumeNet()
    plain.load_state_dict(load_file(str(ckpt / "model.safetensors")))  # the unwrapped model's keys
    assert_same_weights(plain, module)
    extra = json.loads((ckpt / "extra_state.json").read_text())
    assert extra["global_step"] == 3 and extra["epoch"] == 0
    assert extra["loops"]["fit_loop"]["batches_done_in_epoch"] == 6
    assert extra["hyper_parameters"] == {"hidden": 16, "lr": 0.05}
    assert json.loads((ckpt / "hparams.json").read_text()) == {"hidden": 16, "lr": 0.05}
    assert not (tmp_path / "ckpts" / "last.json").exists()  # no save_last: no last pointer, as in Lightning
    loaded = ResumeNet.load_from_checkpoint(ckpt)
    assert_same_weights(loaded, module)


class HookedNet(ResumeNet):
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["vocab"] = ["a", "b"]
        checkpoint["seen"] = torch.tensor(3)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.restored = (checkpoint["vocab"], checkpoint["seen"], checkpoint["global_step"])


class CountingCallback(Callback):
    def __init__(self) -> None:
        self.batches = 0

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.batches += 1

    def state_dict(self) -> dict[str, Any]:
        return {"batches": self.batches}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.batches = state_dict["batches"]


def test_hooks_and_callback_state_round_trip(tmp_path: Path) -> None:
    counter = CountingCallback()
    trainer = Trainer(max_steps=4, accumulate_grad_batches=2, callbacks=[counter], log_with=None, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False, project_dir=str(tmp_path))
    trainer.fit(HookedNet(), make_loader())
    path = trainer.save_checkpoint(tmp_path / "manual")
    assert json.loads((path / "extra_state.json").read_text())["seen"] == 3
    again, module = CountingCallback(), HookedNet()
    trainer = Trainer(max_steps=5, accumulate_grad_batches=2, callbacks=[again], log_with=None, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False, project_dir=str(tmp_path))
    trainer.fit(module, make_loader(), ckpt_path=str(path))
    assert module.restored == (["a", "b"], 3, 4)
    assert again.batches == 8 + 2  # 8 batches before the checkpoint, 2 more for step 5


class BadHookNet(ResumeNet):
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["weights"] = torch.zeros(3)


def test_non_json_checkpoint_entries_are_rejected(tmp_path: Path) -> None:
    trainer = Trainer(max_steps=1, log_with=None, enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=False, project_dir=str(tmp_path))
    trainer.fit(BadHookNet(), make_loader())
    with pytest.raises(TypeError, match=r"checkpoint\['weights'\] is a Tensor"):
        trainer.save_checkpoint(tmp_path / "bad")
    assert not (tmp_path / "bad").exists()


def test_ckpt_path_last_without_checkpoints_starts_fresh(tmp_path: Path) -> None:
    _module, trainer, _ = run_fit(tmp_path, 2, ckpt_path="last", every_n_train_steps=5)
    assert trainer.global_step == 2


def test_ckpt_path_errors(tmp_path: Path) -> None:
    trainer = Trainer(max_steps=1, log_with=None, enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=False, project_dir=str(tmp_path))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        trainer.fit(ResumeNet(), make_loader(), ckpt_path=str(tmp_path / "nowhere"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="not a complete checkpoint"):
        trainer.fit(ResumeNet(), make_loader(), ckpt_path=str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="ckpt_path='best'"):
        trainer.fit(ResumeNet(), make_loader(), ckpt_path="best")


class CountingDataset(torch.utils.data.Dataset):
    """Counts the samples actually loaded."""

    def __init__(self, base: TensorDataset) -> None:
        self.base, self.loaded = base, 0

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int) -> Any:
        self.loaded += 1
        return self.base[index]


@pytest.mark.parametrize("stop_step", [1, 4])
def test_resume_loads_no_skipped_samples(tmp_path: Path, stop_step: int) -> None:
    run_fit(tmp_path, stop_step, every_n_train_steps=stop_step)
    data = CountingDataset(make_loader().dataset)
    torch.manual_seed(0)
    trainer = Trainer(max_steps=5, accumulate_grad_batches=ACCUMULATE, log_with=None, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False, project_dir=str(tmp_path))
    trainer.fit(ResumeNet(), DataLoader(data, batch_size=BATCH_SIZE, shuffle=True), ckpt_path=str(tmp_path / "ckpts" / f"epoch=0-step={stop_step}"))
    assert trainer.global_step == 5
    remaining_batches = DATASET_SIZE // BATCH_SIZE - stop_step * ACCUMULATE
    assert data.loaded == remaining_batches * BATCH_SIZE  # the same cost wherever the epoch was interrupted


class EpochLossNet(ResumeNet):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self.log("epoch_loss", loss, on_step=False, on_epoch=True)
        return loss


class EpochLossRecorder(Callback):
    def __init__(self) -> None:
        self.values: dict[int, float] = {}

    def on_log_metrics(self, trainer: Any, module: Any, metrics: dict[str, float], step: int) -> None:
        if "epoch_loss" in metrics:
            self.values[int(metrics["epoch"])] = metrics["epoch_loss"]


def test_epoch_level_logged_values_survive_a_mid_epoch_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.modules[__name__], "ResumeNet", EpochLossNet)
    straight, first, resumed = EpochLossRecorder(), EpochLossRecorder(), EpochLossRecorder()
    run_fit(tmp_path / "straight", TOTAL_STEPS, extra_callbacks=(straight,))
    run_fit(tmp_path, 12, every_n_train_steps=12, extra_callbacks=(first,))
    run_fit(tmp_path, TOTAL_STEPS, ckpt_path="last", every_n_train_steps=12, extra_callbacks=(resumed,))
    assert {e: v for e, v in first.values.items() if e < 2} == {e: v for e, v in straight.values.items() if e < 2}
    assert resumed.values == {e: v for e, v in straight.values.items() if e >= 2}


class CurriculumNet(ResumeNet):
    """Its train_dataloader() serves a harder target every 2 epochs (a curriculum stage); records the epochs it is called at."""

    def __init__(self) -> None:
        super().__init__()
        self.loads: list[int] = []

    def train_dataloader(self) -> DataLoader:
        epoch = self.trainer.current_epoch
        self.loads.append(epoch)
        x, y = make_loader().dataset.tensors
        return DataLoader(TensorDataset(x, y + epoch // 2), batch_size=BATCH_SIZE, shuffle=True)


def fit_curriculum(root: Path, max_steps: int, *, stop_step: int, init_seed: int = 1, ckpt_path: str | None = None,
                   extra_callbacks: tuple[Callback, ...] = ()) -> tuple[CurriculumNet, Trainer]:
    torch.manual_seed(init_seed)
    module = CurriculumNet()
    trainer = Trainer(
        max_steps=max_steps, max_epochs=100, accumulate_grad_batches=ACCUMULATE, reload_dataloaders_every_n_epochs=2, log_with=None,
        callbacks=[ModelCheckpoint(dirpath=root / "ckpts", every_n_train_steps=stop_step, save_top_k=-1), *extra_callbacks],
        enable_progress_bar=False,
        enable_model_summary=False, project_dir=str(root), seed=1234,
    )
    trainer.fit(module, ckpt_path=ckpt_path)
    return module, trainer


@pytest.mark.parametrize(("stop_step", "loads"), [(7, [0, 1, 2, 4]), (15, [0, 2, 4])], ids=["epoch1-mid", "epoch2-end"])
def test_a_resumed_run_reloads_its_dataloaders_at_the_same_epochs(tmp_path: Path, stop_step: int, loads: list[int]) -> None:
    # 5 steps per epoch; the loaders are reloaded at the epochs that are multiples of 2, resumed or not. The resumed run
    # builds them before the checkpoint is read (at epoch 0), again at the restored epoch (after the restore, as
    # Lightning), then on the straight run's schedule. Before, it counted 2 epochs from the restored one (epoch1-mid: a
    # reload at 3, none at 2) and trained on the loader built at epoch 0 (epoch2-end: the stage-0 curriculum in epoch 3)
    straight, _ = fit_curriculum(tmp_path / "straight", 25, stop_step=stop_step)
    first, _ = fit_curriculum(tmp_path, stop_step, stop_step=stop_step)
    resumed, trainer = fit_curriculum(tmp_path, 25, stop_step=stop_step, init_seed=99, ckpt_path="last")
    assert straight.loads == [0, 2, 4]
    assert resumed.loads == loads
    assert trainer.global_step == 25
    assert {**first.losses, **resumed.losses} == straight.losses
    assert_same_weights(straight, resumed)


class _Grown(ResumeNet):
    """ResumeNet with one more buffer than the checkpoint written by a ResumeNet holds."""

    def __init__(self, strict: bool) -> None:
        super().__init__()
        self.register_buffer("extra", torch.zeros(1))
        if not strict:
            self.strict_loading = False


@pytest.mark.parametrize("strict", [True, False])
def test_resume_honours_strict_loading(tmp_path: Path, strict: bool) -> None:
    """Lightning's ``strict_loading = False`` lets ``fit(ckpt_path=...)`` resume weights that do not cover the module."""
    run_fit(tmp_path, 4, every_n_train_steps=4)
    checkpoint = next(p for p in (tmp_path / "ckpts").iterdir() if p.is_dir())
    trainer = Trainer(max_steps=6, log_with=None, enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=False, project_dir=str(tmp_path), accumulate_grad_batches=ACCUMULATE)
    if strict:
        with pytest.raises(ValueError, match="missing in the checkpoint: extra"):
            trainer.fit(_Grown(strict), make_loader(), ckpt_path=str(checkpoint))
    else:
        trainer.fit(_Grown(strict), make_loader(), ckpt_path=str(checkpoint))
        assert trainer.global_step == 6
