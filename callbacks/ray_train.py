"""Running on Ray Train: a checkpoint per epoch reported to Ray, and the resume from what Ray gives back.

    def train_func(config):                     # the worker function of ray.train.torch.TorchTrainer
        trainer = Trainer(strategy="fsdp", max_epochs=5, callbacks=[RayTrainReportCallback()])
        checkpoint = ray.train.get_checkpoint()  # after Ray restarted the workers: the last one reported
        with checkpoint.as_directory() if checkpoint else contextlib.nullcontext() as ckpt_path:
            trainer.fit(module, loader, ckpt_path=ckpt_path)

`RayTrainReportCallback` is the Trainer's counterpart of Ray's Lightning callback of that name: at the end of every
training epoch it writes a Trainwright checkpoint (the hashed manifest, sharded states as each process's own files)
and every process reports, with ``ray.train.report``, the metrics and a directory of the files it wrote itself, so
Ray's storage assembles the whole checkpoint (sharded ones included) from every process's part. `report_checkpoint`
does the same for any checkpoint directory (the Accelerator face: ``accelerator.save_state(path)``, then
``report_checkpoint(path, metrics)``). Ray is imported only when a report is made.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from callbacks.base import Callback
from strategies.checkpoint_io import MANIFEST_NAME, read_manifest
from strategies.environment import is_ray_train_worker

if TYPE_CHECKING:
    from callbacks.view import TrainerView
    from trainer.fit.module import TrainModule

# files a process writes for itself (its RNG states, its DCP shards); every other file of a checkpoint is process 0's
_OWN_FILE = re.compile(r"(?:^|/)(?:random_states_(\d+)\.safetensors|__(\d+)_\d+\.distcp)$")


def files_of_process(directory: str | os.PathLike[str], rank: int) -> list[str]:
    """The files of the checkpoint `directory` that process `rank` wrote (relative paths, from its manifest):
    its RNG states and its shards; process 0 also every file no process wrote for itself, the manifest included."""
    names = [*read_manifest(directory).get("files", {}), MANIFEST_NAME]
    mine = []
    for name in names:
        owner = _OWN_FILE.search(name)
        owner_rank = int(next(group for group in owner.groups() if group is not None)) if owner else 0
        if owner_rank == rank:
            mine.append(name)
    return mine


def report_checkpoint(directory: str | os.PathLike[str], metrics: Mapping[str, Any], *, remove: bool = False) -> None:
    """Report `metrics` and this process's part of the checkpoint `directory` (complete: written by
    ``Trainer.save_checkpoint`` or ``Accelerator.save_state``) with ``ray.train.report``. Every process must call it.

    This process's files are linked (copied across filesystems) into a directory of their own, which Ray persists to
    its storage (where every process's part joins the others'), then removed; with `remove`, process 0 also removes
    `directory` once every process has linked its files.
    """
    import torch.distributed as dist

    train = _ray_train()
    rank = dist.get_rank() if dist.is_initialized() else 0
    directory = Path(directory)
    part = directory.parent / f".{directory.name}.ray-part-{rank}"
    shutil.rmtree(part, ignore_errors=True)
    for name in files_of_process(directory, rank):
        target = part / name
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(directory / name, target)
        except OSError:
            shutil.copy2(directory / name, target)
    part.mkdir(exist_ok=True)
    if dist.is_initialized():
        dist.barrier()  # every process has its files before the checkpoint directory may go
    if remove and rank == 0:
        shutil.rmtree(directory, ignore_errors=True)
    try:
        train.report(dict(metrics), checkpoint=train.Checkpoint.from_directory(str(part)))
    finally:
        shutil.rmtree(part, ignore_errors=True)


def _ray_train() -> Any:
    try:
        import ray.train
    except ModuleNotFoundError as err:
        if err.name is not None and err.name.split(".")[0] != "ray":
            raise
        raise ModuleNotFoundError(
            "RayTrainReportCallback and report_checkpoint report to Ray Train, which is not installed: "
            "pip install 'trainwright[ray]' (or pip install 'ray[train]')", name="ray",
        ) from err
    return ray.train


class RayTrainReportCallback(Callback):
    """Report a checkpoint and the metrics to Ray Train at the end of every training epoch (Ray's Lightning callback's
    name and schedule), from every process, each with the files it wrote (`report_checkpoint`).

    The metrics are the trainer's ``callback_metrics`` that are numbers, with ``epoch`` and ``step``. After Ray
    restarts the workers (``RunConfig(failure_config=FailureConfig(max_failures=...))``), ``ray.train.get_checkpoint()``
    is the last checkpoint reported, and ``trainer.fit(..., ckpt_path=<its directory>)`` resumes it exactly (the
    Trainer's checkpoints hold the data position, RNG states and every file's hash).

    Args:
        checkpoint_dir: where each epoch's checkpoint is written before Ray persists it (each is removed after its
            report). Every process must see the same directory: on one machine the default, a folder under the
            temporary directory named after the Ray run, does; with several machines pass a directory on a
            filesystem they share (a ValueError says so otherwise).
    """

    def __init__(self, checkpoint_dir: str | os.PathLike[str] | None = None) -> None:
        self.checkpoint_dir = None if checkpoint_dir is None else Path(checkpoint_dir)

    def on_fit_start(self, trainer: TrainerView, module: TrainModule) -> None:
        train = _ray_train()
        if not is_ray_train_worker():
            raise RuntimeError(
                "RayTrainReportCallback reports to Ray Train, so it runs inside the worker function of a "
                "ray.train.torch.TorchTrainer; this process is not a Ray Train worker (no RAY_RAYLET_PID/NODE_RANK). "
                "Outside Ray, checkpoint with ModelCheckpoint"
            )
        context = train.get_context()
        if self.checkpoint_dir is None:
            if context.get_world_size() > context.get_local_world_size():
                raise ValueError(
                    "RayTrainReportCallback() on several machines needs checkpoint_dir= on a filesystem every machine "
                    "shares (the checkpoint of a sharded run is written by every process into one directory); pass "
                    "RayTrainReportCallback(checkpoint_dir='/shared/scratch/run')"
                )
            self.checkpoint_dir = Path(tempfile.gettempdir()) / "trainwright-ray" / context.get_experiment_name()

    def on_train_epoch_end(self, trainer: TrainerView, module: TrainModule) -> None:
        if self.checkpoint_dir is None:
            raise RuntimeError("RayTrainReportCallback: on_train_epoch_end ran before on_fit_start")
        path = self.checkpoint_dir / f"epoch={trainer.current_epoch}-step={trainer.global_step}"
        trainer.save_checkpoint(path, async_save=False)
        metrics = {name: float(value) for name, value in trainer.callback_metrics.items() if _is_number(value)}
        metrics.update(epoch=trainer.current_epoch, step=trainer.global_step)
        report_checkpoint(path, metrics, remove=True)


def _is_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, (int, float)):
        return True
    numel = getattr(value, "numel", None)
    return callable(numel) and numel() == 1
