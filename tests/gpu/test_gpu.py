"""The CUDA paths of both faces, ready for a GPU machine: ``bash tests/gpu/run.sh`` (or ``pytest -m gpu tests/gpu``).

Without CUDA every test is skipped, with that command as the reason; ``TRAINWRIGHT_GPU_TESTS_ON_CPU=1`` runs the
device-independent parts on CPU (gloo, bf16) so the tests' own logic is known to run (see ``conftest.py``).
Multi-process checks run real processes (``tests/helpers/multiprocess.py``), one per GPU.
"""

from __future__ import annotations

import importlib.util
import math
import statistics
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tests.gpu import workers
from tests.gpu.conftest import CPU, DEVICE, ENABLED, PROCS, SKIP_REASON, cuda_only, report, two_processes
from tests.helpers.multiprocess import run_distributed

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not ENABLED, reason=SKIP_REASON), pytest.mark.timeout(300)]

from callbacks.checkpoint import ModelCheckpoint  # noqa: E402
from trainer import Accelerator, Trainer, TrainModule  # noqa: E402
from trainer.utils import set_seed  # noqa: E402

ACCELERATOR = "cpu" if CPU else "gpu"  # the Trainer's name for DEVICE
QUIET: dict[str, Any] = dict(enable_progress_bar=False, enable_model_summary=False, log_with=None)


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert set(a) == set(b), (sorted(a), sorted(b))
    return max(float((a[k].float().cpu() - b[k].float().cpu()).abs().max()) for k in a)


def _cpu_state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


class Regressor(TrainModule):
    """A small regression module with dropout (so resuming must restore the device's random generator)."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 1))
        self.seen: list[tuple[str, str, str]] = []  # (batch device, parameter device, module.device)
        self.head_dtypes: set[torch.dtype] = set()
        self.net[3].register_forward_hook(lambda m, i, o: self.head_dtypes.add(o.dtype))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        self.seen.append((x.device.type, next(self.parameters()).device.type, self.device.type))
        return nn.functional.mse_loss(self.net(x).float(), y)

    def configure_optimizers(self) -> Any:
        opt = torch.optim.AdamW(self.parameters(), lr=1e-2)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)}


def _loader(shuffle: bool = True) -> DataLoader:
    x, y = workers.data()
    return DataLoader(TensorDataset(x, y), batch_size=8, shuffle=shuffle)


# --------------------------------------------------------------------------------------------- device placement
def test_accelerator_places_model_and_batches_on_the_device() -> None:
    acc = Accelerator(cpu=CPU)
    plain = workers.net()
    model, _, loader = acc.prepare(plain, torch.optim.SGD(plain.parameters(), lr=0.1), _loader())
    assert acc.device.type == DEVICE.type
    assert {p.device.type for p in model.parameters()} == {DEVICE.type}
    batches = list(loader)
    assert {t.device.type for batch in batches for t in batch} == {DEVICE.type}
    assert model(batches[0][0]).device.type == DEVICE.type
    acc.end_training()


def test_trainer_places_model_and_batches_on_the_device(tmp_path: Path) -> None:
    module = Regressor()
    trainer = Trainer(accelerator=ACCELERATOR, devices=1, max_epochs=1, project_dir=tmp_path, **QUIET)
    trainer.fit(module, _loader())
    assert module.seen and set(module.seen) == {(DEVICE.type,) * 3}, set(module.seen)
    assert trainer.strategy.device.type == DEVICE.type


# --------------------------------------------------------------------------------------------- mixed precision
def _linear_run(acc: Accelerator, steps: int = 8, poison: int | None = None) -> tuple[list[float], set[torch.dtype], list[bool], nn.Module]:
    """Train workers.net() under `acc`; at step `poison` the loss is multiplied by inf (fp16 must skip that step)."""
    model = workers.net()
    dtypes: set[torch.dtype] = set()
    model.head.register_forward_hook(lambda m, i, o: dtypes.add(o.dtype))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model, opt = acc.prepare(model, opt)
    x, y = (t.to(acc.device) for t in workers.data())
    losses, skipped = [], []
    for step in range(steps):
        loss = nn.functional.mse_loss(model(x[:16]).float(), y[:16])
        before = _cpu_state(acc.unwrap_model(model))
        acc.backward(loss * (math.inf if step == poison else 1.0))
        opt.step()
        opt.zero_grad()
        skipped.append(acc.optimizer_step_was_skipped)
        if step == poison:
            assert _max_diff(before, _cpu_state(acc.unwrap_model(model))) == 0.0, "a step with inf gradients changed the weights"
        losses.append(float(loss.detach()))
    return losses, dtypes, skipped, model


@cuda_only("fp16 autocast with GradScaler")
def test_fp16_with_grad_scaler_computes_in_fp16_and_skips_overflowing_steps() -> None:
    acc = Accelerator(mixed_precision="fp16")
    losses, dtypes, skipped, model = _linear_run(acc, poison=3)
    assert isinstance(acc.scaler, torch.amp.GradScaler)
    assert dtypes == {torch.float16}, dtypes
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert skipped[3] and not any(skipped[4:]), skipped
    assert acc.scaler.get_scale() < 2.0**16  # the overflow halved the initial scale
    reference = workers.reference()[1][0]
    assert abs(losses[0] - reference) < 1e-2 and losses[-1] < losses[0], losses
    acc.end_training()


def test_bf16_autocast_computes_in_bf16_with_fp32_weights() -> None:
    acc = Accelerator(cpu=CPU, mixed_precision="bf16")
    losses, dtypes, skipped, model = _linear_run(acc)
    assert acc.scaler is None and not any(skipped)
    assert dtypes == {torch.bfloat16}, dtypes
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    fp32 = _linear_run(Accelerator(cpu=CPU))[0]
    assert abs(losses[0] - fp32[0]) < 5e-2 and losses[-1] < losses[0], (losses, fp32)
    acc.end_training()


@pytest.mark.parametrize("precision", ["bf16-mixed", pytest.param("16-mixed", marks=cuda_only("precision='16-mixed'"))])
def test_trainer_mixed_precision(tmp_path: Path, precision: str) -> None:
    module = Regressor()
    trainer = Trainer(accelerator=ACCELERATOR, devices=1, max_epochs=2, precision=precision, project_dir=tmp_path, **QUIET)
    trainer.fit(module, _loader())
    expected = torch.bfloat16 if precision == "bf16-mixed" else torch.float16
    assert module.head_dtypes == {expected}, module.head_dtypes
    assert {p.dtype for p in module.parameters()} == {torch.float32}
    assert all(torch.isfinite(p).all() for p in module.parameters())


# --------------------------------------------------------------------------------------------- multi-process
@two_processes("DDP over NCCL")
def test_ddp_matches_single_process_full_batch() -> None:
    results = run_distributed(workers.ddp, CPU, nprocs=PROCS)
    expected, losses = workers.reference()
    for r in results:
        assert r["backend"] == ("gloo" if CPU else "nccl")
        assert r["batch_devices"] == r["param_devices"] == [DEVICE.type]
    assert _max_diff(results[0]["state"], expected) < 1e-5
    assert max(abs(a - b) for a, b in zip(results[0]["losses"], losses)) < 1e-5


@pytest.mark.parametrize("procs", [1, pytest.param(2, marks=two_processes("FSDP2 on 2 processes"))])
def test_fsdp2_mixed_precision_policy(procs: int) -> None:
    """param_dtype bf16, reduce_dtype fp32: fp32 shards, the head computes in bf16, losses near the fp32 reference."""
    results = run_distributed(workers.fsdp_mixed, CPU, nprocs=procs)
    expected, losses = workers.reference()
    for r in results:
        assert r["backend"] == ("gloo" if CPU else "nccl")
        assert r["shard_dtypes"] == ["torch.float32"] and r["compute_dtypes"] == ["torch.bfloat16"], r
        assert r["batch_devices"] == r["param_devices"] == [DEVICE.type]
    assert max(abs(a - b) for a, b in zip(results[0]["losses"], losses)) < 5e-2, (results[0]["losses"], losses)
    assert _max_diff(results[0]["state"], expected) < 5e-2


def _deepspeed_skip() -> str | None:
    """Why DeepSpeed cannot run here, or None."""
    if importlib.util.find_spec("deepspeed") is None:
        return "the deepspeed extra is not installed: pip install -e '.[deepspeed]'"
    if CPU:
        return None
    try:  # the checks pass torch optimizers, so DeepSpeed builds no optimizer op; it needs its CUDA accelerator
        from deepspeed.accelerator import get_accelerator

        name = get_accelerator().device_name()
    except Exception as err:
        return f"deepspeed cannot set up its CUDA accelerator: {type(err).__name__}: {err}"
    return None if name == "cuda" else f"deepspeed picked accelerator {name!r}, not 'cuda' (DS_ACCELERATOR?)"


@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_zero_matches_single_process_full_batch(stage: int) -> None:
    reason = _deepspeed_skip()
    if reason:
        print(f"DeepSpeed skipped: {reason}")
        pytest.skip(reason)
    results = run_distributed(workers.deepspeed_zero, CPU, stage, nprocs=PROCS, timeout=280)
    expected, losses = workers.reference()
    for r in results:
        assert r["batch_devices"] == r["param_devices"] == [DEVICE.type], r
    assert _max_diff(results[0]["state"], expected) < 1e-5
    assert max(abs(a - b) for a, b in zip(results[0]["losses"], losses)) < 1e-5


def test_gather_for_metrics_counts_every_sample_once() -> None:
    results = run_distributed(workers.gather, CPU, nprocs=PROCS)
    for r in results:
        assert sorted(r["seen"]) == [float(i) for i in range(13)], r["seen"]
        assert r["devices"] == [DEVICE.type]
        assert r["objects"] == [f"rank{i}" for i in range(PROCS)]


# --------------------------------------------------------------------------------------------- exact resume
def test_save_state_load_state_resume_is_bit_exact(tmp_path: Path) -> None:
    """Dropout draws on the device: the restored generator states make the resumed steps repeat bit for bit."""

    def run(resume_from: Path | None, save_to: Path | None) -> dict[str, torch.Tensor]:
        set_seed(0)
        acc = Accelerator(cpu=CPU)
        model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.3), nn.Linear(64, 1))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        model, opt, sched = acc.prepare(model, opt, sched)
        x, y = (t.to(acc.device) for t in workers.data())
        start = 0
        if resume_from is not None:
            acc.load_state(str(resume_from))
            start = 4
        for step in range(start, 8):
            loss = nn.functional.mse_loss(model(x[step * 8 : step * 8 + 8]), y[step * 8 : step * 8 + 8])
            acc.backward(loss)
            opt.step()
            sched.step()
            opt.zero_grad()
            if step == 3 and save_to is not None:
                acc.save_state(str(save_to))
        state = _cpu_state(acc.unwrap_model(model))
        acc.end_training()
        return state

    straight = run(None, tmp_path / "ckpt")
    resumed = run(tmp_path / "ckpt", None)
    assert all(torch.equal(straight[k], resumed[k]) for k in straight), f"max |Δ| {_max_diff(straight, resumed):.3e}"


def test_trainer_resumes_from_last_bit_exactly(tmp_path: Path) -> None:
    def fit(project: Path, epochs: int, ckpt_path: str | None = None) -> dict[str, torch.Tensor]:
        set_seed(0)
        module = Regressor()
        trainer = Trainer(accelerator=ACCELERATOR, devices=1, max_epochs=epochs, project_dir=project,
                          callbacks=[ModelCheckpoint(save_last=True)], **QUIET)
        trainer.fit(module, _loader(), ckpt_path=ckpt_path)
        assert trainer.global_step == epochs * 8
        return _cpu_state(module)

    straight = fit(tmp_path / "straight", 4)
    fit(tmp_path / "resumed", 2)
    resumed = fit(tmp_path / "resumed", 4, ckpt_path="last")
    assert all(torch.equal(straight[k], resumed[k]) for k in straight), f"max |Δ| {_max_diff(straight, resumed):.3e}"


# --------------------------------------------------------------------------------------------- step time, memory
def _sync() -> None:
    if not CPU:
        torch.cuda.synchronize()


def test_step_time_against_the_raw_loop() -> None:
    """Ours (Accelerator) against a raw loop with the same model, batches and precision; ratios reported, no timed verdict."""
    width, batch, steps, rounds = (256, 64, 20, 3) if CPU else (4096, 512, 50, 5)
    rows = [_time_against_raw(precision, width, batch, steps, rounds) for precision in ("no", "bf16")]
    report("step time: Accelerator vs raw loop (median of rounds)", ["workload", "ours ms/step", "raw ms/step", "ours / raw"], rows)


def _time_against_raw(precision: str, width: int, batch: int, steps: int, rounds: int) -> list[str]:
    torch.manual_seed(0)
    batches = [(torch.randn(batch, width, device=DEVICE), torch.randn(batch, 1, device=DEVICE)) for _ in range(steps)]

    def model() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, width), nn.GELU(), nn.Linear(width, 1))

    acc = Accelerator(cpu=CPU, mixed_precision=precision)
    plain = model()
    ours_model, ours_opt = acc.prepare(plain, torch.optim.AdamW(plain.parameters()))
    raw_model = model().to(DEVICE)
    raw_opt = torch.optim.AdamW(raw_model.parameters())

    def ours(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = nn.functional.mse_loss(ours_model(x).float(), y)
        acc.backward(loss)
        ours_opt.step()
        ours_opt.zero_grad()
        return loss

    def raw(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.autocast(DEVICE.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            out = raw_model(x)
        loss = nn.functional.mse_loss(out.float(), y)
        loss.backward()
        raw_opt.step()
        raw_opt.zero_grad()
        return loss

    first = {name: float(fn(*batches[0]).detach()) for name, fn in (("ours", ours), ("raw", raw))}
    assert abs(first["ours"] - first["raw"]) <= 1e-6 * max(1.0, abs(first["raw"])), first  # the same computation
    times: dict[str, list[float]] = {"ours": [], "raw": []}
    for _ in range(rounds):  # alternating rounds, so drifting clocks hit both alike
        for name, fn in (("ours", ours), ("raw", raw)):
            _sync()
            start = time.perf_counter()
            for x, y in batches:
                fn(x, y)
            _sync()
            times[name].append((time.perf_counter() - start) / steps)
    acc.end_training()
    ours_ms, raw_ms = statistics.median(times["ours"]) * 1e3, statistics.median(times["raw"]) * 1e3
    ratio = statistics.median(a / b for a, b in zip(times["ours"], times["raw"]))
    return [f"MLP {width}×3, batch {batch}, AdamW, precision {precision}", f"{ours_ms:.3f}", f"{raw_ms:.3f}", f"{ratio:.3f}×"]


MEMORY_STRATEGIES = ["single device, fp32", "single device, bf16 autocast", "DDP, bf16 autocast", "FSDP2, bf16 params / fp32 reduce",
                     "DeepSpeed ZeRO-2, bf16", "DeepSpeed ZeRO-3, bf16"]


def test_peak_memory_per_strategy_on_a_llama() -> None:
    """A locally built Llama (transformers) trained a few steps under each strategy; the table of peak device memory."""
    pytest.importorskip("transformers", reason="needs transformers: pip install transformers")
    procs = 1 if CPU else PROCS  # memory is only read on CUDA; on CPU one process checks the code path
    rows, reasons = [], []
    for name in MEMORY_STRATEGIES:
        if name.startswith("DeepSpeed") and (reason := _deepspeed_skip()):
            rows.append([name, "—", "—", f"not run: {reason}"])
            reasons.append(reason)
            continue
        results = run_distributed(workers.peak_memory, CPU, name, nprocs=procs, timeout=280)
        r = results[0]
        assert all(math.isfinite(v) for v in r["losses"]), (name, r["losses"])
        assert r["compute"] == ["float32" if name.endswith("fp32") else "bfloat16"], (name, r["compute"])  # the head's output dtype
        peak = "n/a on CPU" if CPU else f"{max(x['peak_mib'] for x in results):,.0f}"
        rows.append([name, f"{r['world']}", peak, f"{r['params'] / 1e6:.1f} M params; head computes in {r['compute'][0]}; losses {r['losses'][0]:.3f} → {r['losses'][-1]:.3f}"])
    report("peak device memory per strategy, Llama (max_memory_allocated of steps 2-4, max over processes)",
           ["strategy", "processes", "peak MiB", "notes"], rows)
    assert len(rows) == len(MEMORY_STRATEGIES)
