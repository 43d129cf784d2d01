"""2-process scripts must exit 0 every time, also when they end right after a collective.

Two causes of "terminate called without an active exception" (SIGABRT after correct output) are covered:

- a script that never calls ``end_training()``: without the strategy destroying its process group at interpreter
  exit, gloo's threads outlive Python (about 1 run of 3 on this machine); 20 runs in a row;
- a script whose last collective is still being let go by a gloo worker thread when the interpreter finalizes: the
  backend outlives ``destroy_process_group`` when a DDP model keeps it, and releasing a tensor that has a Python object
  takes the GIL, which CPython refuses a foreign thread during finalization (it ends the thread inside gloo's
  ``noexcept`` work destructor). ``validate``/``test``-only scripts end right after their metric all-gather (1 run in
  15 aborted on a loaded machine). One deterministic case (a slow finalizer on the worker stands in for a worker the
  scheduler left waiting), and a few repeated runs of each evaluation-only script.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.integration.test_cli_launch import clean_env, run_trainer

RUNS = 20
EVAL_RUNS = 6  # per script: the abort was 1 run in 15 under load; the deterministic case below proves the cause

PLAIN = textwrap.dedent(
    """
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from trainer import Accelerator

    acc = Accelerator(process_group_timeout=60)
    loader = acc.prepare(DataLoader(TensorDataset(torch.arange(16.0)), batch_size=4))
    for (x,) in loader:
        acc.gather_for_metrics(x)
    """
)

SLOW_RELEASE = textwrap.dedent(
    """
    import time, weakref
    import torch
    import torch.distributed as dist
    from trainer import Accelerator

    acc = Accelerator(process_group_timeout=60)
    model = acc.prepare(torch.nn.Linear(2, 1))  # DDP: its gloo backend outlives the process group

    def slow_finalizer():  # runs on gloo's worker thread, with the GIL, after the collective completed
        end = time.monotonic() + 1.0
        while time.monotonic() < end:
            pass
        open(f"released-{acc.process_index}", "w").close()

    x = torch.ones(2)
    weakref.finalize(x, slow_finalizer)
    outs = [torch.zeros(2) for _ in range(acc.num_processes)]
    future = dist.all_gather(outs, x, async_op=True).get_future()
    del x  # only the collective holds the input now: the worker frees its Python object
    future.wait()
    print("done", flush=True)
    """
)

EVALUATE = textwrap.dedent(
    """
    import sys
    import torch, torchmetrics
    from torch.utils.data import DataLoader, TensorDataset
    from trainer import Trainer, TrainModule

    class Net(TrainModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 3)
            self.acc = torchmetrics.Accuracy(task="multiclass", num_classes=3)

        def _step(self, batch, name):
            x, y = batch
            logits = self.lin(x)
            self.log(f"{name}_loss", torch.nn.functional.cross_entropy(logits, y), sync_dist=True)
            self.acc(logits, y)
            self.log(f"{name}_acc", self.acc)

        def validation_step(self, batch, i):
            self._step(batch, "val")

        def test_step(self, batch, i):
            self._step(batch, "test")

    g = torch.Generator().manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(64, 4, generator=g), torch.randint(0, 3, (64,), generator=g)), batch_size=8)
    trainer = Trainer(max_epochs=1, default_root_dir="out", process_group_timeout=60)
    print(getattr(trainer, sys.argv[1])(Net(), data))
    """
)


def _runs(tmp_path: Path, code: str, runs: int, *args: str) -> list[tuple[int, int, str]]:
    script = tmp_path / "job.py"
    script.write_text(code)
    env = clean_env(tmp_path)
    failures = []
    for attempt in range(runs):
        result = run_trainer(["launch", "--num_processes", "2", "--cpu", str(script), *args], env, tmp_path)
        if result.returncode != 0 or "terminate called" in result.stderr:
            failures.append((attempt, result.returncode, result.stderr[-400:]))
    return failures


@pytest.mark.faults
@pytest.mark.timeout(600)
def test_plain_script_without_end_training_always_exits_zero(tmp_path: Path) -> None:
    failures = _runs(tmp_path, PLAIN, RUNS)
    assert not failures, f"{len(failures)} of {RUNS} runs failed: {failures}"


@pytest.mark.faults
@pytest.mark.timeout(300)
def test_exit_waits_for_gloo_workers_to_let_go_of_the_last_collective(tmp_path: Path) -> None:
    # before: rc 134 ("terminate called without an active exception") on both ranks, every run
    failures = _runs(tmp_path, SLOW_RELEASE, 1)
    assert not failures, failures
    assert (tmp_path / "released-0").exists() and (tmp_path / "released-1").exists()


@pytest.mark.faults
@pytest.mark.timeout(600)
@pytest.mark.parametrize("stage", ["validate", "test"])
def test_an_evaluation_only_script_always_exits_zero(tmp_path: Path, stage: str) -> None:
    failures = _runs(tmp_path, EVALUATE, EVAL_RUNS, stage)
    assert not failures, f"{len(failures)} of {EVAL_RUNS} runs failed: {failures}"
