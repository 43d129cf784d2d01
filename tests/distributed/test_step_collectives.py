"""A steady training step makes no Python-level collective and reads no device value beyond what the raw loop does.

Counted in 2 real DDP processes (gloo) by wrapping every collective of ``torch.distributed`` and the ``Tensor`` methods
that read a value back to the host (``item``, ``__bool__``, ``__float__``, ``__int__``, ``tolist``), over 20 batches
well after the start, for the raw PyTorch DDP loop, the Accelerator face and the Trainer face with its defaults
(progress bar, CSV tracker, checkpointing, ``self.log`` without ``sync_dist``). DDP's own gradient all-reduce runs in
C++ and is not counted, in any of them. On a GPU each host read waits for the device to drain, undoing the
asynchronous launch that keeps small steps fast; so both faces must match the raw loop: no collective, no read.
The Trainer's one scheduled agreement on stopping and preemption is bound by time (``stop_check_interval=1.0``
seconds), not by steps: under a slow, loaded machine it may fall in the window, at most once a second. With
``stop_check_interval=5`` (batches) it agrees every 5th batch, which the counter sees (the count is real, not a
wrapper that misses calls).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

from callbacks.base import Callback
from strategies.process_group import wait_for_collective_threads
from tests.helpers.multiprocess import run_distributed
from trainer import Accelerator, Trainer, TrainModule

COLLECTIVES = ("all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor", "broadcast", "broadcast_object_list",
               "barrier", "reduce", "reduce_scatter", "reduce_scatter_tensor", "gather", "gather_object", "scatter", "all_to_all",
               "send", "recv", "isend", "irecv", "monitored_barrier")
HOST_READS = ("item", "__bool__", "__float__", "__int__", "tolist")
START, STOP = 10, 30  # the counted batches: [START, STOP)


class Counter:
    """Counts collectives and host reads while `on`."""

    def __init__(self) -> None:
        self.on = False
        self.collectives: dict[str, int] = {}
        self.reads: dict[str, int] = {}
        self.redraw_reads = 0
        self.seconds = 0.0  # the counted window's length
        self._since = 0.0

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        saved: list[tuple[Any, str, Any]] = []
        for name in COLLECTIVES:
            for owner in (dist, dist.distributed_c10d):
                if hasattr(owner, name):
                    saved.append((owner, name, getattr(owner, name)))
                    setattr(owner, name, self._wrap(getattr(owner, name), self.collectives, name))
        for name in HOST_READS:
            saved.append((torch.Tensor, name, getattr(torch.Tensor, name)))
            setattr(torch.Tensor, name, self._wrap(getattr(torch.Tensor, name), self.reads, name))
        try:
            yield
        finally:
            for owner, name, original in reversed(saved):
                setattr(owner, name, original)

    def _wrap(self, fn: Any, into: dict[str, int], name: str) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            if self.on:
                into[name] = into.get(name, 0) + 1
            return fn(*args, **kwargs)

        return counted

    def batch(self, index: int) -> None:
        if index == START:
            self._since = time.perf_counter()
        elif index == STOP:
            self.seconds = time.perf_counter() - self._since
        self.on = START <= index < STOP


def _data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(2 * 48 * 4, 8, generator=g), torch.randint(0, 3, (2 * 48 * 4,), generator=g))


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def _raw(counter: Counter) -> None:
    dist.init_process_group("gloo")
    model = torch.nn.parallel.DistributedDataParallel(_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = _data()
    sampler = torch.utils.data.distributed.DistributedSampler(data, shuffle=False)
    for i, (x, y) in enumerate(DataLoader(data, batch_size=4, sampler=sampler)):
        counter.batch(i)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    counter.on = False
    # a raw script that frees its DDP model in the process (here: the test pool's worker runs the next test) must let
    # gloo's workers finish the last all-reduce first, or freeing the reducer can deadlock (see leave_process_group)
    wait_for_collective_threads()
    dist.destroy_process_group()


def _accelerator(counter: Counter) -> None:
    acc = Accelerator()
    model, optimizer, loader = acc.prepare(_model(), torch.optim.SGD(_model().parameters(), lr=0.1), DataLoader(_data(), batch_size=4))
    for i, (x, y) in enumerate(loader):
        counter.batch(i)
        with acc.accumulate(model):
            acc.backward(torch.nn.functional.cross_entropy(model(x), y))
            optimizer.step()
            optimizer.zero_grad()
    counter.on = False
    acc.end_training()


class Classifier(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = _model()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Window(Callback):
    def __init__(self, counter: Counter) -> None:
        self.counter = counter

    def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
        self.counter.batch(batch_idx)

    def on_train_epoch_end(self, trainer: Any, module: Any) -> None:
        self.counter.on = False


def _trainer(counter: Counter, tmp: str, **kwargs: Any) -> None:
    trainer = Trainer(strategy="ddp", devices=2, max_epochs=1, project_dir=tmp, callbacks=[Window(counter)],
                      process_group_timeout=60, **kwargs)
    trainer.fit(Classifier(), DataLoader(_data(), batch_size=4))


@contextlib.contextmanager
def _not_counting_redraws(counter: Counter) -> Iterator[None]:
    """The progress bar reads the values it shows when it redraws (at most every ``min_interval``, 0.1 s, on process 0),
    not every step: those reads are counted apart, in ``redraw_reads``."""
    from callbacks.progress import ProgressBar

    original = ProgressBar.postfix

    def postfix(self: ProgressBar, trainer: Any) -> dict[str, float]:
        on, counter.on = counter.on, False
        try:
            shown = original(self, trainer)
        finally:
            counter.on = on
        if on:
            counter.redraw_reads += len(shown)
        return shown

    ProgressBar.postfix = postfix  # type: ignore[method-assign]
    try:
        yield
    finally:
        ProgressBar.postfix = original  # type: ignore[method-assign]


def _counts(face: str, tmp: str, kwargs: dict[str, Any]) -> dict[str, Any]:
    counter = Counter()
    with counter.installed(), _not_counting_redraws(counter):
        if face == "raw":
            _raw(counter)
        elif face == "accelerator":
            _accelerator(counter)
        else:
            _trainer(counter, os.path.join(tmp, face), **kwargs)
    return {"collectives": counter.collectives, "reads": counter.reads, "redraw_reads": counter.redraw_reads, "seconds": counter.seconds}


def test_a_steady_step_makes_no_collective_and_no_host_read(tmp_path: Any) -> None:
    results = {face: run_distributed(_counts, face, str(tmp_path), {}, nprocs=2, timeout=240) for face in ("raw", "accelerator", "trainer")}
    for face, ranks in results.items():
        for rank, counts in enumerate(ranks):
            redraws, seconds = counts.pop("redraw_reads"), counts.pop("seconds")
            if face == "trainer":  # the scheduled agreement on stop/preemption, every stop_check_interval=1.0 s, is
                # time-bound: at most one per second of the window, plus one for the estimate the first batches give
                agreements = counts["collectives"].pop("all_reduce", 0)
                assert agreements <= 2 + int(seconds) and counts["reads"].pop("tolist", 0) == agreements, (rank, agreements, seconds)
                counts = {name: {k: v for k, v in values.items() if v} for name, values in counts.items()}
            assert counts == {"collectives": {}, "reads": {}}, f"{face}, rank {rank}: {counts}"
            # process 0's bar shows two values (loss, train_loss) per redraw, a redraw at most every 0.1 s
            bound = 2 * (int(seconds / 0.1) + 1) if face == "trainer" and rank == 0 else 0
            assert redraws <= bound, (face, rank, redraws, seconds)


def test_the_counter_sees_scheduled_agreements(tmp_path: Any) -> None:
    ranks = run_distributed(_counts, "trainer", str(tmp_path), {"stop_check_interval": 5}, nprocs=2, timeout=240)
    for counts in ranks:  # batches 14, 19, 24, 29 end an agreement: one all-reduce and one read (tolist) each
        counts.pop("redraw_reads"), counts.pop("seconds")
        assert counts["collectives"] == {"all_reduce": 4}, counts
        assert counts["reads"] == {"tolist": 4}, counts
