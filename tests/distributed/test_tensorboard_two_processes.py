"""A dict value logged through the Accelerator on 2 processes: process 0 writes Accelerate's TensorBoard layout
(``add_scalars``: sub-run folders ``<run>/<key>_<subkey>/``, tag ``<key>``), process 1 writes nothing."""

from __future__ import annotations

import importlib.util

import pytest

from tests.helpers.multiprocess import run_distributed

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300),
              pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason="tensorboard is not installed")]

LOGGED = [({"squad": {"exact_match": 62.5, "f1": 70.25}, "train_loss": 1.5}, 3),
          ({"squad": {"exact_match": 75.0, "f1": 80.5}, "train_loss": 0.75}, 6)]


def _log(root: str) -> int:
    import torch

    from trainer import Accelerator

    accelerator = Accelerator(log_with="tensorboard", project_dir=root, cpu=True)
    accelerator.init_trackers("qa_no_trainer")
    for values, step in LOGGED:
        squad = {k: torch.tensor(v) for k, v in values["squad"].items()}  # as evaluate's metrics may come back
        accelerator.log({**values, "squad": squad}, step=step)
    accelerator.end_training()
    return accelerator.process_index


def test_two_processes_write_accelerates_layout_once(tmp_path):
    from tests.helpers.tensorboard_events import scalars_by_folder, write_as_accelerate

    assert run_distributed(_log, str(tmp_path / "ours"), nprocs=2) == [0, 1]
    write_as_accelerate(tmp_path / "accelerate" / "qa_no_trainer", LOGGED)
    ours = scalars_by_folder(tmp_path / "ours")
    assert set(ours) == {"qa_no_trainer", "qa_no_trainer/squad_exact_match", "qa_no_trainer/squad_f1"}
    assert ours == {f"qa_no_trainer/{k}" if k != "." else "qa_no_trainer": v
                    for k, v in scalars_by_folder(tmp_path / "accelerate" / "qa_no_trainer").items()}
    assert ours["qa_no_trainer/squad_f1"] == {"squad": [(3, 70.25), (6, 80.5)]}
