"""Asynchronous saves in one process: a consistent snapshot, committed only when written, errors raised on the next
call, pruning and ``last.json`` only after the commit, and the Trainer's ``AsyncCheckpointIO`` resuming bit-exactly.

The kill -9 cases (a process dying in the middle of the background write, 1 and 2 processes, DDP and FSDP, both
faces) are in tests/distributed/test_async_checkpoint_kill.py.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from callbacks.checkpoint import ModelCheckpoint
from strategies.checkpoint_store import CheckpointSaveError, PendingSave, newest_in
from tests.unit.test_checkpoint_resume import TOTAL_STEPS, assert_same_weights, run_fit
from trainer import Accelerator, ProjectConfiguration, Trainer
from trainer.fit.plugins import AsyncCheckpointIO


def _prepared(accelerator: Accelerator) -> tuple[nn.Module, Any]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    return accelerator.prepare(model, optimizer)


def _train(accelerator: Accelerator, model: nn.Module, optimizer: Any, steps: int) -> None:
    for _ in range(steps):
        accelerator.backward(model(torch.randn(8, 32)).square().mean())
        optimizer.step()
        optimizer.zero_grad()


class Breakable:
    """Registered for checkpointing; while `broken`, its state cannot be pickled (a local function), so the background
    write fails there."""

    def __init__(self, broken: bool = False) -> None:
        self.broken = broken

    def state_dict(self) -> dict[str, Any]:
        return {"fn": lambda: None} if self.broken else {"fn": None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def test_async_save_writes_the_state_as_it_was_when_called(tmp_path: Path) -> None:
    accelerator = Accelerator(cpu=True)
    model, optimizer = _prepared(accelerator)
    _train(accelerator, model, optimizer, 2)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    moments = {k: v.clone() for k, v in optimizer.state_dict()["state"][0].items()}
    pending = accelerator.save_state(tmp_path / "a", async_save=True)
    assert isinstance(pending, PendingSave)
    _train(accelerator, model, optimizer, 3)  # changes the weights while (or after) the copy is written
    assert pending.result() == str(tmp_path / "a") and pending.done()
    accelerator.load_state(tmp_path / "a")
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    assert all(torch.equal(moments[k], v) for k, v in optimizer.state_dict()["state"][0].items())


def test_a_failed_background_write_commits_nothing_and_is_raised_by_the_next_call(tmp_path: Path) -> None:
    config = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True)
    accelerator = Accelerator(cpu=True, project_config=config)
    _prepared(accelerator)
    part = Breakable()
    accelerator.register_for_checkpointing(part)
    accelerator.save_state()  # checkpoint_0, synchronous
    part.broken = True
    accelerator.save_state(async_save=True)  # checkpoint_1: fails in the background
    folder = tmp_path / "checkpoints"
    with pytest.raises(CheckpointSaveError, match=r"checkpoint_1.*not committed.*process 0"):
        accelerator.save_state(async_save=True)  # the next call waits for it and reports it
    assert not (folder / "checkpoint_1").exists() and (folder / ".checkpoint_1.partial").is_dir()
    assert newest_in(folder) == folder / "checkpoint_0"
    part.broken = False
    accelerator.project_configuration.iteration = 1
    accelerator.save_state(async_save=True).result()
    assert (folder / "checkpoint_1").is_dir() and not (folder / ".checkpoint_1.partial").exists()  # staging cleaned


def test_the_error_is_raised_once_whoever_asks_first(tmp_path: Path) -> None:
    accelerator = Accelerator(cpu=True)
    _prepared(accelerator)
    accelerator.register_for_checkpointing(Breakable(broken=True))
    pending = accelerator.save_state(tmp_path / "a", async_save=True)
    with pytest.raises(CheckpointSaveError, match="pickle"):
        pending.result()
    accelerator.end_training()  # already reported through the handle: not raised again


def test_total_limit_prunes_only_after_the_new_checkpoint_is_committed(tmp_path: Path) -> None:
    config = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True, total_limit=2)
    accelerator = Accelerator(cpu=True, project_config=config)
    model, optimizer = _prepared(accelerator)
    for _ in range(4):
        _train(accelerator, model, optimizer, 1)
        accelerator.save_state(async_save=True)
    accelerator.end_training()
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["checkpoint_2", "checkpoint_3"]


def test_trainer_async_checkpoints_resume_bit_exactly(tmp_path: Path) -> None:
    straight, _, _ = run_fit(tmp_path / "straight", TOTAL_STEPS)
    run_fit(tmp_path / "run", 8, every_n_train_steps=4, plugins=[AsyncCheckpointIO()])
    folder = tmp_path / "run" / "ckpts"
    assert newest_in(folder) is not None and newest_in(folder).name.endswith("step=8")
    resumed, _, _ = run_fit(tmp_path / "run", TOTAL_STEPS, ckpt_path="last", every_n_train_steps=4, init_seed=99, plugins=[AsyncCheckpointIO()])
    assert_same_weights(straight, resumed)


def test_model_checkpoint_async_save_writes_last_json_after_the_commit(tmp_path: Path) -> None:
    callback = ModelCheckpoint(dirpath=tmp_path / "ckpts", every_n_train_steps=2, save_top_k=1, save_last=True, async_save=True)
    run_fit(tmp_path, 6, extra_callbacks=(callback,))
    names = sorted(p.name for p in (tmp_path / "ckpts").iterdir())
    assert names == ["epoch=1-step=6", "last-epoch=1-step=6", "last.ckpt", "last.json"], names  # older ones removed once superseded
    assert os.readlink(tmp_path / "ckpts" / "last.ckpt") == "last-epoch=1-step=6"  # the link follows last.json
    assert newest_in(tmp_path / "ckpts") == tmp_path / "ckpts" / "last-epoch=1-step=6"


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (lambda: Trainer(plugins=["async"]), ValueError, "plugins are given as objects"),
        (lambda: Trainer(plugins=[object()]), ValueError, "AsyncCheckpointIO"),
        (lambda: AsyncCheckpointIO(checkpoint_io=object()), NotImplementedError, "no CheckpointIO to wrap"),
        (lambda: ModelCheckpoint(async_save=1), TypeError, "async_save=1"),
        (lambda: Accelerator(cpu=True).save_state("x", async_save="yes"), TypeError, "async_save='yes'"),
    ],
)
def test_bad_async_arguments_are_refused(make: Any, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        make()


# ------------------------------------------------------------------------------- the checkpoint writer process
def test_the_writer_process_writes_the_bytes_a_synchronous_save_writes(tmp_path: Path) -> None:
    """The background write goes through the writer process (another process, mapping the staging's anonymous shared
    memory), and its files are byte for byte those of a synchronous save of the same state: each tensor once, not
    the shared memory around it."""
    import json
    import signal
    import time

    from strategies.checkpoint_process import running_writer, writer_mode

    if writer_mode() != "process":
        pytest.skip("asynchronous saves write in a thread of the training process on this platform")
    accelerator = Accelerator(cpu=True)
    model, optimizer = _prepared(accelerator)
    _train(accelerator, model, optimizer, 2)
    accelerator.save_state(tmp_path / "sync")
    accelerator.save_state(tmp_path / "async", async_save=True).result()
    files = [json.loads((tmp_path / name / "manifest.json").read_text())["files"] for name in ("sync", "async")]
    assert files[0] == files[1]
    writer = running_writer()
    assert writer is not None and writer.pid not in (0, os.getpid())
    assert os.getpriority(os.PRIO_PROCESS, writer.pid) == min(19, os.getpriority(os.PRIO_PROCESS, 0) + 19)  # it yields the cores
    maps = Path(f"/proc/{writer.pid}/maps").read_text()
    assert "memfd:trainwright-staging" in maps and "libtorch" not in maps  # the staging, mapped; no torch there
    os.kill(writer.pid, signal.SIGKILL)  # a writer that died between saves is replaced by the next save
    deadline = time.monotonic() + 30
    while writer.alive and time.monotonic() < deadline:
        time.sleep(0.05)
    _train(accelerator, model, optimizer, 1)
    assert accelerator.save_state(tmp_path / "again", async_save=True).result() == str(tmp_path / "again")
    assert running_writer() not in (None, writer)
    accelerator.end_training()


def test_the_writer_can_be_a_thread_and_a_wrong_choice_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAINWRIGHT_CHECKPOINT_WRITER", "fork")
    with pytest.raises(ValueError, match=r"TRAINWRIGHT_CHECKPOINT_WRITER='fork' is not a checkpoint writer; choose one of 'process', 'thread'"):
        Accelerator(cpu=True)
    monkeypatch.setenv("TRAINWRIGHT_CHECKPOINT_WRITER", "process")
    monkeypatch.setenv("TRAINWRIGHT_CHECKPOINT_WRITER_NICE", "-5")
    with pytest.raises(ValueError, match=r"TRAINWRIGHT_CHECKPOINT_WRITER_NICE='-5' is not a niceness; set a whole number from 0"):
        Accelerator(cpu=True)
    monkeypatch.delenv("TRAINWRIGHT_CHECKPOINT_WRITER_NICE")
    monkeypatch.setenv("TRAINWRIGHT_CHECKPOINT_WRITER", "thread")
    accelerator = Accelerator(cpu=True)
    model, optimizer = _prepared(accelerator)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    pending = accelerator.save_state(tmp_path / "a", async_save=True)
    _train(accelerator, model, optimizer, 2)
    pending.result()
    accelerator.load_state(tmp_path / "a")
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    accelerator.end_training()


def test_shared_staging_reuses_its_buffers_and_returns_what_a_changing_layout_leaves() -> None:
    from strategies.checkpoint_staging import Staging, shared_memory_available

    if not shared_memory_available():
        pytest.skip("no memfd_create on this platform")
    staging = Staging(shared=True)
    state = {"w": torch.randn(1000), "step": torch.tensor(3)}
    first = staging.copy("s", state)
    staging.finish()
    staging.begin()
    again = staging.copy("s", state)
    staging.finish()
    assert again["w"].data_ptr() == first["w"].data_ptr() and torch.equal(again["w"], state["w"])
    assert first["w"].untyped_storage().nbytes() == 4000  # a storage of its own (torch.save writes whole storages)
    for n in range(10):  # a tensor that grows every save: the old buffers' room is given back
        staging.begin()
        staging.copy("s", {"w": torch.zeros((n + 1) << 20)})
        staging.finish()
    reserved = sum(segment.nbytes for segment in staging.segments.values())
    assert reserved <= 2 * staging.nbytes() + (64 << 20), (reserved, staging.nbytes())
    staging.close()
    assert staging.segments == {} and staging.released
