"""Lightning's checkpoint options and files: save_weights_only, train_time_interval, enable_version_counter=False,
save_on_exception, the ``last.ckpt`` link, and converting a Lightning ``.ckpt`` file (the fixture was written by
Lightning 2.6.6: tests/helpers/lightning_checkpoint_fixture.py)."""

from __future__ import annotations

import json
import os
import sys
import types
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch

from callbacks.checkpoint import ModelCheckpoint
from strategies import checkpoint_store as store
from strategies.checkpoint_io import read_manifest
from strategies.lightning_checkpoint import convert_lightning_checkpoint
from tests.unit.test_checkpoint_callback import ScriptedNet, fit, saved_names
from trainer import Trainer
from trainer.fit.agreement import LoopAgreement

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_weights_only_checkpoints_load_but_never_resume(tmp_path: Path) -> None:
    cb = ModelCheckpoint(dirpath=tmp_path / "w", save_weights_only=True, save_top_k=-1, save_last=True)
    trainer = fit(tmp_path, [cb], max_epochs=2)
    path = Path(cb.last_model_path)
    assert sorted(p.name for p in path.iterdir()) == ["hparams.json", "manifest.json", "model.safetensors"]
    assert read_manifest(path)["kind"] == store.WEIGHTS_ONLY and read_manifest(path)["global_step"] == 4
    module = ScriptedNet.load_from_checkpoint(tmp_path / "w" / "last.ckpt")
    assert torch.equal(module.layer.weight, trainer.lightning_module.layer.weight)
    with pytest.raises(ValueError, match="holds the model weights only"):
        fit(tmp_path / "again", [ModelCheckpoint(dirpath=tmp_path / "w2")], ckpt_path=str(path))
    with pytest.raises(ValueError, match="holds the model weights only"):  # "last" finds only weights-only ones: said, not ignored
        fit(tmp_path, [ModelCheckpoint(dirpath=tmp_path / "w", save_weights_only=True)], ckpt_path="last")
    assert trainer.validate(ScriptedNet(), _batches(), ckpt_path=str(path), verbose=False)  # evaluation loads the weights


def _batches() -> Any:
    from tests.unit.test_checkpoint_callback import tiny_loader

    return tiny_loader()


def test_last_skips_weights_only_for_the_newest_full_checkpoint(tmp_path: Path) -> None:
    full = ModelCheckpoint(dirpath=tmp_path / "f", filename="full-{epoch}", every_n_epochs=2, save_top_k=-1)
    weights = ModelCheckpoint(dirpath=tmp_path / "w", filename="w-{epoch}", save_weights_only=True, save_top_k=-1)
    fit(tmp_path, [full, weights], max_epochs=3)
    folders = [tmp_path / "f", tmp_path / "w"]
    assert store.newest_of(folders).name == "w-epoch=2"
    assert store.newest_of(folders, resumable=True).name == "full-epoch=1"
    resumed = fit(tmp_path, [ModelCheckpoint(dirpath=tmp_path / "f"), ModelCheckpoint(dirpath=tmp_path / "w", save_weights_only=True)],
                  max_epochs=4, ckpt_path="last")
    assert resumed.global_step == 8  # resumed at step 4 (full-epoch=1), not refused for the newer weights-only one


def test_enable_version_counter_false_replaces_the_same_name(tmp_path: Path) -> None:
    cb = ModelCheckpoint(dirpath=tmp_path / "c", filename="model", save_top_k=-1, enable_version_counter=False,
                         auto_insert_metric_name=False)
    fit(tmp_path, [cb], max_epochs=3)
    assert saved_names(tmp_path / "c") == ["model"] and read_manifest(tmp_path / "c" / "model")["global_step"] == 6
    counted = ModelCheckpoint(dirpath=tmp_path / "d", filename="model", save_top_k=-1)
    fit(tmp_path / "x", [counted], max_epochs=3)
    assert saved_names(tmp_path / "d") == ["model", "model-v1", "model-v2"]  # the default: Lightning's version counter


def test_a_replacement_cut_between_its_renames_leaves_the_old_checkpoint_findable(tmp_path: Path) -> None:
    fit(tmp_path, [ModelCheckpoint(dirpath=tmp_path / "c", filename="model", enable_version_counter=False,
                                   auto_insert_metric_name=False)], max_epochs=1)
    folder = tmp_path / "c"
    os.replace(folder / "model", folder / ".model.old")  # the first rename of the replacement happened, the second not
    assert store.newest_in(folder) == folder / ".model.old"
    assert Trainer  # the resume path uses the same store function


def test_train_time_interval_saves_when_the_time_ran_out(tmp_path: Path) -> None:
    every_batch = ModelCheckpoint(dirpath=tmp_path / "a", train_time_interval=timedelta(0), save_top_k=-1)
    fit(tmp_path, [every_batch], max_epochs=2)
    assert saved_names(tmp_path / "a") == ["epoch=0-step=1", "epoch=0-step=2", "epoch=1-step=3", "epoch=1-step=4"]
    never = ModelCheckpoint(dirpath=tmp_path / "b", train_time_interval=timedelta(hours=1), save_top_k=-1)
    fit(tmp_path / "x", [never], max_epochs=2)
    assert not (tmp_path / "b").exists() or saved_names(tmp_path / "b") == []  # no epoch saves either (as Lightning)


def test_agreement_requests_are_taken_once_on_every_process_after_the_agreement() -> None:
    seen: list[list[float]] = []

    def reduce(t: torch.Tensor, op: str) -> torch.Tensor:  # the other process asked for nothing: max is this one's flags
        seen.append(t.tolist())
        return t

    agreement = LoopAgreement(world_size=2, interval=1, reduce=reduce, device=torch.device("cpu"))
    agreement.register("save")
    agreement.request("save")
    assert not agreement.take("save")  # not before the processes agreed
    view = types.SimpleNamespace(should_stop=False)
    agreement.agree(view)
    assert seen[-1][3:] == [1.0]  # the request travels in the agreement's one all-reduce
    agreement.request("save")  # asked again before it was taken: the same decision, not a second one
    assert agreement.take("save") and not agreement.take("save")
    agreement.agree(view)
    assert seen[-1][3:] == [0.0] and not agreement.take("save")
    with pytest.raises(KeyError, match="register"):
        agreement.request("unknown")


class FailsAtStep3(ScriptedNet):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.trainer.global_step == 3:
            raise RuntimeError("boom")
        return super().training_step(batch, batch_idx)


def test_save_on_exception_saves_the_state_fit_stopped_in(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cb = ModelCheckpoint(dirpath=tmp_path / "c", save_on_exception=True, save_last=True, every_n_epochs=10)
    with pytest.raises(RuntimeError, match="boom"):
        fit(tmp_path, [cb], module=FailsAtStep3())
    assert saved_names(tmp_path / "c") == ["epoch=1-step=3", "last-epoch=1-step=3"]
    assert os.readlink(tmp_path / "c" / "last.ckpt") == "last-epoch=1-step=3"
    assert "RuntimeError was raised" in capsys.readouterr().out
    resumed = fit(tmp_path, [ModelCheckpoint(dirpath=tmp_path / "c")], max_epochs=2, ckpt_path=str(tmp_path / "c" / "last.ckpt"))
    assert resumed.global_step == 4
    off = ModelCheckpoint(dirpath=tmp_path / "off", every_n_epochs=10)
    with pytest.raises(RuntimeError, match="boom"):
        fit(tmp_path / "y", [off], module=FailsAtStep3())
    assert not (tmp_path / "off").exists()


def test_last_ckpt_is_a_path_every_loader_accepts(tmp_path: Path) -> None:
    cb = ModelCheckpoint(dirpath=tmp_path / "c", save_last=True)
    first = fit(tmp_path, [cb], max_epochs=2)
    link = tmp_path / "c" / "last.ckpt"
    assert link.is_symlink() and (link / "manifest.json").is_file()
    assert torch.equal(ScriptedNet.load_from_checkpoint(link).layer.weight, first.lightning_module.layer.weight)
    resumed = fit(tmp_path, [ModelCheckpoint(dirpath=tmp_path / "c", save_last=True)], max_epochs=3, ckpt_path=str(link))
    assert resumed.global_step == 6 and os.readlink(link) == "last-epoch=2-step=6"
    from trainer import Accelerator

    accelerator = Accelerator(cpu=True)
    model = accelerator.prepare(torch.nn.Linear(2, 1))
    with pytest.raises(ValueError, match=r"last.ckpt' holds 1 optimizers but 0 were prepared"):  # opened through the link
        accelerator.load_state(str(link))
    assert model is not None


def test_a_users_own_last_ckpt_is_left_alone_with_a_warning(tmp_path: Path) -> None:
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "last.ckpt").write_text("mine")
    with pytest.warns(UserWarning, match="is not a link this store made"):
        fit(tmp_path, [ModelCheckpoint(dirpath=tmp_path / "c", save_last=True)], max_epochs=1)
    assert (tmp_path / "c" / "last.ckpt").read_text() == "mine"


# ------------------------------------------------------------------------------------- Lightning .ckpt files
def test_convert_a_lightning_checkpoint(tmp_path: Path) -> None:
    done = convert_lightning_checkpoint(FIXTURES / "lightning_tiny.ckpt", tmp_path / "conv")
    assert (done["epoch"], done["global_step"], done["optimizers"], done["schedulers"]) == (2, 8, 1, 1)
    assert done["left_out"] == ["callbacks"] and not done["weights_only"]
    raw = torch.load(FIXTURES / "lightning_tiny.ckpt", weights_only=True)
    from safetensors.torch import load_file

    weights = load_file(str(tmp_path / "conv" / "model.safetensors"))
    assert all(torch.equal(weights[k], v) for k, v in raw["state_dict"].items()) and set(weights) == set(raw["state_dict"])
    assert json.loads((tmp_path / "conv" / "hparams.json").read_text()) == {"lr": 0.05, "hidden": 3}
    optimizer = torch.load(tmp_path / "conv" / "optimizer.bin", weights_only=True)
    assert torch.equal(optimizer["state"][0]["momentum_buffer"], raw["optimizer_states"][0]["state"][0]["momentum_buffer"])


def test_lightning_files_get_an_error_that_says_what_to_run(tmp_path: Path) -> None:
    ckpt = FIXTURES / "lightning_tiny.ckpt"
    with pytest.raises(ValueError, match="trainer convert-checkpoint"):
        ScriptedNet.load_from_checkpoint(ckpt)
    with pytest.raises(ValueError, match="trainer convert-checkpoint"):
        fit(tmp_path, [], ckpt_path=str(ckpt))


def _fake_lightning_global(tmp_path: Path) -> Path:
    module = types.ModuleType("lightning.fabric.utilities.data")

    class AttributeDict(dict):  # type: ignore[type-arg]
        pass

    AttributeDict.__module__ = module.__name__
    AttributeDict.__qualname__ = "AttributeDict"
    module.AttributeDict = AttributeDict  # type: ignore[attr-defined]
    added = [name for name in ("lightning", "lightning.fabric", "lightning.fabric.utilities") if name not in sys.modules]
    for name in added:
        sys.modules[name] = types.ModuleType(name)
    sys.modules[module.__name__] = module
    try:
        raw = torch.load(FIXTURES / "lightning_tiny.ckpt", weights_only=True)
        raw["hyper_parameters"] = AttributeDict(lr=0.05, hidden=3, root=Path("/data"))
        path = tmp_path / "attr.ckpt"
        torch.save(raw, path)
    finally:
        for name in [module.__name__, *added]:
            del sys.modules[name]
    return path


def test_allowed_globals_are_rebuilt_as_plain_data_and_others_refused_by_name(tmp_path: Path) -> None:
    done = convert_lightning_checkpoint(_fake_lightning_global(tmp_path), tmp_path / "conv")
    assert json.loads((Path(done["path"]) / "hparams.json").read_text()) == {"lr": 0.05, "hidden": 3, "root": "/data"}
    from fractions import Fraction

    raw = torch.load(FIXTURES / "lightning_tiny.ckpt", weights_only=True)
    raw["hyper_parameters"] = {"ratio": Fraction(1, 3)}
    torch.save(raw, tmp_path / "bad.ckpt")
    with pytest.raises(ValueError, match=r"holds fractions.Fraction, which the converter does not unpickle"):
        convert_lightning_checkpoint(tmp_path / "bad.ckpt", tmp_path / "never")
    assert not (tmp_path / "never").exists()


def test_a_weights_only_lightning_file_converts_to_a_weights_only_checkpoint(tmp_path: Path) -> None:
    raw = torch.load(FIXTURES / "lightning_tiny.ckpt", weights_only=True)
    for key in ("optimizer_states", "lr_schedulers", "callbacks"):
        raw.pop(key)
    torch.save(raw, tmp_path / "w.ckpt")
    done = convert_lightning_checkpoint(tmp_path / "w.ckpt", tmp_path / "w")
    assert done["weights_only"] and read_manifest(tmp_path / "w")["kind"] == store.WEIGHTS_ONLY


def test_the_convert_checkpoint_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from trainer.cli import main

    assert main(["convert-checkpoint", str(FIXTURES / "lightning_tiny.ckpt"), str(tmp_path / "conv")]) == 0
    assert "resumes at epoch 2, global step 8" in capsys.readouterr().out
    assert main(["convert-checkpoint", str(tmp_path / "missing.ckpt"), str(tmp_path / "x")]) == 2
    assert "is not a file" in capsys.readouterr().err


def test_a_mid_epoch_lightning_file_resumes_after_the_batches_it_had_run(tmp_path: Path) -> None:
    # Lightning saved it in on_train_batch_end of step 6 (2 of 4 batches of epoch 1 processed, 1 completed)
    done = convert_lightning_checkpoint(FIXTURES / "lightning_tiny_mid.ckpt", tmp_path / "mid")
    assert (done["epoch"], done["global_step"]) == (1, 6)
    state = json.loads((tmp_path / "mid" / "extra_state.json").read_text())["loops"]["fit_loop"]
    assert state == {"epoch": 1, "global_step": 6, "batches_that_stepped": 5, "batches_done_in_epoch": 2, "stepping_batch_open": True}
    from trainer.fit.progress import LoopProgress

    progress = LoopProgress()
    progress.load_state_dict(state)
    assert (progress.batches_that_stepped, progress.batches_done_in_epoch) == (6, 2)  # the open batch counts once restored


def test_the_destination_is_never_a_directory_that_is_not_a_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(ValueError, match="exists and is not a checkpoint directory"):
        convert_lightning_checkpoint(FIXTURES / "lightning_tiny.ckpt", tmp_path / "mine")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"
    with pytest.raises(ValueError, match=r"name it without \.ckpt"):
        convert_lightning_checkpoint(FIXTURES / "lightning_tiny.ckpt", tmp_path / "out.ckpt")
    convert_lightning_checkpoint(FIXTURES / "lightning_tiny.ckpt", tmp_path / "conv")
    convert_lightning_checkpoint(FIXTURES / "lightning_tiny_mid.ckpt", tmp_path / "conv")  # an earlier checkpoint is replaced
    assert read_manifest(tmp_path / "conv")["global_step"] == 6
