"""``kill -9`` during an asynchronous save's background write, then resume: both faces, 1 and 2 processes, DDP and FSDP.

The killed and the resumed run are real jobs (``python -m tests.distributed.test_async_checkpoint_kill``): the killed
run of several processes under ``torchrun``, the others on processes forked from the tests' warm server as torchrun
starts its workers (`tests.helpers.scripts.run_python`); the uninterrupted reference runs through ``run_distributed``.
A run saves at steps 3 and 6 (asynchronously) and trains to step 9 (also on a 2×2 mesh: FSDP × tensor parallel on 4
processes). In the killed run, process 0 is SIGKILLed while its checkpoint writer process is in the middle of writing
the step-6 checkpoint: an object registered for checkpointing, when the save pickles it, turns the file it goes into
into a pipe nobody reads, so the writer blocks inside that file, and kills the process as soon as the writer began
writing it. In a second scenario (the Trainer on 2 DDP processes) process 0's writer process itself is killed there:
both processes report the failed save at their next call and exit with an error. Then:

* the step-6 checkpoint was never committed: its staging directory is there, its directory is not, and the newest
  complete checkpoint is step 3's;
* no process of the killed run is left (the writer dies with its trainer) and nothing of it stays in ``/dev/shm``;
* the resumed run (from the newest checkpoint) ends with the same weights, bit for bit, as a run never interrupted;
* its own next save removed the staging directory the killed write left.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.multiprocess import free_port, run_distributed
from tests.helpers.scripts import run_python

pytestmark = [pytest.mark.distributed, pytest.mark.faults]

REPO = Path(__file__).resolve().parents[2]
TOTAL_STEPS, EVERY, KILL_AT = 9, 3, 6
CASES = [("accelerator", 1, "single"), ("accelerator", 2, "ddp"), ("accelerator", 2, "fsdp"), ("accelerator", 4, "fsdp_tp"),
         ("trainer", 1, "single"), ("trainer", 2, "ddp"), ("trainer", 2, "fsdp")]


WRITER_CASES = [("trainer", 2, "ddp")]  # (the agreement of several processes on a failed write; the Trainer face)


def _phase(root: Path, face: str, nproc: int, strategy: str, kill: str) -> subprocess.CompletedProcess:
    """One run of the job: the killed one of several processes under a real ``torchrun`` (its agent's handling of the
    dead worker is part of what is checked); the others (the resumed run, a killed single process) on processes
    forked as torchrun would start them, where only what the job does is under test."""
    args = ["-m", "tests.distributed.test_async_checkpoint_kill", str(root), face, strategy, kill or "0"]
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""), "TRAINWRIGHT_PG_TIMEOUT": "60"}
    if not (kill and nproc > 1):
        return run_python([sys.executable, *args], cwd=root, env=env, timeout=300, nprocs=nproc)
    args = ["-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port", str(free_port()), *args]
    # (its output goes to files: a process it leaves behind holding a pipe must not stall this wait, but fail the test)
    with open(root / "stdout.txt", "w") as out, open(root / "stderr.txt", "w") as err:
        done = subprocess.run([sys.executable, *args], cwd=root, env=env, stdout=out, stderr=err, timeout=300)
    return subprocess.CompletedProcess(done.args, done.returncode, (root / "stdout.txt").read_text(), (root / "stderr.txt").read_text())


def _uninterrupted(root: Path, face: str, strategy: str) -> None:
    """The run never killed, through ``run_distributed``, with the threads ``torchrun`` gives each of several
    processes (one), so its weights compare bit for bit with the resumed run's."""
    import torch

    if int(os.environ["WORLD_SIZE"]) > 1:
        torch.set_num_threads(1)
    os.chdir(root)
    main(root, face, strategy, kill="")


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("face", "nproc", "strategy"), CASES, ids=[f"{f}-{n}proc-{s}" for f, n, s in CASES])
def test_kill_during_background_write_resumes_from_the_previous_checkpoint(face: str, nproc: int, strategy: str, tmp_path: Path) -> None:
    _kill_and_resume(face, nproc, strategy, "trainer", tmp_path)


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("face", "nproc", "strategy"), WRITER_CASES, ids=[f"{f}-{n}proc-{s}" for f, n, s in WRITER_CASES])
def test_killed_writer_process_fails_the_save_and_the_run_resumes_from_the_previous_checkpoint(
    face: str, nproc: int, strategy: str, tmp_path: Path,
) -> None:
    from strategies.checkpoint_process import writer_mode

    if writer_mode() != "process":
        pytest.skip("asynchronous saves write in a thread of the training process on this platform")
    killed = _kill_and_resume(face, nproc, strategy, "writer", tmp_path)
    assert "CheckpointSaveError" in killed.stderr and "writer process" in killed.stderr and "SIGKILL" in killed.stderr, killed.stderr[-3000:]


@pytest.mark.timeout(120)
def test_a_launchers_sigterm_ends_a_failed_run_that_waits_for_its_background_save(tmp_path: Path) -> None:
    """A run fails (its step raises) while its background save cannot finish (its writer blocked on a file: a peer
    gone, a hung disk). The Trainer waits for that save before re-raising, and a SIGTERM from the launcher then must
    end the process (a failed run writes no preemption checkpoint), not be recorded while the wait goes on: under
    torchrun, that wait lasted until the agent's SIGKILL 30 s later."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    args = [sys.executable, "-m", "tests.distributed.test_async_checkpoint_kill", str(tmp_path), "trainer", "single", "block"]
    with open(tmp_path / "stderr.txt", "w") as err:
        job = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=err)
        try:
            deadline = time.monotonic() + 90
            while not (tmp_path / "failing").exists():
                assert job.poll() is None, (tmp_path / "stderr.txt").read_text()[-3000:]
                assert time.monotonic() < deadline, "the run never failed"
                time.sleep(0.1)
            time.sleep(0.5)  # (in the wait for the save now)
            job.send_signal(signal.SIGTERM)
            assert job.wait(timeout=15) == -signal.SIGTERM
        finally:
            if job.poll() is None:
                job.kill()
                job.wait()
    assert _left_running(tmp_path) == [], "the checkpoint writer outlived its run"


def _kill_and_resume(face: str, nproc: int, strategy: str, kill: str, tmp_path: Path) -> subprocess.CompletedProcess:
    import torch
    from safetensors.torch import load_file

    from strategies.checkpoint_store import newest_in

    straight, run = tmp_path / "straight", tmp_path / "run"
    straight.mkdir(), run.mkdir()
    run_distributed(_uninterrupted, straight, face, strategy, nprocs=nproc)  # the reference (the launch is not its subject)
    killed = _phase(run, face, nproc, strategy, kill=kill)
    try:
        assert killed.returncode != 0 and not (run / "final.safetensors").exists(), killed.stderr[-3000:]
        # the survivors stop on their own once process 0 is gone, not by the agent's SIGKILL 30 s later
        assert "Unable to shutdown process" not in killed.stderr, killed.stderr[-3000:]
        assert _left_running(run) == [], "a process of the killed run (its checkpoint writer) outlived it"
    finally:
        if (run / "holder.pid").exists():  # (what kept the pipe open, outside the run)
            with contextlib.suppress(ProcessLookupError):
                os.kill(int((run / "holder.pid").read_text()), signal.SIGKILL)
    if os.path.isdir("/dev/shm"):  # (its shared memory has no name there: nothing may appear)
        assert [name for name in os.listdir("/dev/shm") if "trainwright" in name] == []
    folder = run / "checkpoints"
    staged = [p.name for p in folder.iterdir() if p.name.endswith(".partial")]
    assert len(staged) == 1, f"expected the killed save's staging directory, found {sorted(p.name for p in folder.iterdir())}"
    newest = newest_in(folder)
    assert newest is not None and newest.name == ("checkpoint_0" if face == "accelerator" else f"step={EVERY}"), newest
    assert not (folder / staged[0][1 : -len(".partial")]).exists()  # the killed checkpoint never got its real name
    resumed = _phase(run, face, nproc, strategy, kill="")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _left_running(run) == [], "the checkpoint writer outlived its run"
    assert json.loads((run / "report.json").read_text()) == {"resumed_from": EVERY, "step": TOTAL_STEPS}
    assert not [p.name for p in folder.iterdir() if p.name.endswith(".partial")], "the next save leaves no staging behind"
    want, got = load_file(str(straight / "final.safetensors")), load_file(str(run / "final.safetensors"))
    assert want.keys() == got.keys() and [k for k in want if not torch.equal(want[k], got[k])] == []
    return killed


def _left_running(run: Path, patience: float = 15.0) -> list[str]:
    """The processes still running in the directory `run` (a finished run's: none), after up to `patience` seconds."""
    deadline = time.monotonic() + patience
    while True:
        alive = []
        for proc in Path("/proc").iterdir():
            try:
                if proc.name.isdigit() and Path(os.readlink(proc / "cwd")) == run:
                    alive.append(f"{proc.name}: {(proc / 'cmdline').read_bytes()[:200]!r}")
            except OSError:  # gone, a zombie, or not ours to look at
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


# ------------------------------------------------------------------------------- the training job
class _KillWhenPickled:
    """Pickled only by the background save of a checkpoint, for the file ``custom_checkpoint_0.bin``: makes that file
    a pipe nobody reads, so the writer process blocks in the middle of it (the state around it is larger than a pipe
    holds), and as soon as the writer began writing it, SIGKILLs `target` (``"trainer"``: this process; ``"writer"``:
    its checkpoint writer). Where the save writes in a thread of this process, this process is killed right here."""

    def __init__(self, target: str) -> None:
        self.target = target

    def __deepcopy__(self, memo: Any) -> _KillWhenPickled:  # the step's copy of the state keeps it as it is
        return self

    def __reduce__(self) -> Any:
        from strategies.checkpoint_process import running_writer, writer_mode

        if writer_mode() == "thread":
            os.kill(os.getpid(), signal.SIGKILL)
        (staging,) = [p for p in (Path.cwd() / "checkpoints").iterdir() if p.name.endswith(".partial")]
        pipe = staging / "custom_checkpoint_0.bin"
        os.mkfifo(pipe)
        reading = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
        if self.target == "trainer":  # another process holds the pipe open too: the writer stays blocked when this one dies
            holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(pipe)], cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, start_new_session=True)
            assert holder.stdout is not None and holder.stdout.readline()
            (Path.cwd() / "holder.pid").write_text(str(holder.pid))
        writer = running_writer()
        assert writer is not None and writer.pid
        victim = os.getpid() if self.target == "trainer" else writer.pid

        def kill_once_written() -> None:
            poller = select.poll()
            poller.register(reading, select.POLLIN)
            while not poller.poll(100):
                pass
            os.kill(victim, signal.SIGKILL)

        threading.Thread(target=kill_once_written, daemon=True).start()
        return (int, (0,))


_HOLD = "import os, sys, time; os.open(sys.argv[1], os.O_RDONLY | os.O_NONBLOCK); print(flush=True); time.sleep(300)"


class _BlockWhenPickled:
    """Pickled only by the background save: makes that file a pipe with no reader, so the writer blocks opening it
    and the save never finishes (a peer gone, a hung filesystem)."""

    def __deepcopy__(self, memo: Any) -> _BlockWhenPickled:
        return self

    def __reduce__(self) -> Any:
        (staging,) = [p for p in (Path.cwd() / "checkpoints").iterdir() if p.name.endswith(".partial")]
        os.mkfifo(staging / "custom_checkpoint_0.bin")
        return (int, (0,))


class Probe:
    """Registered for checkpointing in every phase (so every checkpoint holds the same objects); in the killed run its
    state at step `KILL_AT` carries the object that kills process 0 or its writer in the middle of the write."""

    def __init__(self, kill: str) -> None:
        self.kill, self.step = kill, 0

    def state_dict(self) -> dict[str, Any]:
        import torch

        state: dict[str, Any] = {"step": torch.tensor(self.step)}
        if self.kill == "block" and self.step == KILL_AT:
            state["block"] = _BlockWhenPickled()
        elif self.kill and self.step == KILL_AT and int(os.environ.get("RANK", "0")) == 0:
            state["bomb"] = _KillWhenPickled(self.kill)
            state["ballast"] = torch.zeros(1 << 18)  # 1 MB: more than the pipe holds
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])


def _data(step: int, rank: int) -> tuple[Any, Any]:
    """The batch of data-parallel process `rank` at `step` (a tensor-parallel group shares one)."""
    import torch

    g = torch.Generator().manual_seed(1000 + step * 10 + rank)
    x = torch.randn(8, 16, generator=g)
    return x, x.sum(1, keepdim=True)


def _accelerator_run(root: Path, strategy: str, kill: str) -> tuple[Any, Any, int]:
    import torch

    from trainer import Accelerator, ProjectConfiguration
    from trainer.utils import set_seed

    project = ProjectConfiguration(project_dir=str(root), automatic_checkpoint_naming=True)
    if strategy == "fsdp_tp":  # a 2×2 mesh: FSDP over 2, tensor parallel over 2
        from trainer import ParallelismConfig

        config = ParallelismConfig(dp_shard_size=2, tp_size=2, tp_plan={"0": "colwise", "2": "rowwise"})
        accelerator = Accelerator(cpu=True, parallelism_config=config, project_config=project)
    else:
        accelerator = Accelerator(cpu=True, strategy=strategy, project_config=project)
    set_seed(7)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    probe = Probe(kill)
    accelerator.register_for_checkpointing(probe)
    resumed_from = 0
    if (root / "checkpoints").is_dir():
        accelerator.load_state()  # the newest complete checkpoint_<n>
        resumed_from = probe.step
    for step in range(resumed_from + 1, TOTAL_STEPS + 1):
        x, y = _data(step, accelerator.strategy.data_parallel_rank)
        accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
        optimizer.step()
        optimizer.zero_grad()
        probe.step = step
        if step % EVERY == 0:
            accelerator.save_state(async_save=True)
    accelerator.end_training()
    return accelerator, model, resumed_from


def _trainer_run(root: Path, strategy: str, kill: str) -> tuple[Any, Any, int]:
    import torch

    from callbacks.base import Callback
    from callbacks.checkpoint import ModelCheckpoint
    from trainer import Trainer, TrainModule

    class Net(TrainModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            if kill == "block" and self.trainer.global_step == KILL_AT:  # the run fails while its save cannot finish
                raise RuntimeError("the step after the blocked save fails")
            x, y = _data(self.trainer.global_step + 1, self.trainer.strategy.data_parallel_rank)
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=0.01)

    class Register(Callback):
        def __init__(self) -> None:
            self.probe, self.resumed_from = Probe(kill), 0

        def setup(self, trainer: Any, module: Any, stage: str) -> None:
            trainer.accelerator.register_for_checkpointing(self.probe)

        def on_train_start(self, trainer: Any, module: Any) -> None:
            self.resumed_from = trainer.global_step

        def on_exception(self, trainer: Any, module: Any, exception: BaseException) -> None:
            (root / "failing").touch()  # (the test's cue: the run is failing, and about to wait for its save)

        def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            self.probe.step = trainer.global_step

    torch.manual_seed(7)
    module, register = Net(), Register()
    checkpoints = ModelCheckpoint(dirpath=root / "checkpoints", filename="{step}", every_n_train_steps=EVERY, save_top_k=-1, async_save=True)
    trainer = Trainer(strategy=strategy, accelerator="cpu", max_steps=TOTAL_STEPS, callbacks=[register, checkpoints], log_with=None,
                      enable_progress_bar=False, enable_model_summary=False, project_dir=str(root), seed=3)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.zeros(64, 1)), batch_size=1)
    trainer.fit(module, loader, ckpt_path="last")
    return trainer.accelerator, module, register.resumed_from


def main(root: Path, face: str, strategy: str, kill: str) -> None:
    from safetensors.torch import save_file

    run = _accelerator_run if face == "accelerator" else _trainer_run
    accelerator, model, resumed_from = run(root, strategy, kill)
    full = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        save_file({k: v.contiguous() for k, v in full.items()}, str(root / "final.safetensors"))
        (root / "report.json").write_text(json.dumps({"resumed_from": resumed_from, "step": TOTAL_STEPS}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4] if sys.argv[4] != "0" else "")
