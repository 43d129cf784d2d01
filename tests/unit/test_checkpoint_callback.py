"""ModelCheckpoint: names, argument checks, and (with a real Trainer) when it saves and what it keeps."""

from __future__ import annotations

import pytest

from callbacks.checkpoint import ModelCheckpoint


def test_filename_template_inserts_metric_names() -> None:
    cb = ModelCheckpoint(filename="{epoch:02d}-{val_loss:.3f}")
    assert cb.format_checkpoint_name({"epoch": 3, "step": 10, "val_loss": 0.12345}) == "epoch=03-val_loss=0.123"
    assert ModelCheckpoint().format_checkpoint_name({"epoch": 1, "step": 7}) == "epoch=1-step=7"
    plain = ModelCheckpoint(filename="{epoch:02d}-{val_loss:.3f}", auto_insert_metric_name=False)
    assert plain.format_checkpoint_name({"epoch": 3, "val_loss": 0.5}) == "03-0.500"


def test_filename_with_dotted_and_slashed_names() -> None:
    cb = ModelCheckpoint(filename="{val/acc:.2f}-{epoch_x}-{epoch}")
    name = cb.format_checkpoint_name({"val/acc": 0.5, "epoch_x": 9, "epoch": 2})
    assert name == "val_acc=0.50-epoch_x=9-epoch=2"


def test_missing_filename_field_warns_and_uses_zero() -> None:
    cb = ModelCheckpoint(filename="{epoch}-{val_loss:.2f}")
    with pytest.warns(UserWarning, match="val_loss"):
        assert cb.format_checkpoint_name({"epoch": 0}) == "epoch=0-val_loss=0.00"


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        ({"mode": "median"}, "mode='median'"),
        ({"save_top_k": -2}, "save_top_k=-2"),
        ({"every_n_train_steps": -1}, "every_n_train_steps=-1"),
        ({"every_n_epochs": 1.5}, "every_n_epochs=1.5"),
    ],
)
def test_bad_arguments_are_rejected(kwargs: dict, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        ModelCheckpoint(**kwargs)


def test_dirpath_that_is_a_file_is_rejected(tmp_path) -> None:
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(ValueError, match="existing file"):
        ModelCheckpoint(dirpath=path)


def test_default_schedule() -> None:
    assert ModelCheckpoint().every_n_epochs == 1
    assert ModelCheckpoint(every_n_train_steps=5).every_n_epochs == 0
    assert ModelCheckpoint(every_n_train_steps=5, every_n_epochs=2).every_n_epochs == 2
    assert ModelCheckpoint.runs_last is True


# ------------------------------------------------------------------------------- with a real Trainer
import json  # noqa: E402
import os  # noqa: E402
from collections.abc import Sequence  # noqa: E402
from datetime import timedelta  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from trainer import Trainer, TrainModule  # noqa: E402

VAL_LOSSES = (5.0, 3.0, 4.0, 1.0, 2.0)


class ScriptedNet(TrainModule):
    """Trains a linear layer; its validation loss per epoch is scripted, so top-k outcomes are known."""

    def __init__(self, val_losses: Sequence[float] = VAL_LOSSES) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 1)
        self.val_losses = list(val_losses)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.mse_loss(self.layer(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", torch.tensor(self.val_losses[min(self.trainer.current_epoch, len(self.val_losses) - 1)]))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def tiny_loader() -> DataLoader:
    x = torch.arange(16, dtype=torch.float32).reshape(8, 2) / 16
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)  # 2 batches per epoch


def fit(root: Path, callbacks: list[Any], *, max_epochs: int = len(VAL_LOSSES), ckpt_path: str | None = None,
        module: TrainModule | None = None, **kwargs: Any) -> Trainer:
    trainer = Trainer(max_epochs=max_epochs, callbacks=callbacks, log_with=None, enable_progress_bar=False,
                      enable_model_summary=False, project_dir=str(root), num_sanity_val_steps=1, **kwargs)
    trainer.fit(module or ScriptedNet(), tiny_loader(), tiny_loader(), ckpt_path=ckpt_path)
    return trainer


def saved_names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.is_dir() and not p.is_symlink())


@pytest.mark.parametrize("mode, kept, best", [
    ("min", ["epoch=3-val_loss=1.0", "epoch=4-val_loss=2.0"], ("epoch=3-val_loss=1.0", 1.0)),
    ("max", ["epoch=0-val_loss=5.0", "epoch=2-val_loss=4.0"], ("epoch=0-val_loss=5.0", 5.0)),
])
def test_top_k_by_monitor(tmp_path: Path, mode: str, kept: list[str], best: tuple[str, float]) -> None:
    cb = ModelCheckpoint(dirpath=tmp_path / "ck", filename="{epoch}-{val_loss:.1f}", monitor="val_loss", mode=mode, save_top_k=2)
    fit(tmp_path, [cb])
    assert saved_names(tmp_path / "ck") == kept
    assert (Path(cb.best_model_path).name, cb.best_model_score) == best
    assert sorted(Path(p).name for p in cb.best_k_models) == kept
    assert not (tmp_path / "ck" / "last.json").exists() and cb.last_model_path == ""  # no save_last: no last, as Lightning


class CountsSaves(ScriptedNet):
    def __init__(self) -> None:
        super().__init__()
        self.saved: list[int] = []

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.saved.append(int(checkpoint["global_step"]))


def test_save_last_keeps_the_newest_state(tmp_path: Path) -> None:
    cb = ModelCheckpoint(dirpath=tmp_path / "ck", monitor="val_loss", save_top_k=1, save_last=True)
    module = CountsSaves()
    trainer = fit(tmp_path, [cb], module=module)
    # Lightning's count: last.ckpt is its own save at every epoch (5), plus each new best (5.0, 3.0, 1.0: 3)
    assert module.saved == [2, 2, 4, 4, 6, 8, 8, 10]
    assert saved_names(tmp_path / "ck") == ["epoch=3-step=8", "last-epoch=4-step=10"]
    assert Path(cb.last_model_path).name == "last-epoch=4-step=10"
    assert json.loads((tmp_path / "ck" / "last.json").read_text())["last"] == "last-epoch=4-step=10"
    from trainer.fit.checkpointing import resolve_ckpt_path

    assert resolve_ckpt_path(trainer, "last") == Path(cb.last_model_path)
    assert resolve_ckpt_path(trainer, "best") == Path(cb.best_model_path)
    assert resolve_ckpt_path(trainer, str(tmp_path / "ck" / "last.ckpt")) == Path(cb.last_model_path)
    link = tmp_path / "ck" / "last.ckpt"  # a real path a script can open: the store's link to the newest checkpoint
    assert link.is_symlink() and os.readlink(link) == "last-epoch=4-step=10" and (link / "model.safetensors").is_file()


def test_save_last_is_never_a_top_k_checkpoint(tmp_path: Path) -> None:
    cb = ModelCheckpoint(dirpath=tmp_path / "ck", monitor="val_loss", save_top_k=1, save_last=True)
    fit(tmp_path, [cb], max_epochs=1)  # the first save enters the top k and is the newest state too
    assert saved_names(tmp_path / "ck") == ["epoch=0-step=2", "last-epoch=0-step=2"]
    assert Path(cb.last_model_path).name == "last-epoch=0-step=2" and Path(cb.best_model_path).name == "epoch=0-step=2"


def test_save_last_link_names_the_top_k_checkpoint(tmp_path: Path) -> None:
    cb = ModelCheckpoint(dirpath=tmp_path / "ck", monitor="val_loss", save_top_k=1, save_last="link")
    fit(tmp_path, [cb], max_epochs=3)  # val_loss 5, 3, 4: epoch 2 is no new best, so it is written as last
    assert saved_names(tmp_path / "ck") == ["epoch=1-step=4", "last-epoch=2-step=6"]
    assert Path(cb.last_model_path).name == "last-epoch=2-step=6"
    cb = ModelCheckpoint(dirpath=tmp_path / "ck2", monitor="val_loss", save_top_k=1, save_last="link")
    fit(tmp_path, [cb], max_epochs=2)  # 5, 3: each a new best, no copy
    assert saved_names(tmp_path / "ck2") == ["epoch=1-step=4"]
    assert cb.last_model_path == cb.best_model_path
    assert json.loads((tmp_path / "ck2" / "last.json").read_text())["last"] == "epoch=1-step=4"
    with pytest.raises(ValueError, match="save_last='always'"):
        ModelCheckpoint(save_last="always")


def test_without_monitor_keeps_the_newest(tmp_path: Path) -> None:
    cb = ModelCheckpoint(dirpath=tmp_path / "ck", save_top_k=2, every_n_epochs=2)
    fit(tmp_path, [cb])
    assert saved_names(tmp_path / "ck") == ["epoch=1-step=4", "epoch=3-step=8"]
    assert Path(cb.best_model_path).name == "epoch=3-step=8" and cb.best_model_score is None


def test_every_n_train_steps(tmp_path: Path) -> None:
    cb = ModelCheckpoint(dirpath=tmp_path / "ck", every_n_train_steps=3, save_top_k=-1)
    fit(tmp_path, [cb], max_epochs=4)
    assert saved_names(tmp_path / "ck") == ["epoch=1-step=3", "epoch=2-step=6"]


def test_default_dirpath_is_under_project_dir(tmp_path: Path) -> None:
    trainer = fit(tmp_path, [], max_epochs=2)
    assert saved_names(tmp_path / "checkpoints") == ["epoch=1-step=4"]
    assert trainer.checkpoint_callback.dirpath == (tmp_path / "checkpoints").absolute()


def test_missing_monitor_names_the_logged_metrics(tmp_path: Path) -> None:
    cb = ModelCheckpoint(dirpath=tmp_path / "ck", monitor="val_acc")
    with pytest.raises(RuntimeError, match=r"val_acc.*\['train_loss', 'val_loss'\]"):
        fit(tmp_path, [cb])


def test_validate_and_sanity_check_do_not_save(tmp_path: Path) -> None:
    cb = ModelCheckpoint(dirpath=tmp_path / "ck", monitor="val_loss")
    trainer = Trainer(callbacks=[cb], log_with=None, enable_progress_bar=False, enable_model_summary=False, project_dir=str(tmp_path))
    trainer.validate(ScriptedNet(), tiny_loader())
    assert not (tmp_path / "ck").exists()


def test_state_is_restored_on_resume(tmp_path: Path) -> None:
    def make() -> ModelCheckpoint:
        return ModelCheckpoint(dirpath=tmp_path / "ck", filename="{epoch}-{val_loss:.1f}", monitor="val_loss", save_top_k=2)

    fit(tmp_path / "straight", [ModelCheckpoint(dirpath=tmp_path / "straight_ck", filename="{epoch}-{val_loss:.1f}",
                                                monitor="val_loss", save_top_k=2)])
    fit(tmp_path, [make()], max_epochs=3)
    assert saved_names(tmp_path / "ck") == ["epoch=1-val_loss=3.0", "epoch=2-val_loss=4.0"]
    resumed = make()
    fit(tmp_path, [resumed], ckpt_path="last")
    assert saved_names(tmp_path / "ck") == saved_names(tmp_path / "straight_ck")
    assert Path(resumed.best_model_path).name == "epoch=3-val_loss=1.0" and resumed.best_model_score == 1.0


def test_test_and_validate_load_the_best_weights(tmp_path: Path) -> None:
    cb = ModelCheckpoint(dirpath=tmp_path / "ck", monitor="val_loss", save_top_k=1)
    trainer = fit(tmp_path, [cb])
    from safetensors.torch import load_file

    best = load_file(str(Path(cb.best_model_path) / "model.safetensors"))
    module = trainer.lightning_module
    assert not torch.equal(module.layer.weight, best["layer.weight"])  # trained past the best epoch
    trainer.validate(module, tiny_loader(), ckpt_path="best")
    assert torch.equal(module.layer.weight, best["layer.weight"]) and torch.equal(module.layer.bias, best["layer.bias"])


def test_saves_after_each_validation_when_it_runs_within_the_epoch(tmp_path: Path) -> None:
    cb = ModelCheckpoint(dirpath=tmp_path / "ck", monitor="val_loss", save_top_k=-1)
    fit(tmp_path, [cb], max_epochs=2, val_check_interval=1)  # validation after every batch
    assert saved_names(tmp_path / "ck") == ["epoch=0-step=1", "epoch=0-step=2", "epoch=1-step=3", "epoch=1-step=4"]


def test_lightning_ckpt_file_names_address_the_checkpoint_directories(tmp_path: Path) -> None:
    from trainer.fit.checkpointing import find_last_checkpoint, lightning_path

    root = tmp_path / "ckpts"
    cb = ModelCheckpoint(dirpath=root, every_n_train_steps=2, save_top_k=-1)
    fit(tmp_path, [cb], module=ScriptedNet((5.0, 3.0)))
    newest = max(p for p in root.iterdir() if p.is_dir())
    assert lightning_path(root / "last.ckpt") == find_last_checkpoint(root)
    assert lightning_path(root / f"{newest.name}.ckpt") == newest
    with pytest.raises(FileNotFoundError, match="no complete checkpoint in"):
        lightning_path(tmp_path / "empty" / "last.ckpt")


def test_lightnings_positional_order_and_verbose(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    checkpoint = ModelCheckpoint(tmp_path / "ckpts", "{epoch}", "val_loss", True)  # dirpath, filename, monitor, verbose
    assert (checkpoint.dirpath, checkpoint.filename, checkpoint.monitor, checkpoint.verbose) == (tmp_path / "ckpts", "{epoch}", "val_loss", True)
    fit(tmp_path, [checkpoint], max_epochs=2)
    out = capsys.readouterr().out
    assert "Epoch 0, global step" in out and "'val_loss' = " in out and str(tmp_path / "ckpts" / "epoch=0") in out


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [({"train_time_interval": 60}, TypeError, r"train_time_interval=60\) must be a datetime.timedelta"),
     ({"train_time_interval": timedelta(seconds=1), "every_n_train_steps": 2}, ValueError, "mutually exclusive"),
     ({"train_time_interval": timedelta(seconds=-1)}, ValueError, "must not be negative"),
     ({"save_weights_only": "yes"}, TypeError, r"save_weights_only='yes'\) must be True or False"),
     ({"save_on_exception": 1}, TypeError, r"save_on_exception=1\) must be True or False"),
     ({"enable_version_counter": None}, TypeError, r"enable_version_counter=None\) must be True or False")],
)
def test_lightning_2_6_arguments_are_checked(kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        ModelCheckpoint(**kwargs)


def test_save_on_exception_takes_lightnings_position() -> None:
    # Lightning 2.6: dirpath, filename, monitor, verbose, save_last, save_top_k, save_on_exception, save_weights_only, mode
    cb = ModelCheckpoint(None, None, "val_loss", False, True, 2, True, True, "max")
    assert (cb.save_top_k, cb.save_on_exception, cb.save_weights_only, cb.mode) == (2, True, True, "max")
    assert ModelCheckpoint(train_time_interval=timedelta(minutes=5)).every_n_epochs == 0  # as Lightning's triggers


def test_tqdm_progress_bar_takes_lightnings_arguments(tmp_path: Path) -> None:
    import io

    from callbacks import TQDMProgressBar
    from callbacks.progress import ProgressBar

    bar = TQDMProgressBar(refresh_rate=5, process_position=1, leave=True)
    assert isinstance(bar, ProgressBar) and (bar.refresh_rate, bar.position, bar.leave) == (5, 1, True)
    bar.file = io.StringIO()
    trainer = fit(tmp_path, [bar], max_epochs=1)
    assert sum(isinstance(cb, ProgressBar) for cb in trainer.callbacks) == 1  # it replaces the default bar
    assert "Epoch 0" in bar.file.getvalue()
    with pytest.raises(ValueError, match="process_position=-1"):
        TQDMProgressBar(process_position=-1)


def test_format_checkpoint_name_takes_lightnings_ver_and_prefix() -> None:
    cb = ModelCheckpoint(filename="{epoch}")
    assert cb.format_checkpoint_name({"epoch": 2}, ver=3) == "epoch=2-v3"
    assert cb.format_checkpoint_name({"epoch": 2}, prefix="exc") == "exc-epoch=2"
    assert cb.format_checkpoint_name({"epoch": 2}, "last", 1) == "last-v1"
