"""A machine lost mid-run under TorchElastic: the job goes on, on the processes left, on the samples it would have seen.

Two "machines" on loopback, one `trainer launch` each (one process per machine), meet through torchrun's c10d
rendezvous (its store held by the test, as an etcd server would be) with ``--min_machines 1 --max_machines 2
--max_restarts 1``. After step 13 the second machine dies (its agent and its process SIGKILLed); the first machine's
process fails in its next collective, its agent restarts it alone, and ``fit(ckpt_path="last")`` resumes the two-process checkpoint of step 10 on one process. The job must exit
cleanly, with every step's samples and the final weights of a run never interrupted (the script runs as
``python -m tests.integration.test_elastic_node_loss``).
"""

from __future__ import annotations

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
GLOBAL_BATCH, SAMPLES, TOTAL, EVERY, LOSE_AT = 12, 48, 24, 5, 13  # 4 whole steps an epoch: one process pads nothing


def _node(port: int, root: Path, env: dict[str, str]) -> subprocess.Popen:
    command = [
        TRAINER, "launch", "--cpu", "--strategy", "ddp", "--num_processes", "2", "--num_machines", "2", "--min_machines", "1",
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
    # the survivor's share of the steps before the loss (the lost machine's process wrote nothing: it was SIGKILLed)
    (written,) = run.glob("seen-0-*.json")
    before = {int(k): v for k, v in json.loads(written.read_text()).items()}
    assert sorted(before) == list(range(LOSE_AT + 2))  # it failed in step 14's backward, the first without its peer
    assert all(len(before[s]) == GLOBAL_BATCH // 2 and set(before[s]) <= set(want["seen"][s]) for s in range(LOSE_AT + 1))
    report = json.loads((run / "report.json").read_text())
    assert report["world_size"] == 1 and report["restart"] == 1 and report["global_step"] == TOTAL
    resumed = {int(k): sorted(v) for k, v in report["seen"].items()}
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
                os.kill(int(os.environ["TRAINWRIGHT_LAUNCHER_PID"]), signal.SIGKILL)  # the machine's agent
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


if __name__ == "__main__":
    main(Path(sys.argv[1]))
