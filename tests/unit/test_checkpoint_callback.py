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
    assert ModelCheckpoint._runs_last is True
