"""The worker functions the Ray Train tests run (under ``ray.train.torch.TorchTrainer``, and the reference run on the
tests' own forked processes). Pickled by value for Ray's workers (``test_ray_train.py``)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch

EPOCHS, SAMPLES, BATCH = 3, 48, 4  # 6 batches per process per epoch


class _Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(8, 8) for _ in range(2)])
        self.head = torch.nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.tanh(block(x))
        return self.head(x)


def _module() -> Any:
    from trainer import TrainModule

    class Regression(TrainModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = _Model()

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.model(x), y)
            self.log("train_loss", loss, on_epoch=True)
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-2)

    torch.manual_seed(0)
    return Regression()


def _loader() -> torch.utils.data.DataLoader:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(SAMPLES, 8, generator=generator)
    data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True).sin())
    return torch.utils.data.DataLoader(data, batch_size=BATCH, shuffle=True)


def _wait_for_registered_checkpoint(snapshot: Path | None, limit: float = 120.0) -> None:
    """Until Ray's controller has registered a reported checkpoint (it polls the workers every 2 s and then writes
    its snapshot): a worker that dies before that loses the report, by Ray's design, and is resumed from an earlier
    one."""
    deadline = time.monotonic() + limit
    while snapshot is not None and time.monotonic() < deadline:
        if snapshot.exists() and "checkpoint_" in snapshot.read_text():
            return
        time.sleep(0.2)
    raise RuntimeError(f"Ray registered no checkpoint within {limit} s ({snapshot})")


def _recorder(folder: str, attempt: str, kill_at: tuple[int, int] | None, registry: Path | None = None) -> Any:
    from callbacks import Callback

    class Record(Callback):
        """Each step's loss, per process; with `kill_at` (epoch, batch), process 1 SIGKILLs itself there."""

        def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
            if kill_at == (trainer.current_epoch, batch_idx) and trainer.global_rank == 1:
                _wait_for_registered_checkpoint(registry)
                Path(folder, "killed").write_text(str(trainer.global_step))
                os.kill(os.getpid(), signal.SIGKILL)

        def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            loss = outputs["loss"] if isinstance(outputs, dict) else outputs
            with open(Path(folder, f"losses-{attempt}-{trainer.global_rank}.jsonl"), "a", encoding="utf-8") as file:
                file.write(json.dumps([trainer.global_step, float(loss)]) + "\n")

    return Record()


def fit_job(config: dict[str, Any]) -> dict[str, Any]:
    """The Trainer face: FSDP on 2 processes, a RayTrainReportCallback checkpoint per epoch; under Ray, resumed from
    ``ray.train.get_checkpoint()`` after a restart. Outside Ray (``config["ray"]`` False): the uninterrupted run."""
    from strategies.environment import detect_environment
    from trainer import Trainer

    folder = config["folder"]
    kill_at = config.get("kill_at")
    checkpoint = None
    extra = []
    if config["ray"]:
        import ray.train

        from callbacks import RayTrainReportCallback

        extra.append(RayTrainReportCallback(checkpoint_dir=Path(folder, "scratch")))
        checkpoint = ray.train.get_checkpoint()
        if checkpoint is not None:
            kill_at = None  # the restarted run goes to the end
        elif Path(folder, "killed").exists():
            raise RuntimeError("restarted without a checkpoint")
    snapshot = Path(config["storage"], config["name"], "checkpoint_manager_snapshot.json") if config["ray"] else None
    callbacks = [_recorder(folder, "ray" if config["ray"] else "reference", kill_at, snapshot), *extra]
    trainer = Trainer(strategy="fsdp", accelerator="cpu", max_epochs=EPOCHS, callbacks=callbacks, process_group_timeout=60,
                      enable_progress_bar=False, enable_checkpointing=False, logger=False,
                      default_root_dir=Path(folder, "root"), num_sanity_val_steps=0, enable_model_summary=False)
    cluster = detect_environment()
    environment = {"source": cluster.source, "node_rank": cluster.node_rank, "device": str(trainer.strategy.device),
                   "assigned": cluster.device, "rank": cluster.rank, "world_size": cluster.world_size}
    Path(folder, f"environment-{cluster.rank}.json").write_text(json.dumps(environment))
    with checkpoint.as_directory() if checkpoint is not None else contextlib.nullcontext() as ckpt_path:
        if ckpt_path is not None:
            Path(folder, f"resumed-{cluster.rank}").write_text(json.dumps(sorted(os.listdir(ckpt_path))))
        trainer.fit(_module(), _loader(), ckpt_path=ckpt_path)
    return environment


def hang_job(config: dict[str, Any]) -> None:
    """The Accelerator face in Ray's process group: one step, ``save_state`` and `report_checkpoint` (the recipe of
    docs/ray.md); then process 1 hangs before a collective, and process 0's collective fails after the run's timeout
    and its report (``TRAINWRIGHT_FAULT_DIR``) names process 1."""
    from callbacks.ray_train import report_checkpoint
    from strategies.process_group import collective_failures_reported
    from trainer import Accelerator

    os.environ["TRAINWRIGHT_FAULT_DIR"] = config["folder"]
    accelerator = Accelerator(cpu=True, process_group_timeout=config["timeout"])
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    with collective_failures_reported():
        accelerator.backward(model(torch.ones(2, 4)).sum())
        optimizer.step()
        path = Path(config["folder"], "scratch", "epoch=0")  # the Accelerator face's recipe (docs/ray.md)
        accelerator.save_state(path)
        report_checkpoint(path, {"epoch": 0}, remove=True)
        total = accelerator.reduce(torch.ones(1), "sum")
        assert float(total) == 2.0
        if accelerator.process_index == 1:
            time.sleep(600)  # hung (Ray ends this process when the group fails)
        Path(config["folder"], "entered").write_text(str(time.time()))
        accelerator.reduce(torch.ones(1), "sum")
