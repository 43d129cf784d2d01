"""Reading TensorBoard event files back, folder by folder (a dict value's ``add_scalars`` writes sub-run folders)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def scalars_by_folder(root: Path) -> dict[str, dict[str, list[tuple[int, Any]]]]:
    """{sub-run folder (relative to `root`): {tag: [(step, value), ...]}} of every event file under `root`."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = {}
    for folder in sorted({path.parent for path in Path(root).rglob("events.out.tfevents.*")}):
        events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
        events.Reload()
        out[str(folder.relative_to(root))] = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    return out


def write_as_accelerate(folder: Path, logged: list[tuple[dict[str, Any], int]]) -> None:
    """What Accelerate's TensorBoardTracker.log calls on a SummaryWriter of the run `folder`, for each (values, step):
    ``add_scalar`` for a number, ``add_scalars`` for a dict of numbers."""
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(folder))
    for values, step in logged:
        for key, value in values.items():
            if isinstance(value, dict):
                writer.add_scalars(key, {k: float(v) for k, v in value.items()}, global_step=step)
            else:
                writer.add_scalar(key, float(value), global_step=step)
    writer.close()
