"""`TrainModule` helpers: hyperparameters, load_from_checkpoint, run attributes, and exact resume of a fit."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from callbacks.base import Callback
from trainer.fit.module import TrainModule
from trainer.fit.trainer import Trainer

QUIET: dict[str, Any] = dict(log_with=None, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)


class Base(TrainModule):
    def __init__(self, width: int = 4, lr: float = 0.1, **extra: Any) -> None:
        super().__init__()
        self.save_hyperparameters(ignore="unused")
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(2, width), torch.nn.Tanh(), torch.nn.Linear(width, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> Any:
        opt = torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": torch.optim.lr_scheduler.StepLR(opt, 2, 0.5), "interval": "step"}}


class Child(Base):
    def __init__(self, depth: int, unused: str = "x", width: int = 8) -> None:
        super().__init__(width=width, lr=0.05, tag="child")
        self.depth = depth


def test_save_hyperparameters_collects_the_init_chain() -> None:
    module = Child(depth=3)
    assert dict(module.hparams) == {"width": 8, "lr": 0.05, "tag": "child", "depth": 3}
    assert module.hparams.depth == 3
    with pytest.raises(AttributeError, match="no hyperparameter named 'nope'"):
        module.hparams.nope  # noqa: B018


def test_save_hyperparameters_by_name_and_unknown_names() -> None:
    class Picky(TrainModule):
        def __init__(self, a: int, b: int) -> None:
            super().__init__()
            self.save_hyperparameters("a")

    assert dict(Picky(1, 2).hparams) == {"a": 1}

    class Wrong(TrainModule):
        def __init__(self, a: int) -> None:
            super().__init__()
            self.save_hyperparameters("c")

    with pytest.raises(ValueError, match="'c'\\): not arguments of __init__"):
        Wrong(1)


def test_attributes_outside_a_run() -> None:
    module = Base()
    assert module.device == torch.device("cpu") and module.global_step == 0 and module.current_epoch == 0
    with pytest.raises(RuntimeError, match="not attached to a Trainer"):
        module.trainer  # noqa: B018


def _data(n: int = 12, shuffle: bool = False) -> DataLoader:
    g = torch.Generator().manual_seed(3)
    return DataLoader(TensorDataset(torch.randn(n, 2, generator=g), torch.randn(n, 1, generator=g)), batch_size=2, shuffle=shuffle)


def test_load_from_checkpoint_rebuilds_from_hparams_and_weights(tmp_path: Any) -> None:
    module = Base(width=6, lr=0.2)
    trainer = Trainer(project_dir=tmp_path, max_epochs=1, **QUIET)
    trainer.fit(module, _data())
    assert module.trainer is trainer and module.global_step == 6
    path = trainer.save_checkpoint(tmp_path / "ckpt")
    loaded = Base.load_from_checkpoint(path)
    assert dict(loaded.hparams) == {"width": 6, "lr": 0.2}
    for (name, a), b in zip(module.state_dict().items(), loaded.state_dict().values()):
        torch.testing.assert_close(a, b, msg=name)
    assert Base.load_from_checkpoint(path / "model.safetensors", lr=0.5).hparams.lr == 0.5
    from strategies.checkpoint_io import CheckpointError

    with pytest.raises(CheckpointError, match=r"net\.0\.weight: \(6, 2\) in the checkpoint, \(3, 2\) in the model"):
        Base.load_from_checkpoint(path, width=3)  # a width override that does not fit the saved weights


class CrashAt(Callback):
    """Saves a checkpoint after optimizer step `step`, then stops the process as a crash would."""

    def __init__(self, step: int, directory: Any) -> None:
        self.step, self.directory = step, directory

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.directory)
            raise KeyboardInterrupt


def _run(tmp_path: Any, ckpt_path: Any = None, callbacks: Any = ()) -> tuple[Base, Trainer]:
    module = Base()
    trainer = Trainer(project_dir=tmp_path, max_epochs=2, seed=7, callbacks=list(callbacks), **QUIET)
    trainer.fit(module, _data(shuffle=True), ckpt_path=ckpt_path)
    return module, trainer


@pytest.mark.parametrize("crash_step", [4, 6])  # mid-epoch, and at the last batch of epoch 0
def test_resume_mid_epoch_is_exact(tmp_path: Any, crash_step: int) -> None:
    reference, ref_trainer = _run(tmp_path / "a")
    with pytest.raises(KeyboardInterrupt):
        _run(tmp_path / "b", callbacks=[CrashAt(crash_step, tmp_path / "ckpt")])
    resumed, trainer = _run(tmp_path / "c", ckpt_path=tmp_path / "ckpt")
    assert (trainer.global_step, trainer.current_epoch) == (ref_trainer.global_step, ref_trainer.current_epoch) == (12, 2)
    for (name, a), b in zip(reference.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b, msg=name)
    assert trainer.optimizers[0].param_groups[0]["lr"] == ref_trainer.optimizers[0].param_groups[0]["lr"]


def test_max_steps_stops_mid_epoch_and_a_later_fit_continues(tmp_path: Any) -> None:
    reference, _ = _run(tmp_path / "a")
    module = Base()
    first = Trainer(project_dir=tmp_path / "b", max_steps=5, seed=7, **QUIET)
    first.fit(module, _data(shuffle=True))
    # current_epoch counts the epoch max_steps cut short, as Lightning's; the loop position keeps it open to continue it
    assert (first.global_step, first.current_epoch, first.fit_progress.epoch, first.fit_progress.batches_done_in_epoch) == (5, 1, 0, 5)
    first.save_checkpoint(tmp_path / "at5")
    second = Trainer(project_dir=tmp_path / "c", max_epochs=2, seed=7, **QUIET)
    resumed = Base()
    second.fit(resumed, _data(shuffle=True), ckpt_path=tmp_path / "at5")
    for a, b in zip(reference.parameters(), resumed.parameters()):
        torch.testing.assert_close(a, b)


def test_predict_returns_batches_in_order_and_all_gather_is_identity_in_one_process(tmp_path: Any) -> None:
    module = Base()
    trainer = Trainer(project_dir=tmp_path, **QUIET)
    data = _data(5)
    out = trainer.predict(module, data)
    assert [len(o) for o in out] == [2, 2, 1]
    torch.testing.assert_close(torch.cat(out), module(data.dataset.tensors[0]).detach())
    assert module.all_gather(torch.ones(2)).tolist() == [1.0, 1.0]
    assert trainer.num_predict_batches == 3


def test_limits_and_validation_interval(tmp_path: Any) -> None:
    class Val(Base):
        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.log("v", 1.0)

        def on_validation_start(self) -> None:
            self.seen.append(self.global_step)

    module = Val()
    module.seen = []
    trainer = Trainer(project_dir=tmp_path, max_epochs=2, limit_train_batches=0.5, limit_val_batches=1,
                      val_check_interval=1, num_sanity_val_steps=0, **QUIET)
    trainer.fit(module, _data(), _data(4))
    assert trainer.num_training_batches == 3 and trainer.num_val_batches == 1
    assert module.seen == [1, 2, 3, 4, 5, 6]
    assert trainer.estimated_stepping_batches == 6
