"""A machine lost mid-run under TorchElastic: the job goes on, on the processes left, on the samples it would have seen.

Two "machines" on loopback, one `trainer launch` each (two processes per machine), meet through torchrun's c10d
rendezvous (its store held by the test, as an etcd server would be) with ``--min_machines 1 --max_machines 2
--max_restarts 1``. After step 13 the second machine dies (its agent and both its processes SIGKILLed); the first
machine's processes fail in their next collective, its agent restarts them alone, and ``fit(ckpt_path="last")`` resumes
the four-process checkpoint of step 10 on two processes. The restarted workers build their process group in the store
the dead attempt's workers used (torchrun's agent keeps it): with several processes a machine they must not read the
addresses the dead attempt left there (`strategies.process_group.attempt_store`). The job must exit cleanly, with every
step's samples and the final weights of a run never interrupted (the script runs as
``python -m tests.integration.test_elastic_node_loss``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_cli_multinode import TRAINER, clean_env, free_port

pytestmark = [pytest.mark.distributed, pytest.mark.slow, pytest.mark.faults]

REPO = Path(__file__).resolve().parents[2]
GLOBAL_BATCH, SAMPLES, TOTAL, EVERY, LOSE_AT = 12, 48, 24, 5, 13  # 4 whole steps an epoch: 4, 2 or 1 processes pad nothing
PER_MACHINE = 2


def _node(port: int, root: Path, env: dict[str, str]) -> subprocess.Popen:
    command = [
        TRAINER, "launch", "--cpu", "--strategy", "ddp", "--num_processes", str(2 * PER_MACHINE), "--num_machines", "2", "--min_machines", "1",
        "--max_machines", "2", "--max_restarts", "1", "--rdzv_backend", "c10d", "--main_process_ip", "127.0.0.1",
        "--main_process_port", str(port), "--rdzv_join_timeout", "30", "--rdzv_conf", "last_call_timeout=8",
        "--monitor_interval", "0.2", "-m", "tests.integration.test_elastic_node_loss", str(root),
    ]  # fmt: skip
    return subprocess.Popen(command, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.timeout(480)
def test_a_lost_machine_is_survived_on_the_samples_of_an_uninterrupted_run(tmp_path: Path) -> None:
    from safetensors.torch import load_file
    from torch.distributed import TCPStore

    straight, run = tmp_path / "straight", tmp_path / "run"
    straight.mkdir(), run.mkdir()
    want = main(straight)  # one process, never interrupted: the order is the same on any number of processes
    env = {**clean_env(tmp_path), "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "TRAINWRIGHT_PG_TIMEOUT": "30"}
    port = free_port()
    # the rendezvous store, held here as an etcd server or a job's head would hold it: it outlives any machine, and both
    # machines start at once (the agents find it taken and join it as clients)
    store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    survivor, lost = _node(port, run, env), _node(port, run, {**env, "ELASTIC_TEST_LOSE": "1"})
    try:
        out = survivor.communicate(timeout=400)[0]
        lost.wait(timeout=30)
    finally:
        for node in (survivor, lost):
            if node.poll() is None:
                node.kill()
        del store
    assert survivor.returncode == 0, out[-4000:]
    assert lost.returncode == -signal.SIGKILL
    # the survivors' share of the steps before the loss (the lost machine's processes wrote nothing: they were SIGKILLed)
    written = sorted(run.glob("seen-0-*.json"))
    assert len(written) == PER_MACHINE, [w.name for w in written]
    shares = [{int(k): v for k, v in json.loads(w.read_text()).items()} for w in written]
    for before in shares:
        # each failed in the first collective without its peers: step 14's backward (or a stop check just before it)
        assert sorted(before) in (list(range(LOSE_AT + 1)), list(range(LOSE_AT + 2))), sorted(before)
        assert all(len(before[s]) == GLOBAL_BATCH // (2 * PER_MACHINE) for s in before)
        assert all(set(before[s]) <= set(want["seen"][s]) for s in before)
    both = [sorted(shares[0][s] + shares[1][s]) for s in range(LOSE_AT + 1)]
    assert all(len(set(b)) == len(b) for b in both)  # the two survivors drew different samples at each step
    report = json.loads((run / "report.json").read_text())
    assert report["world_size"] == PER_MACHINE and report["restart"] == 1 and report["global_step"] == TOTAL
    restarted = [{int(k): v for k, v in json.loads(w.read_text()).items()} for w in sorted(run.glob("seen-1-*.json"))]
    assert len(restarted) == PER_MACHINE
    resumed = {s: sorted(restarted[0][s] + restarted[1][s]) for s in restarted[0]}
    assert resumed == {s: sorted(want["seen"][s]) for s in range(10, TOTAL)}  # from the step-10 checkpoint
    got, expected = load_file(str(run / "final.safetensors")), load_file(str(straight / "final.safetensors"))
    assert max(float((got[k] - expected[k]).abs().max()) for k in expected) < 1e-5


# ------------------------------------------------------------------------------------------ the training script
def main(root: Path) -> dict[str, Any]:
    """Train to TOTAL steps from the newest checkpoint in `root`, a checkpoint every EVERY steps; on the machine told
    to be lost, kill it after step LOSE_AT."""
    import torch
    from safetensors.torch import save_file
    from torch.utils.data import DataLoader, TensorDataset

    from callbacks.base import Callback
    from callbacks.checkpoint import ModelCheckpoint
    from trainer.fit.module import TrainModule
    from trainer.fit.trainer import Trainer

    seen: dict[int, list[int]] = {}

    class Net(TrainModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            index, x, y = batch
            seen[self.trainer.global_step] = index.tolist()
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=0.05)

    class LoseThisMachine(Callback):
        def on_after_backward(self, trainer: Any, module: Any) -> None:
            if trainer.global_step == LOSE_AT and os.environ.get("ELASTIC_TEST_LOSE") == "1":
                agent = int(os.environ["TRAINWRIGHT_LAUNCHER_PID"])
                workers = _children(agent)
                os.kill(agent, signal.SIGKILL)  # the machine: its agent, then its processes, this one last
                for pid in workers:
                    if pid != os.getpid():
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
                os.kill(os.getpid(), signal.SIGKILL)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, 4, generator=g)
    data = TensorDataset(torch.arange(SAMPLES), x, x.sum(1, keepdim=True) + 0.1 * torch.randn(SAMPLES, 1, generator=g))
    launched = "TORCHELASTIC_RESTART_COUNT" in os.environ
    callbacks = [ModelCheckpoint(dirpath=root / "ckpts", every_n_train_steps=EVERY, save_top_k=-1), LoseThisMachine()]
    trainer = Trainer(max_steps=TOTAL, max_epochs=100, callbacks=callbacks if launched else [], log_with=None,
                      enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=launched,
                      project_dir=str(root), seed=1234)
    module = Net()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", 0))
    try:
        trainer.fit(module, DataLoader(data, batch_size=GLOBAL_BATCH // trainer.world_size, shuffle=True),
                    ckpt_path="last" if launched else None)
    finally:
        (root / f"seen-{restart}-{trainer.global_rank}.json").write_text(json.dumps(seen))
    report = {"world_size": trainer.world_size, "restart": restart, "global_step": trainer.global_step, "seen": seen}
    full = trainer.strategy.module_state_dict(module)
    if trainer.is_global_zero:
        save_file({k: v.contiguous() for k, v in full.items()}, str(root / "final.safetensors"))
        (root / "report.json").write_text(json.dumps(report))
    return report


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc; an orphan's parent is its new one, so this runs first)."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError, IndexError):
            if int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry))
    return found


if __name__ == "__main__":
    main(Path(sys.argv[1]))
