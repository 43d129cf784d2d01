"""Checkpoints are safe to load and crash-safe: tampering is refused without executing anything, and
``ckpt_path="last"`` only ever picks a complete checkpoint."""

from __future__ import annotations

import builtins
import json
import pickle
import shutil
from pathlib import Path

import pytest
import xxhash

from tests.unit.test_checkpoint_resume import ResumeNet, assert_same_weights, run_fit
from trainer.fit.checkpointing import find_last_checkpoint, is_complete_checkpoint, verify_checkpoint


class Payload:
    """Unpickling this creates `marker`: what a malicious checkpoint file would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (builtins.open, (str(self.marker), "w"))


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    run_fit(tmp_path, 3, every_n_train_steps=3)
    return tmp_path / "ckpts" / "epoch=0-step=3"


def plant_payload(ckpt: Path, name: str, marker: Path) -> None:
    (ckpt / name).write_bytes(pickle.dumps(Payload(marker)))


def rewrite_manifest(ckpt: Path) -> None:
    """What an attacker who knows the format would do: make the manifest match the planted file."""
    manifest = json.loads((ckpt / "manifest.json").read_text())
    for name, entry in manifest["files"].items():
        data = (ckpt / name).read_bytes()
        entry.update(size=len(data), digest=xxhash.xxh3_128(data).hexdigest())
    (ckpt / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", ["optimizer.bin", "scheduler.bin"])
def test_tampered_file_is_refused_by_the_manifest(tmp_path: Path, saved: Path, name: str) -> None:
    marker = tmp_path / "pwned"
    plant_payload(saved, name, marker)
    with pytest.raises(ValueError, match=f"{name} was modified"):
        run_fit(tmp_path, 5, ckpt_path=str(saved))
    with pytest.raises(ValueError, match="tampered"):
        ResumeNet.load_from_checkpoint(saved)
    assert not marker.exists()


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_tampered_file_with_matching_manifest_is_still_not_unpickled(tmp_path: Path, saved: Path) -> None:
    marker = tmp_path / "pwned"
    plant_payload(saved, "optimizer.bin", marker)
    rewrite_manifest(saved)
    verify_checkpoint(saved)  # the manifest no longer helps ...
    with pytest.raises(ValueError, match=r"optimizer.bin"):  # ... but weights_only loading refuses the pickle
        run_fit(tmp_path, 5, ckpt_path=str(saved))
    assert not marker.exists()


def test_added_removed_and_corrupted_files_are_refused(saved: Path) -> None:
    (saved / "extra.pkl").write_bytes(b"x")
    with pytest.raises(ValueError, match=r"extra.pkl was added"):
        verify_checkpoint(saved)
    (saved / "extra.pkl").unlink()
    weights = saved / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"model.safetensors was modified"):
        verify_checkpoint(saved)
    weights.unlink()
    with pytest.raises(ValueError, match=r"model.safetensors is missing"):
        verify_checkpoint(saved)
    assert not is_complete_checkpoint(saved)


def test_last_ignores_incomplete_and_hidden_directories(tmp_path: Path, saved: Path) -> None:
    root = saved.parent
    assert not (root / "last.json").exists()  # written by ModelCheckpoint(save_last=...) only
    newer = root / "epoch=9-step=99"  # a directory without manifest: an interrupted copy
    shutil.copytree(saved, newer)
    (newer / "manifest.json").unlink()
    partial = root / ".epoch=9-step=100.partial"  # an interrupted save
    shutil.copytree(saved, partial)
    assert find_last_checkpoint(root) == saved
    (root / "last.json").write_text(json.dumps({"format": "trainwright-checkpoint", "last": "../elsewhere"}))
    assert find_last_checkpoint(root) == saved  # a pointer outside the directory is not followed
    (root / "last.json").write_text(json.dumps({"format": "trainwright-checkpoint", "last": newer.name}))
    assert find_last_checkpoint(root) == saved  # nor one to an incomplete checkpoint
    stale = root / ".epoch=0-step=4.partial"  # left by a crash while saving the step-4 checkpoint earlier
    stale.mkdir()
    (stale / "junk.bin").write_bytes(b"x")
    _module, trainer, _ = run_fit(tmp_path, 4, ckpt_path="last", every_n_train_steps=4)
    assert trainer.global_step == 4
    assert not stale.exists() and verify_checkpoint(root / "epoch=0-step=4")["global_step"] == 4
    assert find_last_checkpoint(root) == root / "epoch=0-step=4"


def test_resuming_from_an_older_checkpoint_after_a_crash_is_still_exact(tmp_path: Path) -> None:
    straight, _, _ = run_fit(tmp_path / "straight", 8)
    run_fit(tmp_path, 6, every_n_train_steps=3)
    root = tmp_path / "ckpts"
    newest = root / "epoch=1-step=6"
    (newest / "manifest.json").unlink()  # as if the process died while writing the step-6 checkpoint
    assert find_last_checkpoint(root) == root / "epoch=0-step=3"
    resumed, _trainer, _ = run_fit(tmp_path, 8, ckpt_path="last", every_n_train_steps=3, init_seed=5)
    assert_same_weights(straight, resumed)


def test_saving_over_an_existing_checkpoint_replaces_it_atomically(tmp_path: Path, saved: Path) -> None:
    _module, trainer, _ = run_fit(tmp_path / "other", 2)
    target = trainer.save_checkpoint(saved)
    assert target == saved and verify_checkpoint(saved)["global_step"] == 2
    assert sorted(p.name for p in saved.parent.iterdir() if p.name.startswith(".")) == []


def test_another_global_batch_is_refused_before_anything_loads(tmp_path: Path, saved: Path) -> None:
    """The loaders' positions are samples of the epoch's order: a run taking another number of samples a step could not
    continue on the samples the interrupted one would have seen, so it is refused with the batch size that fits."""
    import torch
    from torch.utils.data import DataLoader

    from tests.unit.test_checkpoint_resume import BATCH_SIZE, make_loader
    from trainer.fit.trainer import Trainer

    torch.manual_seed(5)
    module = ResumeNet()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    loader = DataLoader(make_loader().dataset, batch_size=BATCH_SIZE + 1, shuffle=True)
    trainer = Trainer(max_steps=5, log_with=None, enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=False, project_dir=str(tmp_path / "other"))
    with pytest.raises(ValueError, match=rf"took {BATCH_SIZE} samples a step over 1 processes, this one takes {BATCH_SIZE + 1} "
                                         rf"over 1; .* batch_size={BATCH_SIZE} "):
        trainer.fit(module, loader, ckpt_path=str(saved))
    assert all(torch.equal(module.state_dict()[k], before[k]) for k in before)


def test_unreadable_manifest_is_refused(saved: Path) -> None:
    (saved / "manifest.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"unreadable manifest.json"):
        verify_checkpoint(saved)
    (saved / "manifest.json").write_text(json.dumps({"format": "other", "files": {}}))
    with pytest.raises(ValueError, match="not a trainwright-checkpoint manifest"):
        verify_checkpoint(saved)
