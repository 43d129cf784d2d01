"""Streaming data in the Trainer face: a `DataLoader` over an `IterableDataset` without ``__len__``.

An epoch ends when the stream does (``num_training_batches`` is ``inf``, as in Lightning); ``max_steps``, int limits
and int ``val_check_interval`` work; fractions of an unknown epoch are refused with Lightning's rule; evaluation,
the progress bar and an exact mid-epoch resume (the stream is replayed up to the checkpointed batch) work too.
"""

from __future__ import annotations

import io
import math
import re
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset

from callbacks.base import Callback
from callbacks.checkpoint import ModelCheckpoint
from callbacks.progress import ProgressBar
from trainer import Trainer, TrainModule

BATCH_SIZE = 4


def _data(size: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(size, 4, generator=g)
    return x, x.sum(1, keepdim=True) + 0.1 * torch.randn(size, 1, generator=g)


class Stream(IterableDataset):
    """``(index, x, y)`` for samples ``0..size-1``, in an order drawn from the epoch (``set_epoch``); no ``__len__``."""

    def __init__(self, size: int = 22, *, shuffle: bool = True) -> None:
        self.x, self.y = _data(size)
        self.size, self.shuffle, self.epoch = size, shuffle, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Any:
        order = torch.randperm(self.size, generator=torch.Generator().manual_seed(100 + self.epoch)) if self.shuffle else torch.arange(self.size)
        for i in order.tolist():
            yield i, self.x[i], self.y[i]


class Indexed(Dataset):
    """The same samples as a sized, map-style data set (read in order)."""

    def __init__(self, size: int = 22) -> None:
        self.x, self.y = _data(size)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> Any:
        return i, self.x[i], self.y[i]


def stream_loader(size: int = 22, *, shuffle: bool = True) -> DataLoader:
    return DataLoader(Stream(size, shuffle=shuffle), batch_size=BATCH_SIZE)


class StreamNet(TrainModule):
    """A small regression net with dropout and a per-step LR schedule; records what it saw, when it validated."""

    def __init__(self, dropout: float = 0.3) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(dropout), nn.Linear(16, 1))
        self.seen: dict[int, list[int]] = {}  # epoch -> sample indices, in training order
        self.losses: dict[str, float] = {}
        self.validations: list[tuple[int, int]] = []  # (epoch, training batches done) at each validation
        self.epoch_ends: list[int] = []
        self.estimated: Any = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        idx, x, y = batch
        epoch = self.trainer.current_epoch
        self.seen.setdefault(epoch, []).extend(idx.tolist())
        loss = F.mse_loss(self(x), y)
        self.losses[f"{epoch}/{batch_idx}"] = loss.item()
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        _, x, y = batch
        self.log("val_loss", F.mse_loss(self(x), y))
        self.log("val_count", float(len(x)), reduce_fx="sum", sync_dist=True)

    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.log("test_count", float(len(batch[0])), reduce_fx="sum")

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return batch[0]

    def on_validation_start(self) -> None:
        if not self.trainer.sanity_checking:
            self.validations.append((self.trainer.current_epoch, self.trainer.fit_progress.batches_done_in_epoch))

    def on_train_epoch_end(self) -> None:
        self.epoch_ends.append(self.trainer.current_epoch)

    def configure_optimizers(self) -> Any:
        self.estimated = self.trainer.estimated_stepping_batches
        opt = torch.optim.AdamW(self.parameters(), lr=0.05)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.8)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def _trainer(root: Path, **kwargs: Any) -> Trainer:
    settings: dict[str, Any] = dict(
        log_with=None, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
        project_dir=str(root), seed=1234, num_sanity_val_steps=0,
    )
    settings.update(kwargs)
    return Trainer(**settings)


def _batches_per_epoch(module: StreamNet) -> dict[int, int]:
    return {epoch: len([k for k in module.losses if k.startswith(f"{epoch}/")]) for epoch in module.seen}


# ---------------------------------------------------------------------------------------------- training
def test_max_steps_on_a_stream(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, max_steps=8)
    module = StreamNet()
    trainer.fit(module, stream_loader(22))  # 6 batches per epoch, the last one of 2 samples
    assert trainer.num_training_batches == float("inf")
    assert module.estimated == 8  # max_steps, as Lightning's estimate for a loader without a length
    # current_epoch counts the epoch max_steps cut short (Lightning's); the loop position keeps it open for a resume
    assert (trainer.global_step, trainer.current_epoch, trainer.fit_progress.epoch) == (8, 2, 1)
    assert _batches_per_epoch(module) == {0: 6, 1: 2}
    assert sorted(module.seen[0]) == list(range(22))  # every sample once in the first epoch
    assert module.epoch_ends == [0, 1]


def test_max_epochs_on_a_stream_ends_each_epoch_with_the_stream(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, max_epochs=3)
    module = StreamNet()
    trainer.fit(module, stream_loader(22))
    assert module.estimated == math.inf  # unknown: no length, no max_steps
    assert (trainer.global_step, trainer.current_epoch) == (18, 3)
    assert _batches_per_epoch(module) == {0: 6, 1: 6, 2: 6}
    for epoch in range(3):
        assert sorted(module.seen[epoch]) == list(range(22))
    assert module.seen[0] != module.seen[1]  # the stream's set_epoch was called: a new order each epoch


@pytest.mark.parametrize("accumulate", [4, 5])
def test_a_stream_trains_exactly_as_the_same_sized_loader(tmp_path: Path, accumulate: int) -> None:
    # The stream's last batch closes the accumulation window (it is known while in use), as the sized loader's does:
    # 6 batches with accumulate_grad_batches=4 are 2 optimizer steps per epoch, and the weights are bit for bit equal.
    results = []
    for name, loader in (("stream", stream_loader(22, shuffle=False)), ("sized", DataLoader(Indexed(22), batch_size=BATCH_SIZE))):
        torch.manual_seed(7)
        module = StreamNet()
        trainer = _trainer(tmp_path / name, max_epochs=2, accumulate_grad_batches=accumulate)
        trainer.fit(module, loader)
        results.append((module, trainer.global_step))
    (stream, stream_steps), (sized, sized_steps) = results
    assert stream_steps == sized_steps == 4
    assert stream.losses == sized.losses
    for (name, a), b in zip(stream.state_dict().items(), sized.state_dict().values()):
        assert torch.equal(a, b), name


def test_int_limit_train_batches_caps_a_stream(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, max_epochs=2, limit_train_batches=3)
    module = StreamNet()
    trainer.fit(module, stream_loader(22))
    assert trainer.num_training_batches == 3
    assert _batches_per_epoch(module) == {0: 3, 1: 3}
    # a limit past the stream's end: the epoch ends with the stream
    trainer = _trainer(tmp_path, max_epochs=2, limit_train_batches=100)
    module = StreamNet()
    trainer.fit(module, stream_loader(22))
    assert trainer.num_training_batches == 100 and _batches_per_epoch(module) == {0: 6, 1: 6} and trainer.global_step == 12


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"limit_train_batches": 0.5}, r"limit_train_batches=0\.5 is a fraction of an epoch, but the train dataloader has no length.*pass an int"),
        ({"val_check_interval": 0.25}, r"val_check_interval=0\.25 is a fraction of an epoch, but the train dataloader has no length.*pass an int"),
        ({"limit_val_batches": 0.5}, r"limit_val_batches=0\.5 is a fraction of an epoch, but the val dataloader has no length"),
    ],
)
def test_fractions_of_a_stream_are_refused(tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    trainer = _trainer(tmp_path, max_epochs=1, **kwargs)
    module = StreamNet()
    with pytest.raises(ValueError, match=message):
        trainer.fit(module, stream_loader(22), stream_loader(7))
    assert trainer.global_step == 0 and not module.seen


def test_whole_and_no_fractions_of_a_stream_are_taken(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, max_epochs=1, limit_train_batches=1.0, val_check_interval=1.0, limit_val_batches=1.0)
    module = StreamNet()
    trainer.fit(module, stream_loader(22), stream_loader(7))
    assert trainer.global_step == 6 and module.validations == [(0, 6)] and trainer.num_val_batches == float("inf")
    trainer = _trainer(tmp_path, max_epochs=1, limit_val_batches=0.0)
    trainer.fit(StreamNet(), stream_loader(22), stream_loader(7))
    assert trainer.global_step == 6 and trainer.num_val_batches == 0


def test_an_empty_stream_is_refused(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, max_epochs=-1, max_steps=5)
    with pytest.raises(ValueError, match=r"the train dataloader yielded no batch in epoch 0"):
        trainer.fit(StreamNet(), stream_loader(0))


@pytest.mark.parametrize(
    ("interval", "expected"),
    [(2, [(0, 2), (0, 4), (0, 6), (1, 2), (1, 4), (1, 6)]), (4, [(0, 4), (1, 4)]), (None, [(0, 6), (1, 6)])],
    ids=["every-2", "every-4-not-at-the-end", "epoch-end"],
)
def test_int_val_check_interval_on_a_stream(tmp_path: Path, interval: int | None, expected: list[tuple[int, int]]) -> None:
    # as Lightning: an int interval on a loader without a length validates every that many batches only
    trainer = _trainer(tmp_path, max_epochs=2, val_check_interval=interval)
    module = StreamNet()
    trainer.fit(module, stream_loader(22), stream_loader(7))
    assert module.validations == expected
    assert trainer.callback_metrics["val_count"] == 7.0  # every validation sample, once


# ---------------------------------------------------------------------------------------------- evaluation
def test_validate_test_predict_on_streams(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path)
    module = StreamNet()
    assert trainer.validate(module, stream_loader(7), verbose=False)[0]["val_count"] == 7.0
    assert trainer.num_val_batches == float("inf")
    assert trainer.test(module, stream_loader(9), verbose=False)[0]["test_count"] == 9.0
    assert trainer.num_test_batches == float("inf")
    predictions = trainer.predict(module, stream_loader(10, shuffle=False))
    assert torch.cat(predictions).tolist() == list(range(10)) and trainer.num_predict_batches == float("inf")
    # several loaders, one of them sized; an int limit caps the stream
    out = trainer.validate(module, [stream_loader(7), DataLoader(Indexed(5), batch_size=BATCH_SIZE)], verbose=False)
    assert out[0]["val_count/dataloader_idx_0"] == 7.0 and out[1]["val_count/dataloader_idx_1"] == 5.0
    assert trainer.num_val_batches == [float("inf"), 2]
    trainer = _trainer(tmp_path, limit_test_batches=1)
    assert trainer.test(module, stream_loader(9), verbose=False)[0]["test_count"] == 4.0 and trainer.num_test_batches == 1
    trainer = _trainer(tmp_path, limit_predict_batches=0.5)
    with pytest.raises(ValueError, match=r"limit_predict_batches=0\.5 is a fraction of an epoch, but the predict dataloader has no length"):
        trainer.predict(module, stream_loader(9))


def test_sanity_check_on_a_stream(tmp_path: Path) -> None:
    module = StreamNet()
    counts: list[float] = []

    class Counter(Callback):
        def on_sanity_check_end(self, trainer: Any, module: Any) -> None:
            counts.append(float(trainer.callback_metrics["val_count"]))

    trainer = _trainer(tmp_path, max_epochs=1, num_sanity_val_steps=-1, callbacks=[Counter()])  # -1: until the stream ends
    trainer.fit(module, stream_loader(22), stream_loader(7))
    assert counts == [7.0] and trainer.global_step == 6


# ---------------------------------------------------------------------------------------------- progress bar
def test_progress_bar_counts_a_stream_without_a_total(tmp_path: Path) -> None:
    stream = io.StringIO()
    trainer = _trainer(tmp_path, max_epochs=1, num_sanity_val_steps=2, callbacks=[ProgressBar(file=stream, min_interval=0)])
    trainer.fit(StreamNet(), stream_loader(22), stream_loader(7))
    text = stream.getvalue()
    epoch = [line for line in re.split(r"[\r\n]", text) if line.startswith("Epoch 0")]
    assert any(re.match(r"Epoch 0: 6it \[", line) for line in epoch), text  # a count, no total
    assert not any("/" in line.split("[")[0] for line in epoch), text  # never "n/total"
    assert re.search(r"Validation: 2it \[", text), text
    assert re.search(r"Sanity Checking: 100%\S* *\|.*\| 2/2", text), text  # 2 sanity steps: the total is known
    stream = io.StringIO()
    trainer = _trainer(tmp_path, callbacks=[ProgressBar(file=stream, min_interval=0)])
    trainer.predict(StreamNet(), stream_loader(10))
    assert re.search(r"Predicting: 3it \[", stream.getvalue()), stream.getvalue()


# ---------------------------------------------------------------------------------------------- exact resume
TOTAL_STEPS = 8  # 6 batches = 3 optimizer steps per epoch: ends mid-epoch 2


class LossRecorder(Callback):
    def __init__(self) -> None:
        self.logged: dict[int, float] = {}

    def on_log_metrics(self, trainer: Any, module: Any, metrics: dict[str, float], step: int) -> None:
        if "train_loss" in metrics:
            self.logged[step] = float(metrics["train_loss"])


def resume_run(root: Path, max_steps: int, *, stop_step: int, ckpt_path: str | None = None, init_seed: int = 1,
               validate: bool = False, **trainer_kwargs: Any) -> tuple[StreamNet, Trainer, LossRecorder]:
    """Fit a fresh `StreamNet` (initialized from `init_seed`) on a shuffled stream to `max_steps` in `root`, accumulating 2
    batches and checkpointing every `stop_step` steps (also used by the 2-process test)."""
    torch.manual_seed(init_seed)
    module = StreamNet()
    recorder = LossRecorder()
    checkpoints = ModelCheckpoint(dirpath=root / "ckpts", every_n_train_steps=stop_step, save_top_k=-1)
    trainer = _trainer(root, max_steps=max_steps, max_epochs=100, accumulate_grad_batches=2, callbacks=[recorder, checkpoints],
                       enable_checkpointing=True, log_every_n_steps=1, val_check_interval=3 if validate else None, **trainer_kwargs)
    trainer.fit(module, stream_loader(22), stream_loader(7, shuffle=False) if validate else None, ckpt_path=ckpt_path)
    return module, trainer, recorder


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("stop_step", "validate"),
    [(2, False), (3, False), (7, False), (2, True), (3, True)],
    ids=["epoch0-mid", "epoch0-end", "epoch2-mid", "epoch0-mid-validating", "epoch0-end-validating"],
)
def test_resume_on_a_stream_is_bit_exact(tmp_path: Path, stop_step: int, validate: bool) -> None:
    straight, straight_trainer, straight_log = resume_run(tmp_path / "straight", TOTAL_STEPS, stop_step=TOTAL_STEPS, validate=validate)
    first, first_trainer, _ = resume_run(tmp_path, stop_step, stop_step=stop_step, validate=validate)
    assert first_trainer.global_step == stop_step
    # a different initialization proves the weights come from the checkpoint
    resumed, trainer, resumed_log = resume_run(tmp_path, TOTAL_STEPS, stop_step=stop_step, ckpt_path="last", init_seed=99, validate=validate)
    assert trainer.global_step == straight_trainer.global_step == TOTAL_STEPS
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        assert torch.equal(a, b), f"{name} differs after resume"
    assert {**first.losses, **resumed.losses} == straight.losses
    assert not set(first.losses) & set(resumed.losses), "batches were trained twice"
    assert {e: first.seen.get(e, []) + resumed.seen.get(e, []) for e in straight.seen} == straight.seen  # the stream continued
    if stop_step % 3 == 0:  # stopped at an epoch's last batch: that epoch does not end again
        assert first.epoch_ends + resumed.epoch_ends == straight.epoch_ends
    else:  # an epoch cut short by max_steps ended (Lightning's hooks) and ends again, whole, in the resumed run
        assert first.epoch_ends + resumed.epoch_ends[1:] == straight.epoch_ends and resumed.epoch_ends[0] == first.epoch_ends[-1]
    # a validation due after the checkpointed batch runs in the resumed run (the checkpoint came before it)
    assert first.validations == straight.validations[: len(first.validations)]
    assert resumed.validations == straight.validations[len(straight.validations) - len(resumed.validations) :]
    assert set(first.validations + resumed.validations) == set(straight.validations)
    assert resumed_log.logged == {s: v for s, v in straight_log.logged.items() if s >= min(resumed_log.logged)}
    assert trainer.optimizers[0].param_groups[0]["lr"] == straight_trainer.optimizers[0].param_groups[0]["lr"]
