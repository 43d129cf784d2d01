"""DeepSpeed with the optimizer and schedule its config describes (Accelerate's DummyOptim / DummyScheduler), on 2 real
processes (gloo, CPU): the stand-ins fill the config's "auto" entries, the engine builds AdamW and WarmupLR and steps
the schedule itself, and training matches single-process AdamW on the global batches with the same learning rates.
``accelerator.state.deepspeed_plugin.deepspeed_config`` is the running config, as Accelerate's examples read it."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tests.distributed.test_fsdp import GLOBAL_BATCH, _data, _max_diff, _net
from tests.helpers.multiprocess import run_distributed

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(420),  # (not imported to collect: importing deepspeed takes seconds)
              pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                 reason="the deepspeed extra is not installed: pip install -e '.[deepspeed]'")]

LR, WEIGHT_DECAY, WARMUP = 0.01, 0.1, 3
CONFIG = {
    "zero_optimization": {"stage": 2},
    # torch_adam: torch's AdamW, so no DeepSpeed Adam op is compiled on this CPU machine
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto", "torch_adam": True}},
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto",
                                                 "warmup_type": "linear"}},
}


def _run() -> dict:
    from trainer import Accelerator
    from trainer.utils import DeepSpeedPlugin, DummyOptim, DummyScheduler

    acc = Accelerator(cpu=True, deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=CONFIG))
    config = acc.state.deepspeed_plugin.deepspeed_config
    chosen = DummyOptim if "optimizer" in config else torch.optim.AdamW  # Accelerate's examples decide this way
    x, y = _data()
    model = _net()
    optimizer = chosen(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    scheduler = DummyScheduler(optimizer, warmup_num_steps=WARMUP)
    loader = DataLoader(TensorDataset(x, y), batch_size=GLOBAL_BATCH // acc.num_processes)
    model, optimizer, loader, scheduler = acc.prepare(model, optimizer, loader, scheduler)
    lrs = []
    for xb, yb in loader:
        lrs.append(optimizer.param_groups[0]["lr"])  # the rate this step uses
        acc.backward(nn.functional.mse_loss(model(xb), yb))
        optimizer.step()
        scheduler.step()  # the engine stepped the schedule already: nothing happens here
        optimizer.zero_grad()
    state = {k: v.clone() for k, v in acc.get_state_dict(model).items()}
    out = {"chosen": chosen.__name__, "filled": {"optimizer": config["optimizer"]["params"], "scheduler": config["scheduler"]["params"]},
           "lrs": lrs, "last_lr": scheduler.get_last_lr(), "state": state, "optimizer": type(optimizer.optimizer).__name__}
    acc.end_training()
    return out


def _reference(lrs: list[float]) -> dict[str, torch.Tensor]:
    x, y = _data()
    model = _net()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    for step, i in enumerate(range(0, len(x), GLOBAL_BATCH)):
        for group in opt.param_groups:
            group["lr"] = lrs[step]
        opt.zero_grad()
        nn.functional.mse_loss(model(x[i:i + GLOBAL_BATCH]), y[i:i + GLOBAL_BATCH]).backward()
        opt.step()
    return model.state_dict()


def test_dummy_optimizer_and_scheduler_come_from_the_deepspeed_config() -> None:
    results = run_distributed(_run, nprocs=2, timeout=400)
    for out in results:
        assert out["chosen"] == "DummyOptim"
        assert out["filled"]["optimizer"] == {"lr": LR, "weight_decay": WEIGHT_DECAY, "torch_adam": True}
        assert out["filled"]["scheduler"] == {"warmup_min_lr": 0, "warmup_max_lr": LR, "warmup_num_steps": WARMUP, "warmup_type": "linear"}
        lrs = out["lrs"]
        assert lrs[0] < LR and lrs == sorted(lrs) and lrs[-1] == pytest.approx(LR), lrs  # warmed up by the engine
        assert out["last_lr"][0] == pytest.approx(LR)
    assert results[0]["lrs"] == results[1]["lrs"]
    reference = _reference(results[0]["lrs"])
    assert _max_diff(results[0]["state"], reference) < 2e-5
    assert _max_diff(results[0]["state"], results[1]["state"]) == 0
