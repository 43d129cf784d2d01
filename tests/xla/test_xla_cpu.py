"""strategy='xla' run for real, single process, on torch_xla's CPU runtime (``PJRT_DEVICE=CPU``), both faces.

Run with ``bash tests/xla/run.sh`` (it builds ``.venv-xla`` with torch 2.9 + torch_xla 2.9 the first time); in the
project's venv every test here is skipped, with that command as the reason. What they hold:

- the Accelerator face trains as plain torch does (epoch losses and weights within float32 rounding) and in bf16;
- ``save_state`` / ``load_state`` (now and ``async_save``) and a Trainer checkpoint resume bit-exactly, from a checkpoint
  that is not the last one (the saves in between must not move XLA's generator), with dropout drawing on the device;
- ``save_model``'s export loads into a plain CPU model; ``gather_for_metrics`` counts every sample once;
- what cannot work says why: several processes on the CPU runtime, a backward before the runtime started.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.xla.conftest import HAVE_XLA, SKIP_REASON

pytestmark = [pytest.mark.xla, pytest.mark.skipif(not HAVE_XLA, reason=SKIP_REASON)]

if HAVE_XLA:
    import torch
    from safetensors.torch import load_file
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from callbacks.checkpoint import ModelCheckpoint
    from trainer import Accelerator, Trainer, TrainModule
    from trainer.utils import ProjectConfiguration, set_seed

ROOT = Path(__file__).resolve().parents[2]


def _data(n: int = 320, features: int = 16, classes: int = 4) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, features, generator=g)
    return TensorDataset(x, (x @ torch.randn(features, classes, generator=g)).argmax(1))


def _mlp(dropout: float = 0.0) -> nn.Module:
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(dropout), nn.Linear(64, 4))


def _cpu(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


# --------------------------------------------------------------------------------------------- Accelerator face
def test_accelerator_trains_as_plain_torch() -> None:
    """The prepared optimizer steps the parameters that moving to the XLA device made (the weights change)."""

    def train(step: object, model: nn.Module, optimizer: torch.optim.Optimizer, loader: DataLoader) -> list[float]:
        epochs = []
        for _ in range(4):
            losses = []
            for x, y in loader:
                loss = nn.functional.cross_entropy(model(x), y)
                optimizer.zero_grad()
                step(loss)  # type: ignore[operator]
                optimizer.step()
                losses.append(loss.detach())
            epochs.append(sum(float(loss) for loss in losses) / len(losses))
        return epochs

    torch.manual_seed(0)
    model = _mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    accelerator = Accelerator(strategy="xla")
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(_data(), batch_size=32))
    assert accelerator.device.type == "xla" and next(model.parameters()).device.type == "xla"
    xla = train(accelerator.backward, model, optimizer, loader)

    torch.manual_seed(0)
    plain_model = _mlp()
    plain_opt = torch.optim.AdamW(plain_model.parameters(), lr=1e-2)
    plain = train(lambda loss: loss.backward(), plain_model, plain_opt, DataLoader(_data(), batch_size=32))

    assert xla[-1] < xla[0] / 3, xla
    assert xla == pytest.approx(plain, rel=1e-5), (xla, plain)
    for name, value in _cpu(model).items():
        torch.testing.assert_close(value, plain_model.state_dict()[name], rtol=1e-5, atol=1e-5)


def test_bf16_autocasts_on_the_device_and_trains() -> None:
    set_seed(0)
    accelerator = Accelerator(strategy="xla", mixed_precision="bf16")
    model = _mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, optimizer, loader = accelerator.prepare(model, optimizer, DataLoader(_data(), batch_size=32))
    seen: list[torch.dtype] = []
    model[0].register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    losses = []
    for _ in range(3):
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        losses.append(float(loss.detach()))
    assert seen[0] == torch.bfloat16 and next(model.parameters()).dtype == torch.float32
    assert losses[-1] < losses[0], losses


def _accelerate_run(project: Path) -> tuple[Accelerator, tuple]:
    """examples/accelerate_loop.py's loop (accumulation 2, clipping, a per-step schedule, shuffled data) with dropout."""
    set_seed(42)
    accelerator = Accelerator(
        strategy="xla", gradient_accumulation_steps=2,
        project_config=ProjectConfiguration(project_dir=str(project), automatic_checkpoint_naming=True, total_limit=3),
    )
    data = _data()
    train = DataLoader(TensorDataset(*data[:256]), batch_size=32, shuffle=True)
    test = DataLoader(TensorDataset(*data[256:300]), batch_size=32)  # 44 samples: the last batch is short
    model = _mlp(dropout=0.2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=3e-3, total_steps=4 * len(train))
    return accelerator, accelerator.prepare(model, optimizer, train, test, scheduler)


def _accelerate_epoch(accelerator: Accelerator, objects: tuple) -> tuple[float, int, int]:
    model, optimizer, train, test, scheduler = objects
    model.train()
    losses = []
    for x, y in train:
        with accelerator.accumulate(model):
            loss = nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            losses.append(loss.detach())
    model.eval()
    correct = total = 0
    for x, y in test:
        with torch.no_grad():
            predictions = model(x).argmax(-1)
        predictions, y = accelerator.gather_for_metrics((predictions, y))
        correct += int((predictions == y).sum())
        total += y.numel()
    return sum(float(loss) for loss in losses) / len(losses), correct, total


@pytest.mark.parametrize("async_save", [False, True], ids=["save", "async_save"])
def test_save_state_load_state_resume_bit_exactly(tmp_path: Path, async_save: bool) -> None:
    accelerator, objects = _accelerate_run(tmp_path / "run")
    losses = []
    for _ in range(3):
        loss, correct, total = _accelerate_epoch(accelerator, objects)
        assert total == 44 and 0 <= correct <= 44  # the short last batch counted once
        losses.append(loss)
        accelerator.save_state(async_save=async_save)
    losses.append(_accelerate_epoch(accelerator, objects)[0])
    uninterrupted = _cpu(accelerator.unwrap_model(objects[0]))
    accelerator.save_model(objects[0], tmp_path / "export")
    accelerator.end_training()
    assert losses[-1] < losses[0], losses

    plain = _mlp(dropout=0.2)  # the export loads into a plain CPU model
    plain.load_state_dict(load_file(tmp_path / "export" / "model.safetensors"))
    assert all(torch.equal(plain.state_dict()[k], v) for k, v in uninterrupted.items())

    # resume from the first checkpoint (two saves came after it in the uninterrupted run)
    resumed, objects = _accelerate_run(tmp_path / "run")
    resumed.load_state(str(tmp_path / "run" / "checkpoints" / "checkpoint_0"))
    again = [_accelerate_epoch(resumed, objects)[0] for _ in range(3)]
    assert again == losses[1:], (again, losses)
    after = _cpu(resumed.unwrap_model(objects[0]))
    assert all(torch.equal(after[k], v) for k, v in uninterrupted.items()), "resume is not bit-exact"


# --------------------------------------------------------------------------------------------- Trainer face
if HAVE_XLA:

    class Digits(TrainModule):
        """examples/digits.py's classifier (an MLP with dropout, AdamW, a per-step OneCycle schedule) on made-up digits."""

        def __init__(self, hidden: int = 64, lr: float = 2e-3) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Dropout(0.1), nn.Linear(hidden, 10))
            self.epoch_losses: list[float] = []

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

        def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = nn.functional.cross_entropy(self(x), y)
            self.log("train_loss", loss, on_step=False, on_epoch=True)
            return loss

        def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
            x, y = batch
            logits = self(x)
            self.log("val_loss", nn.functional.cross_entropy(logits, y), sync_dist=True)
            self.log("val_acc", (logits.argmax(-1) == y).float().mean())

        def on_train_epoch_end(self) -> None:
            self.epoch_losses.append(float(self.trainer.callback_metrics["train_loss"]))

        def configure_optimizers(self) -> dict:
            opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
            sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=self.hparams.lr * 5, total_steps=self.trainer.estimated_stepping_batches)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def _digits_fit(project: Path, precision: str | None, async_save: bool, ckpt_path: str | None = None) -> tuple[Trainer, Digits]:
    set_seed(0)
    g = torch.Generator().manual_seed(0)
    prototypes, y = torch.rand(10, 64, generator=g), torch.randint(0, 10, (640,), generator=g)
    x = (prototypes[y] + 0.3 * torch.randn(640, 64, generator=g)).clamp(0, 1)
    train = DataLoader(TensorDataset(x[:512], y[:512]), batch_size=64, shuffle=True, drop_last=True)
    val = DataLoader(TensorDataset(x[512:], y[512:]), batch_size=64)
    trainer = Trainer(
        accelerator="tpu", devices=1, max_epochs=4, precision=precision, project_dir=str(project),
        callbacks=[ModelCheckpoint(save_last=True, save_top_k=-1, every_n_epochs=1, async_save=async_save)],
        enable_progress_bar=False, enable_model_summary=False,
    )
    module = Digits()
    trainer.fit(module, train, val, ckpt_path=ckpt_path)
    return trainer, module


@pytest.mark.parametrize(("precision", "async_save"), [(None, False), ("bf16-mixed", True)], ids=["32", "bf16-mixed-async"])
def test_trainer_tpu_fits_and_resumes_bit_exactly(tmp_path: Path, precision: str | None, async_save: bool) -> None:
    trainer, module = _digits_fit(tmp_path / "full", precision, async_save)
    assert trainer.strategy.name == "xla" and trainer.global_step == 32
    assert module.epoch_losses[-1] < module.epoch_losses[0] / 3, module.epoch_losses
    assert float(trainer.callback_metrics["val_acc"]) > 0.9
    uninterrupted = _cpu(module)

    checkpoint = tmp_path / "full" / "checkpoints" / "epoch=1-step=16"  # two epochs (and four saves) before the end
    resumed_trainer, resumed = _digits_fit(tmp_path / "resumed", precision, async_save, ckpt_path=str(checkpoint))
    assert resumed_trainer.global_step == 32
    assert resumed.epoch_losses == module.epoch_losses[2:]
    after = _cpu(resumed)
    assert all(torch.equal(after[k], v) for k, v in uninterrupted.items()), "resume is not bit-exact"


# --------------------------------------------------------------------------------------------- errors and processes
def _run(code: str, *args: str, env: dict[str, str] | None = None, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """Run `code` as a script (in the test's working directory), or the command `args`; PJRT_DEVICE=CPU."""
    full_env = {**os.environ, "PJRT_DEVICE": "CPU", "PYTHONPATH": str(ROOT), **(env or {})}
    if code:
        Path("script.py").write_text(textwrap.dedent(code))
        args = (sys.executable, "script.py", *args)
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, env=full_env)


def test_backward_before_the_runtime_started_names_the_fix() -> None:
    done = _run("""
        import torch
        from torch import nn
        torch.ones(2, requires_grad=True).sum().backward()  # a CPU backward first
        from trainer import Accelerator
        accelerator = Accelerator(strategy="xla")
        model = accelerator.prepare(nn.Linear(4, 2))
        accelerator.backward(model(torch.ones(1, 4, device=accelerator.device)).sum())
    """)
    assert done.returncode != 0
    assert "a backward pass ran in this process before torch_xla's runtime started" in done.stderr, done.stderr[-3000:]
    assert "pytorch/xla#4174" in done.stderr


SCRIPT = """
import torch
from torch import nn
from trainer import Accelerator
accelerator = Accelerator()  # strategy chosen by the launcher
model = accelerator.prepare(nn.Linear(4, 2))
accelerator.backward(model(torch.ones(1, 4, device=accelerator.device)).sum())
print(f"ran strategy={accelerator.strategy.name} on {accelerator.device}, {accelerator.num_processes} process(es)")
"""


def test_trainer_launch_runs_one_xla_process_and_refuses_two_on_the_cpu_runtime(tmp_path: Path) -> None:
    script = tmp_path / "launched.py"
    script.write_text(SCRIPT)
    trainer_cli = str(Path(sys.executable).parent / "trainer")
    one = _run("", trainer_cli, "launch", "--strategy", "xla", "--num_processes", "1", str(script))
    assert one.returncode == 0, one.stderr[-3000:]
    assert "ran strategy=xla on xla:0, 1 process(es)" in one.stdout

    two = _run("", trainer_cli, "launch", "--strategy", "xla", "--num_processes", "2", str(script))
    assert two.returncode != 0
    assert "runs one process, but 2 were asked for" in two.stderr and "pytorch/xla#9496" in two.stderr, two.stderr[-3000:]


def test_xmp_spawn_of_two_cpu_devices_is_refused_by_the_strategy() -> None:
    """xmp.spawn with CPU_NUM_DEVICES=2 starts two processes that each hold both devices; their first all-reduce would
    abort after 10 s ("Expected 2 threads to join the rendezvous, but only 1 of them arrived on time")."""
    done = _run("""
        import torch_xla.distributed.xla_multiprocessing as xmp

        def worker(index):
            from trainer import Accelerator
            Accelerator(strategy="xla")

        if __name__ == "__main__":
            xmp.spawn(worker)
    """, env={"CPU_NUM_DEVICES": "2"})
    assert done.returncode != 0
    assert "runs one process, but 2 were asked for" in done.stderr, done.stderr[-3000:]


def test_set_seed_seeds_the_xla_generator() -> None:
    def mask() -> torch.Tensor:
        return nn.functional.dropout(torch.ones(64, device=accelerator.device), 0.5).cpu()

    accelerator = Accelerator(strategy="xla")
    set_seed(1)
    first = mask()
    set_seed(1)
    assert torch.equal(mask(), first)
    set_seed(2)
    assert not torch.equal(mask(), first)
