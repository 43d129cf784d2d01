"""`EMAWeightAveraging` on 2 DDP processes (real gloo): the average equals a hand-computed EMA on each rank, is the
same on both, and a run stopped at a checkpoint and resumed continues it bit for bit (process 0 writes it, both read it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.multiprocess import run_distributed

TOTAL_STEPS, STOP, DECAY = 8, 4, 0.75


def _fit_on_each_rank(root: str, max_steps: int, ckpt_path: str | None, every: int | None, init_seed: int) -> dict[str, Any]:
    from callbacks.weight_averaging import EMAWeightAveraging
    from tests.unit.test_checkpoint_resume import run_fit
    from tests.unit.test_weight_averaging import StepWeights, hand_ema

    ema, record = EMAWeightAveraging(decay=DECAY), StepWeights()
    module, trainer, _ = run_fit(Path(root), max_steps, ckpt_path=ckpt_path, every_n_train_steps=every, init_seed=init_seed,
                                 extra_callbacks=(ema, record), validate_every=3, process_group_timeout=60)
    assert trainer.world_size == 2 and ema.average_model is not None
    expected = hand_ema(record.after_step, DECAY)[-1] if ckpt_path is None else None
    return {
        "average": {k: v.detach().cpu().clone() for k, v in ema.average_model.state_dict().items()},
        "weights": {k: v.detach().cpu().clone() for k, v in module.state_dict().items()},
        "expected": expected,
        "losses": module.losses,
    }


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.timeout(300)
def test_ddp_ema_is_hand_computed_and_resumes_bit_exactly(tmp_path: Path) -> None:
    straight = run_distributed(_fit_on_each_rank, str(tmp_path / "straight"), TOTAL_STEPS, None, None, 1)
    run_distributed(_fit_on_each_rank, str(tmp_path / "run"), STOP, None, STOP, 1)
    ckpt = next((tmp_path / "run" / "ckpts").iterdir())
    assert (ckpt / "averaged_model.bin").is_file()
    resumed = run_distributed(_fit_on_each_rank, str(tmp_path / "run"), TOTAL_STEPS, "last", STOP, 99)
    for rank in range(2):
        got = {k[len("module."):]: v for k, v in straight[rank]["average"].items() if k.startswith("module.")}
        assert _equal(got, straight[rank]["expected"]), f"rank {rank}: the average is not the hand-computed EMA"
        assert int(straight[rank]["average"]["n_averaged"]) == TOTAL_STEPS
        assert _equal(resumed[rank]["average"], straight[rank]["average"]), f"rank {rank}: the average differs after resume"
        assert _equal(resumed[rank]["weights"], straight[rank]["weights"])
    assert _equal(straight[0]["average"], straight[1]["average"])  # replicated weights, one average
    assert straight[0]["losses"] != straight[1]["losses"]  # the ranks saw different shards
