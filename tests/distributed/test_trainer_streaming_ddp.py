"""Streaming data in the Trainer on 2 real gloo processes: the stream is split (every sample once per epoch),
evaluated once per sample, and a mid-epoch resume is bit-exact. One 2-process start-up (60 s process-group timeout,
outer timeout)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.multiprocess import run_distributed
from tests.unit.test_trainer_streaming import StreamNet, resume_run, stream_loader
from trainer import Trainer

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]


def _weights(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in module.state_dict().items()}


def _stream_checks(root: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    trainer = Trainer(strategy="ddp", devices=2, max_epochs=2, log_with=None, project_dir=root, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0, process_group_timeout=60, seed=3)
    module = StreamNet()
    # 24 samples, 4 per process per batch: 3 batches on each process per epoch; 7 validation samples: 4 + 3 per process
    trainer.fit(module, stream_loader(24), stream_loader(7))
    out["fit"] = (trainer.world_size, trainer.num_training_batches, trainer.global_step, trainer.current_epoch)
    out["seen"] = module.seen
    out["val_count"] = float(trainer.callback_metrics["val_count"])
    out["weights"] = _weights(module)
    out["validate"] = trainer.validate(module, stream_loader(7), verbose=False)[0]["val_count"]
    out["predict"] = torch.cat(trainer.predict(module, stream_loader(10, shuffle=False))).tolist()
    # exact resume: 5 steps straight, or 3, a checkpoint, and a new Trainer resuming from it
    straight, _, _ = resume_run(Path(root, "straight"), 5, stop_step=5, process_group_timeout=60)
    first, _, _ = resume_run(Path(root, "run"), 3, stop_step=3, process_group_timeout=60)
    resumed, resumed_trainer, _ = resume_run(Path(root, "run"), 5, stop_step=3, ckpt_path="last", init_seed=99, process_group_timeout=60)
    out["resume"] = {
        "step": resumed_trainer.global_step, "straight": _weights(straight), "resumed": _weights(resumed),
        "losses": (straight.losses, {**first.losses, **resumed.losses}), "overlap": sorted(set(first.losses) & set(resumed.losses)),
        "seen": (straight.seen, {e: first.seen.get(e, []) + resumed.seen.get(e, []) for e in straight.seen}),
    }
    return out


def test_a_stream_is_split_across_two_processes(tmp_path: Path) -> None:
    ranks = run_distributed(_stream_checks, str(tmp_path), nprocs=2, timeout=240)
    for rank, out in enumerate(ranks):
        assert out["fit"] == (2, float("inf"), 6, 2)
        assert [len(out["seen"][epoch]) for epoch in (0, 1)] == [12, 12]
        assert out["val_count"] == out["validate"] == 7.0  # every validation sample once (no padding in evaluation)
        assert out["predict"] == list(range(10))  # both processes' predictions, in stream order
        resume = out["resume"]
        assert resume["step"] == 5
        assert [k for k, v in resume["straight"].items() if not torch.equal(v, resume["resumed"][k])] == [], f"rank {rank}"
        assert resume["losses"][0] == resume["losses"][1] and resume["overlap"] == []
        assert resume["seen"][0] == resume["seen"][1]  # the resumed stream continued where the checkpoint was
    for epoch in (0, 1):  # the two processes' shares: every sample exactly once per epoch
        assert sorted(ranks[0]["seen"][epoch] + ranks[1]["seen"][epoch]) == list(range(24))
    assert ranks[0]["seen"][0] != ranks[0]["seen"][1]  # a new order each epoch (set_epoch reached the data set)
    assert all(torch.equal(v, ranks[1]["weights"][k]) for k, v in ranks[0]["weights"].items())  # one model (DDP)
    assert ranks[0]["resume"]["losses"][0] != ranks[1]["resume"]["losses"][0]  # the ranks trained on different shares
