"""Bit-exact resume of a 2-process DDP `Trainer` run (real gloo processes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.multiprocess import run_distributed
from tests.unit.test_checkpoint_resume import run_fit

TOTAL_STEPS = 8  # 5 batches per process per epoch, accumulating 2: 3 steps per epoch


def _fit_on_each_rank(root: str, max_steps: int, ckpt_path: str | None, every: int | None, init_seed: int) -> dict[str, Any]:
    module, trainer, recorder = run_fit(
        Path(root), max_steps, ckpt_path=ckpt_path, every_n_train_steps=every, init_seed=init_seed, process_group_timeout=60
    )
    assert trainer.world_size == 2
    return {
        "weights": {k: v.detach().cpu().clone() for k, v in module.state_dict().items()},
        "losses": module.losses,
        "logged": recorder.logged,
        "step": trainer.global_step,
        "checkpoints": sorted(p.name for p in (Path(root) / "ckpts").iterdir()) if every else [],
    }


@pytest.mark.timeout(300)
def test_ddp_resume_is_bit_exact(tmp_path: Path) -> None:
    straight = run_distributed(_fit_on_each_rank, str(tmp_path / "straight"), TOTAL_STEPS, None, None, 1)
    first = run_distributed(_fit_on_each_rank, str(tmp_path / "run"), 4, None, 4, 1)
    assert first[0]["checkpoints"] == ["epoch=1-step=4"]  # no save_last: no last pointer; "last" finds the newest
    ckpt = tmp_path / "run" / "ckpts" / "epoch=1-step=4"
    assert {"random_states_0.safetensors", "random_states_1.safetensors"} <= {p.name for p in ckpt.iterdir()}
    resumed = run_distributed(_fit_on_each_rank, str(tmp_path / "run"), TOTAL_STEPS, "last", 4, 99)
    for rank in range(2):
        assert resumed[rank]["step"] == straight[rank]["step"] == TOTAL_STEPS
        want, got = straight[rank]["weights"], resumed[rank]["weights"]
        assert [k for k in want if not torch.equal(want[k], got[k])] == [], f"rank {rank}: weights differ after resume"
        assert {**first[rank]["losses"], **resumed[rank]["losses"]} == straight[rank]["losses"]
        assert {**first[rank]["logged"], **resumed[rank]["logged"]} == straight[rank]["logged"]
    assert straight[0]["losses"] != straight[1]["losses"]  # the ranks saw different shards


def _top_k_on_each_rank(root: str) -> dict[str, Any]:
    from callbacks.checkpoint import ModelCheckpoint
    from callbacks.early_stopping import EarlyStopping
    from tests.unit.test_checkpoint_callback import ScriptedNet, fit

    cb = ModelCheckpoint(dirpath=Path(root) / "ck", filename="{epoch}-{val_loss:.1f}", monitor="val_loss", save_top_k=2)
    es = EarlyStopping("val_loss", patience=1)
    trainer = fit(Path(root), [cb, es], module=ScriptedNet((5.0, 3.0, 4.0, 1.0, 2.0)), process_group_timeout=60)
    return {"best_k": sorted(Path(p).name for p in cb.best_k_models), "best": Path(cb.best_model_path).name,
            "stopped_epoch": es.stopped_epoch, "epoch": trainer.current_epoch}


@pytest.mark.timeout(300)
def test_ddp_top_k_and_early_stopping_agree_across_ranks(tmp_path: Path) -> None:
    results = run_distributed(_top_k_on_each_rank, str(tmp_path))
    assert results[0] == results[1]
    assert results[0]["best_k"] == ["epoch=1-val_loss=3.0", "epoch=2-val_loss=4.0"]
    assert results[0]["stopped_epoch"] == 2  # 4.0 did not improve on 3.0, patience 1
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["epoch=1-val_loss=3.0", "epoch=2-val_loss=4.0"]
