"""Multi-process scenarios that must end the same way every time, run again and again.

Each scenario is a small script launched with ``trainer launch --num_processes 2 --cpu`` (the launcher forked from the
tests' warm server by `tests.helpers.scripts.run_python`; its two workers are new interpreters) and the outcome a user
must see on every run: exit 0 for a good job (no "terminate called", no crash after correct output), and for a
faulty one the launcher's status and first summary line naming the rank and the cause. ``tests/stress/test_repeated.py``
runs each a few times in the suite (``pytest -m stress``); ``python -m tests.stress`` runs them many times, with
busy loops on the other cores if asked, and reports failures per 100 runs (the figures in ``docs/faults.md``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.scripts import run_python

REPO = Path(__file__).resolve().parents[2]

_EVALUATE = """
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

        def predict_step(self, batch, i):
            return self.lin(batch[0]).argmax(-1)

    g = torch.Generator().manual_seed(0)
    data = DataLoader(TensorDataset(torch.randn(64, 4, generator=g), torch.randint(0, 3, (64,), generator=g)), batch_size=8)
    trainer = Trainer(max_epochs=1, default_root_dir="out", process_group_timeout=60)
    result = getattr(trainer, sys.argv[1])(Net(), data)
    if sys.argv[1] == "predict":
        print(f"predicted {sum(len(p) for p in result)}", flush=True)  # gathered: every sample once
    else:
        print(result, flush=True)
"""

_TRAIN = """
    import sys
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from trainer import Trainer, TrainModule

    class Net(TrainModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

        def training_step(self, batch, i):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("loss", loss)
            return loss

        def validation_step(self, batch, i):
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y), sync_dist=True)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-2)

    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g))
    strategy = sys.argv[1]
    if strategy == "deepspeed":
        from trainer.strategies import DeepSpeedStrategy
        strategy = DeepSpeedStrategy(cpu=True, zero_stage=3)
    trainer = Trainer(max_epochs=2, strategy=strategy, default_root_dir="out", process_group_timeout=60,
                      enable_progress_bar=False)
    trainer.fit(Net(), DataLoader(data, batch_size=8), DataLoader(data, batch_size=8))
    print(f"global_step {trainer.global_step}", flush=True)
"""

_ACCELERATOR_DDP = """
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from trainer import Accelerator

    acc = Accelerator(process_group_timeout=60)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=4)
    model, optimizer, loader = acc.prepare(model, optimizer, loader)
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        acc.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    acc.gather_for_metrics(loss.detach())
    print("done", flush=True)  # no end_training(): the interpreter's exit tears the group down
"""

_PLAIN = """
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from trainer import Accelerator

    acc = Accelerator(process_group_timeout=60)
    loader = acc.prepare(DataLoader(TensorDataset(torch.arange(16.0)), batch_size=4))
    for (x,) in loader:
        acc.gather_for_metrics(x)
"""

_TRAINER_WITHOUT_FIT = """
    import torch
    from trainer import Trainer

    trainer = Trainer(max_epochs=1, default_root_dir="out", process_group_timeout=60)
    trainer.strategy.barrier()
    print(f"rank {trainer.global_rank} of {trainer.world_size}", flush=True)
"""

_SLOW_RELEASE = """
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

KILLED_MID_TRAINING = """
    import os, signal
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from trainer import Trainer, TrainModule

    class Net(TrainModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            if batch_idx == 3 and self.global_rank == 1:
                os.kill(os.getpid(), signal.SIGKILL)  # what the out-of-memory killer does
            x, y = batch
            return torch.nn.functional.mse_loss(self.lin(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = DataLoader(TensorDataset(torch.randn(64, 4), torch.randn(64, 1)), batch_size=4)
    Trainer(max_epochs=1, log_with=None, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
            process_group_timeout=120).fit(Net(), data)
"""

ONE_RANK_ONLY = """
    import torch
    from trainer import Accelerator

    acc = Accelerator(cpu=True, process_group_timeout=6)
    if acc.process_index == 0:
        acc.reduce(torch.ones(1))
"""


def _exits_zero(expect: str) -> Callable[[subprocess.CompletedProcess[str], Path], str | None]:
    """A good job: status 0, no abort text, and the line the script prints last."""

    def check(done: subprocess.CompletedProcess[str], cwd: Path) -> str | None:
        if done.returncode != 0:
            return f"exit status {done.returncode}: {done.stderr[-600:]}"
        for sign in ("terminate called", "Segmentation fault", "core dumped"):
            if sign in done.stderr:
                return f"exit 0 but {sign!r} in stderr: {done.stderr[-600:]}"
        if expect not in done.stdout:
            return f"{expect!r} missing from stdout: {done.stdout[-300:]}"
        return None

    return check


def _released(done: subprocess.CompletedProcess[str], cwd: Path) -> str | None:
    problem = _exits_zero("done")(done, cwd)
    missing = [rank for rank in (0, 1) if not (cwd / f"released-{rank}").exists()]
    return problem or (f"the slow finalizer never finished on rank(s) {missing}" if missing else None)


def _summary_first_line(done: subprocess.CompletedProcess[str]) -> str:
    start = done.stderr.find("trainer launch: rank")
    return done.stderr[start:].splitlines()[0] if start >= 0 else ""


def _killed_rank_named(done: subprocess.CompletedProcess[str], cwd: Path) -> str | None:
    first = _summary_first_line(done)
    if done.returncode != 137:
        return f"exit status {done.returncode}, want 137 (128 + SIGKILL); first summary line: {first!r}"
    if not (first.startswith("trainer launch: rank 1 (") and "killed by SIGKILL" in first):
        return f"first summary line does not name rank 1 and SIGKILL: {first!r}"
    if "never reached" in done.stderr:
        return "a waiting rank's timeout is reported as well as the dead rank"
    return None


def _one_sided_named(done: subprocess.CompletedProcess[str], cwd: Path) -> str | None:
    first = _summary_first_line(done)
    want = "trainer launch: rank 1 had ended when rank 0 called a collective, which failed at once"
    if done.returncode != 1:
        return f"exit status {done.returncode}, want 1; first summary line: {first!r}"
    return None if first.startswith(want) else f"first summary line: {first!r}"


@dataclass(frozen=True)
class Scenario:
    """One 2-process job and what it must end with."""

    name: str
    script: str
    args: tuple[str, ...]
    check: Callable[[subprocess.CompletedProcess[str], Path], str | None]
    outcome: str  # what a good run looks like, for the report

    def run(self, cwd: Path, timeout: float = 240) -> tuple[str | None, float]:
        """Run once in ``cwd`` (a fresh directory); return the problem (None for a good run) and the seconds taken."""
        import time

        cwd.mkdir(parents=True, exist_ok=True)
        script = cwd / "job.py"
        script.write_text(textwrap.dedent(self.script))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINWRIGHT_", "TORCHELASTIC_"))}
        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(key, None)
        env["TRAINWRIGHT_CONFIG_FILE"] = str(cwd / "no-config.yaml")
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        command = [sys.executable, "-m", "trainer", "launch", "--num_processes", "2", "--cpu", str(script), *self.args]
        start = time.monotonic()
        try:  # the launcher forked from the tests' warm server (its workers are new interpreters, as torchrun starts them)
            done = run_python(command, cwd=cwd, env=env, timeout=timeout)
        except subprocess.TimeoutExpired as hung:
            return f"still running after {timeout:.0f} s (a hang): {str(hung.stderr)[-400:]}", time.monotonic() - start
        return self.check(done, cwd), time.monotonic() - start


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("accelerator-no-end-training", _PLAIN, (), _exits_zero(""), "exit 0"),
        Scenario("accelerator-ddp-no-end-training", _ACCELERATOR_DDP, (), _exits_zero("done"), "exit 0"),
        Scenario("validate-only", _EVALUATE, ("validate",), _exits_zero("val_acc"), "exit 0"),
        Scenario("test-only", _EVALUATE, ("test",), _exits_zero("test_acc"), "exit 0"),
        Scenario("predict-only", _EVALUATE, ("predict",), _exits_zero("predicted 64"), "exit 0"),
        Scenario("trainer-without-fit", _TRAINER_WITHOUT_FIT, (), _exits_zero("of 2"), "exit 0"),
        Scenario("ddp-fit", _TRAIN, ("ddp",), _exits_zero("global_step 8"), "exit 0"),
        Scenario("deepspeed-zero3-fit", _TRAIN, ("deepspeed",), _exits_zero("global_step 8"), "exit 0"),
        Scenario("gloo-worker-releases-late", _SLOW_RELEASE, (), _released, "exit 0, finalizer done"),
        Scenario("rank-killed-mid-training", KILLED_MID_TRAINING, (), _killed_rank_named,
                 "status 137, rank 1 and SIGKILL named first"),
        Scenario("collective-on-one-rank", ONE_RANK_ONLY, (), _one_sided_named, "status 1, rank 1 named first"),
    )
}
