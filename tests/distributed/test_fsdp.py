"""FSDP2 on 2 real processes (gloo, CPU), through both faces, against single-process full-batch training."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tests.helpers.multiprocess import run_distributed

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]

STEPS, GLOBAL_BATCH = 6, 16


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.lin(x))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 16)
        self.blocks = nn.Sequential(Block(16), Block(16))
        self.out = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.blocks(self.inp(x)))


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return torch.randn(STEPS * GLOBAL_BATCH, 4, generator=g), torch.randn(STEPS * GLOBAL_BATCH, 1, generator=g)


def _net() -> Net:
    torch.manual_seed(0)
    return Net()


def _reference(clip: float | None = None) -> tuple[dict[str, torch.Tensor], list[float]]:
    """Single process, full global batches: what the 2-process runs must reproduce."""
    x, y = _data()
    model = _net()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    norms = []
    for i in range(0, len(x), GLOBAL_BATCH):
        nn.functional.mse_loss(model(x[i : i + GLOBAL_BATCH]), y[i : i + GLOBAL_BATCH]).backward()
        if clip is not None:
            norms.append(float(nn.utils.clip_grad_norm_(model.parameters(), clip)))
        opt.step()
        opt.zero_grad()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, norms


def _accelerator_run(strategy: str, clip: float | None, precision: str = "no", accumulate: int = 1):
    from trainer import Accelerator

    acc = Accelerator(cpu=True, strategy=strategy, mixed_precision=precision, gradient_accumulation_steps=accumulate)
    x, y = _data()
    model = _net()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)  # built before prepare, as Accelerate scripts do
    loader = DataLoader(TensorDataset(x, y), batch_size=GLOBAL_BATCH // acc.num_processes // accumulate)
    model, opt, loader = acc.prepare(model, opt, loader)
    norms, losses = [], []
    for xb, yb in loader:
        with acc.accumulate(model):
            loss = nn.functional.mse_loss(model(xb), yb)
            acc.backward(loss)
            losses.append(float(acc.reduce(loss.detach(), "mean")))
            if acc.sync_gradients and clip is not None:
                norms.append(float(acc.clip_grad_norm_(model.parameters(), clip)))
            opt.step()
            opt.zero_grad()
    state = acc.get_state_dict(model)
    acc.end_training()
    sharded = type(next(model.parameters())).__name__
    return {"state": {k: v.clone() for k, v in state.items()}, "norms": norms, "losses": losses, "param_type": sharded}


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def test_accelerator_fsdp_matches_single_process_and_ddp() -> None:
    reference, ref_norms = _reference(clip=0.5)
    fsdp = run_distributed(_accelerator_run, "fsdp", 0.5)
    assert fsdp[0]["param_type"] == "DTensor"  # really sharded
    assert fsdp[1]["state"] == {}  # full weights land on rank 0 only
    assert _max_diff(fsdp[0]["state"], reference) <= 1e-5
    # the clipping norm is the global one over both shards, not a shard's own
    assert fsdp[0]["norms"] == fsdp[1]["norms"]
    assert max(abs(a - b) for a, b in zip(fsdp[0]["norms"], ref_norms)) <= 1e-5
    ddp = run_distributed(_accelerator_run, "ddp", 0.5)
    assert _max_diff(ddp[0]["state"], fsdp[0]["state"]) <= 1e-5


def test_accelerator_fsdp_gradient_accumulation_matches_single_process() -> None:
    reference, _ = _reference()
    fsdp = run_distributed(_accelerator_run, "fsdp", None, "no", 2)
    assert _max_diff(fsdp[0]["state"], reference) <= 1e-5


def test_accelerator_fsdp_bf16_policy_is_close_by_loss() -> None:
    fp32 = run_distributed(_accelerator_run, "fsdp", None)
    bf16 = run_distributed(_accelerator_run, "fsdp", None, "bf16")
    assert bf16[0]["state"]["inp.weight"].dtype == torch.float32  # parameters stay fp32; only compute is bf16
    assert bf16[0]["losses"] != fp32[0]["losses"]  # bf16 really ran
    assert max(abs(a - b) for a, b in zip(bf16[0]["losses"], fp32[0]["losses"])) <= 0.05 * max(fp32[0]["losses"])


def _trainer_run(strategy: str, tmp: str):
    from strategies import FSDPStrategy
    from trainer import Trainer, TrainModule

    class Regressor(TrainModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _net()

        def training_step(self, batch, batch_idx):
            xb, yb = batch
            return nn.functional.mse_loss(self.net.out(self.net.blocks(self.net.inp(xb))), yb)  # submodules, not self(x)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=0.01)

    x, y = _data()
    chosen = FSDPStrategy(cpu=True, wrap_classes=[Block]) if strategy == "fsdp" else strategy
    trainer = Trainer(strategy=chosen, max_epochs=1, project_dir=tmp, log_with=None, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False)
    module = Regressor()
    trainer.fit(module, DataLoader(TensorDataset(x, y), batch_size=GLOBAL_BATCH // 2))
    from strategies.base import user_class

    state = trainer.strategy.module_state_dict(module)
    assert type(module).__name__ == "FSDPRegressor" and user_class(module) is Regressor  # trackers and summaries name the user's class
    return {k.removeprefix("net."): v.clone() for k, v in state.items()}


def test_trainer_fsdp_matches_single_process(tmp_path) -> None:
    reference, _ = _reference()
    states = run_distributed(_trainer_run, "fsdp", str(tmp_path))
    assert _max_diff(states[0], reference) <= 1e-5


def test_fsdp1_is_refused_naming_fsdp2() -> None:
    from strategies import resolve_strategy

    with pytest.raises(NotImplementedError, match=r"FSDP1 .* is not supported; strategy='fsdp' shards with FSDP2"):
        resolve_strategy("fsdp1")


def _train_save_continue(root: str, load: bool):
    """3 steps (or a load of them), save_state, 3 more steps; also export the weights with save_model."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    from trainer import Accelerator

    acc = Accelerator(cpu=True, strategy="fsdp")
    x, y = _data()
    torch.manual_seed(5 if load else 0)  # a resumed run starts from other weights, which load_state replaces
    model = Net()
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    loader = DataLoader(TensorDataset(x, y), batch_size=GLOBAL_BATCH // 2, shuffle=True)
    model, opt, loader = acc.prepare(model, opt, loader)
    batches = iter(loader)

    def steps(n: int) -> None:
        for _ in range(n):
            xb, yb = next(batches)
            acc.backward(nn.functional.mse_loss(model(xb), yb))
            opt.step()
            opt.zero_grad()

    out: dict[str, object] = {}
    if load:
        acc.load_state(f"{root}/state")
        batches = iter(loader)  # the restored loader resumes after the batches already seen
    else:
        steps(3)
        acc.save_state(f"{root}/state")
        out["saved_weights"] = {k: v.clone() for k, v in acc.get_state_dict(model).items()}
        full_opt = get_optimizer_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        out["saved_exp_avg"] = {k: v["exp_avg"].clone() for k, v in full_opt.get("state", {}).items()}
    steps(3)
    out["final"] = {k: v.clone() for k, v in acc.get_state_dict(model).items()}
    acc.save_model(model, f"{root}/export{int(load)}", max_shard_size="1KB")
    acc.end_training()
    return out


def test_fsdp_sharded_checkpoint_resumes_bitwise_and_loads_on_one_process(tmp_path) -> None:
    from safetensors.torch import load_file

    from strategies.checkpoint_io import read_json
    from trainer import Accelerator

    first = run_distributed(_train_save_continue, str(tmp_path), False)
    state = tmp_path / "state"
    files = {p.name for p in (state / "sharded").iterdir()}
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata"} <= files  # one shard file per process
    assert not (state / "model.safetensors").exists() and not (state / "optimizer.bin").exists()
    resumed = run_distributed(_train_save_continue, str(tmp_path), True)
    want, got = first[0]["final"], resumed[0]["final"]
    assert want.keys() == got.keys() and [k for k in want if not torch.equal(want[k], got[k])] == []

    # export: full, unsharded safetensors (sharded by size, with an index) that a plain model loads
    index = read_json(tmp_path / "export0" / "model.safetensors.index.json")
    export = {}
    for name in set(index["weight_map"].values()):
        export.update(load_file(str(tmp_path / "export0" / name)))
    plain = Net()
    plain.load_state_dict(export)
    assert all(torch.equal(plain.state_dict()[k], want[k]) for k in want)

    # 2 -> 1 process: DCP reshards the 2-process shards into one plain process without a process group
    acc = Accelerator(cpu=True)
    model = Net()
    model, opt = acc.prepare(model, torch.optim.AdamW(model.parameters(), lr=0.01))
    acc.load_state(str(state))  # (no warning: the loader positions are global, the RNG states derived; docs/elastic.md)
    saved = first[0]["saved_weights"]
    assert [k for k in saved if not torch.equal(model.state_dict()[k], saved[k])] == []
    names = [name for name, _ in model.named_parameters()]
    exp_avg = {names[i]: s["exp_avg"] for i, s in opt.state_dict()["state"].items()}
    assert exp_avg.keys() == first[0]["saved_exp_avg"].keys()
    assert all(torch.equal(exp_avg[k], first[0]["saved_exp_avg"][k]) for k in exp_avg)


def _uneven_validation(tmp: str):
    from trainer import Trainer, TrainModule

    class Scored(TrainModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = _net()

        def validation_step(self, batch, batch_idx):
            xb, yb = batch
            self.log("val_sum", nn.functional.mse_loss(self(xb), yb, reduction="sum"), reduce_fx="sum", sync_dist=True)
            self.log("val_count", float(len(xb)), reduce_fx="sum", sync_dist=True)

        def forward(self, x):
            return self.net(x)

    x, y = _data()
    trainer = Trainer(strategy="fsdp", project_dir=tmp, log_with=None, enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=False)
    module = Scored()
    metrics = trainer.validate(module, DataLoader(TensorDataset(x[:5], y[:5]), batch_size=2))  # 3 batches: 2 on rank 0, 1 on rank 1
    full = trainer.strategy.module_state_dict(module)
    return {"metrics": metrics[0], "sharded_after": type(next(module.parameters())).__name__, "full": full}


def test_trainer_fsdp_validation_with_unequal_batches_counts_each_sample_once(tmp_path) -> None:
    results = run_distributed(_uneven_validation, str(tmp_path), timeout=90)
    x, y = _data()
    model = _net()
    want = nn.functional.mse_loss(model(x[:5]), y[:5], reduction="sum").item()
    for r in results:
        assert r["metrics"]["val_count"] == 5.0
        assert abs(r["metrics"]["val_sum"] - want) <= 1e-4
        assert r["sharded_after"] == "DTensor"
