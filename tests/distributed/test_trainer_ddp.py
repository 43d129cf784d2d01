"""The Trainer on 2 real gloo processes: gradient sync, exact evaluation, predict order, skipped steps, stopping.

Every check runs inside one 2-process start-up (forked ranks, 60 s process-group timeout, outer timeout).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from callbacks.base import Callback
from tests.helpers.multiprocess import run_distributed
from trainer.fit.module import TrainModule
from trainer.fit.trainer import Trainer

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(300)]


class Regression(TrainModule):
    def __init__(self, skip: tuple[int, int] | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
        self.skip = skip  # (rank, batch_idx) on which training_step returns None
        self.skipped = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        x, y = batch
        if self.skip == (self.trainer.global_rank, batch_idx):
            self.skipped += 1
            return None
        loss = torch.nn.functional.mse_loss(self(x), y)
        self.log("loss", loss, sync_dist=True, on_epoch=True)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class Counting(TrainModule):
    """Evaluation on the sample values themselves: means, sums and maxima are known exactly."""

    def __init__(self) -> None:
        super().__init__()
        import torchmetrics

        self.scale = torch.nn.Parameter(torch.ones(()))
        self.total = torchmetrics.SumMetric()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        (x,) = batch
        self.log("mean", x.mean(), sync_dist=True)
        self.log("count", float(len(x)), reduce_fx="sum", sync_dist=True)
        self.log("max", x.max(), reduce_fx="max", sync_dist=True)
        self.log("local_mean", x.mean())
        self.total.update(x.sum())
        self.log("total", self.total)

    test_step = validation_step

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self(batch[0])


class ManualRegression(Regression):
    """The same regression, stepped by hand: manual_backward must synchronize gradients under DDP."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        opt = self.optimizers()
        opt.zero_grad()
        self.manual_backward(torch.nn.functional.mse_loss(self(x), y))
        opt.step()


class RegressionWithValidation(Regression):
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_mse", torch.nn.functional.mse_loss(self(x), y), sync_dist=True)


class StopOnRankZero(Callback):
    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_rank == 0 and trainer.global_step == 3:
            trainer.should_stop = True


def _trainer(tmp: str, **kwargs: Any) -> Trainer:
    return Trainer(strategy="ddp", devices=2, log_with=None, project_dir=tmp, enable_progress_bar=False,
                   enable_model_summary=False, enable_checkpointing=False, num_sanity_val_steps=0,
                   process_group_timeout=60, **kwargs)


def _regression_data() -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(16, 3, generator=g), torch.randn(16, 1, generator=g))


def _single_process_reference(skip_global_batch: int | None) -> list[torch.Tensor]:
    """Plain SGD on global batches of 4 (2 per rank): what 2-process DDP must reproduce."""
    x, y = _regression_data().tensors
    model = Regression()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step, start in enumerate(range(0, 16, 4)):
        if step == skip_global_batch:
            continue
        # the mean over ranks of each rank's mean loss over its 2 samples (rank r holds rows start+2r, start+2r+1)
        torch.nn.functional.mse_loss(model(x[start : start + 4]), y[start : start + 4]).backward()
        opt.step()
        opt.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def _checks(tmp: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    trainer = _trainer(tmp, max_epochs=1)
    out["world"] = (trainer.world_size, trainer.global_rank, trainer.is_global_zero)
    module = Regression()
    trainer.fit(module, DataLoader(_regression_data(), batch_size=2))
    out["steps"] = trainer.global_step
    out["params"] = [p.detach().clone() for p in module.parameters()]
    out["reference"] = _single_process_reference(None)
    out["loss_epoch"] = trainer.callback_metrics["loss_epoch"]

    trainer = _trainer(tmp, max_epochs=1)
    manual = ManualRegression()
    trainer.fit(manual, DataLoader(_regression_data(), batch_size=2))
    out["manual_params"] = [p.detach().clone() for p in manual.parameters()]
    out["manual_steps"] = trainer.global_step

    # a validation set of one sample: rank 1 holds no validation batch, sanity check and validation still agree
    trainer = _trainer(tmp, max_epochs=2)
    trainer.num_sanity_val_steps = 2
    trainer.fit(RegressionWithValidation(), DataLoader(_regression_data(), batch_size=2),
                DataLoader(torch.utils.data.Subset(_regression_data(), [0]), batch_size=2))
    out["one_sample_val"] = (trainer.num_val_batches, trainer.callback_metrics.get("val_mse"), trainer.global_step)

    # rank 1 skips its batch 1: with the per-batch agreement asked for (on_nonfinite), every rank skips that step
    trainer = _trainer(tmp, max_epochs=1, on_nonfinite="skip")
    module = Regression(skip=(1, 1))
    trainer.fit(module, DataLoader(_regression_data(), batch_size=2))
    out["skip_steps"] = trainer.global_step
    out["skip_params"] = [p.detach().clone() for p in module.parameters()]
    out["skip_reference"] = _single_process_reference(1)

    # should_stop set on rank 0 only: both ranks stop at the same step, the first agreement after it: with
    # stop_check_interval=1 the end of that batch, by default (every second) the end of the epoch (4 batches)
    trainer = _trainer(tmp, max_epochs=3, callbacks=[StopOnRankZero()], stop_check_interval=1)
    trainer.fit(Regression(), DataLoader(_regression_data(), batch_size=2))
    out["stop"] = (trainer.global_step, trainer.current_epoch, trainer.should_stop)
    trainer = _trainer(tmp, max_epochs=3, callbacks=[StopOnRankZero()])
    trainer.fit(Regression(), DataLoader(_regression_data(), batch_size=2))
    out["stop_default"] = (trainer.global_step, trainer.current_epoch, trainer.should_stop)

    # exact evaluation on 7 samples in batches of 2: rank 0 holds [0,1] [4,5], rank 1 holds [2,3] [6]
    data = DataLoader(TensorDataset(torch.arange(7, dtype=torch.float32)), batch_size=2)
    trainer = _trainer(tmp)
    counting = Counting()
    out["validate"] = trainer.validate(counting, data)[0]
    out["num_val_batches"] = trainer.num_val_batches
    rank = trainer.global_rank
    out["all_gather"] = counting.all_gather({"r": torch.tensor([rank, 10 + rank])})["r"].tolist()
    out["test"] = trainer.test(counting, data)[0]
    out["predict"] = torch.cat(trainer.predict(counting, data)).tolist()
    out["predict_uneven"] = torch.cat(trainer.predict(counting, DataLoader(TensorDataset(torch.arange(5.0)), batch_size=3))).tolist()
    # one sample: rank 1 has no batch at all and still joins the epoch-end reduction
    tiny = _trainer(tmp)
    lone = Counting()
    lone.validation_step = lambda batch, idx: lone.log("mean", batch[0].mean(), sync_dist=True)  # type: ignore[method-assign]
    out["tiny"] = tiny.validate(lone, DataLoader(TensorDataset(torch.tensor([5.0])), batch_size=2))[0]
    out["tiny_batches"] = tiny.num_val_batches
    return out


def test_trainer_on_two_processes(tmp_path: Any) -> None:
    ranks = run_distributed(_checks, str(tmp_path), nprocs=2, timeout=240)
    for rank, out in enumerate(ranks):
        assert out["world"] == (2, rank, rank == 0)
        # gradients are synchronized: identical to single-process SGD on the global batch, on both ranks
        assert out["steps"] == 4
        for got, want in zip(out["params"], out["reference"]):
            torch.testing.assert_close(got, want)
        for got, want in zip(out["skip_params"], out["skip_reference"]):
            torch.testing.assert_close(got, want)
        assert out["skip_steps"] == 3
        assert out["manual_steps"] == 4
        assert out["one_sample_val"][0] == (1 if rank == 0 else 0) and out["one_sample_val"][2] == 8
        for got, want in zip(out["manual_params"], out["reference"]):
            torch.testing.assert_close(got, want)
        assert out["stop"] == (3, 1, True)  # the stopped epoch counts as finished, as in Lightning
        assert out["stop_default"] == (4, 1, True)
        # exact distributed evaluation: every sample once, no wrap-around duplicate
        assert out["validate"]["mean"] == pytest.approx(3.0)
        assert out["validate"]["count"] == 7.0
        assert out["validate"]["max"] == 6.0
        assert out["validate"]["total"] == pytest.approx(21.0)
        assert out["test"]["total"] == pytest.approx(21.0) and out["test"]["mean"] == pytest.approx(3.0)
        assert out["predict"] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
        assert out["predict_uneven"] == [0.0, 1.0, 2.0, 3.0, 4.0]
        assert out["num_val_batches"] == 2
        assert out["all_gather"] == [[0, 10], [1, 11]]  # a new leading dimension of size world_size
    assert ranks[0]["loss_epoch"] == pytest.approx(ranks[1]["loss_epoch"])  # sync_dist: one value everywhere
    assert ranks[0]["validate"]["local_mean"] == pytest.approx(2.5)  # not synced: (0+1+4+5)/4 on rank 0
    assert ranks[1]["validate"]["local_mean"] == pytest.approx(11 / 3)  # (2+3+6)/3 on rank 1
    assert ranks[0]["one_sample_val"][1] is not None and ranks[0]["one_sample_val"][1] >= 0.0
    assert ranks[0]["tiny"] == {"mean": 5.0} and ranks[0]["tiny_batches"] == 1 and ranks[1]["tiny_batches"] == 0


LAUNCHED_SCRIPT = '''
import sys
import torch
from torch.utils.data import DataLoader, TensorDataset
from strategies import DeepSpeedStrategy  # noqa: F401
from trainer import Trainer, TrainModule


class Tiny(TrainModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        (x,) = batch
        return self.layer(x).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    trainer = Trainer(strategy=STRATEGY, devices=2, max_epochs=1, log_with=None, project_dir=sys.argv[1],
                      enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                      process_group_timeout=60)
    module = Tiny()
    trainer.fit(module, DataLoader(TensorDataset(torch.arange(16.0).reshape(8, 2) / 16), batch_size=2))
    weight = module.layer.weight.detach().flatten().tolist()
    print(f"RESULT rank={trainer.global_rank} world={trainer.world_size} steps={trainer.global_step} weight={weight}")
'''


@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy", ['"ddp"', '"deepspeed_stage_2"', "DeepSpeedStrategy(zero_stage=3)"])
def test_devices_2_in_a_plain_script_relaunches_it_on_two_processes(strategy: str, tmp_path: Any) -> None:
    """By name or as an instance (which every launched process builds anew): never a silent single-process run."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    if "eepSpeed" in strategy or "deepspeed" in strategy:
        pytest.importorskip("deepspeed", reason="the deepspeed extra is not installed: pip install -e '.[deepspeed]'")
    script = tmp_path / "train_tiny.py"
    script.write_text(LAUNCHED_SCRIPT.replace("STRATEGY", strategy))
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "TRAINWRIGHT_PG_TIMEOUT": "60"}
    done = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=270, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    import re

    results = sorted(re.findall(r"RESULT rank=(\d) world=(\d) steps=(\d+) weight=(\[[^\]]*\])", done.stdout + done.stderr))
    assert [r[:3] for r in results] == [("0", "2", "2"), ("1", "2", "2")], done.stdout[-3000:] + done.stderr[-3000:]
    assert results[0][3] == results[1][3]  # one model, synchronized


class BatchRecorder(TrainModule):
    """Records the first value of every training batch; predicts its input."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(1, 1)
        self.firsts: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        (x,) = batch
        self.firsts.append(float(x[0, 0]))
        return self.layer(x).pow(2).mean()

    def predict_step(self, batch: Any, batch_idx: int) -> Any:
        return batch[0]

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _lightning_argument_checks(tmp: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    data = TensorDataset(torch.arange(16, dtype=torch.float32).view(16, 1))
    # use_distributed_sampler=False: every process reads the whole loader; num_nodes=1 agrees with 2 processes on one machine
    trainer = _trainer(tmp, max_epochs=1, use_distributed_sampler=False, num_nodes=1)
    module = BatchRecorder()
    trainer.fit(module, DataLoader(data, batch_size=2))
    out["unsharded"] = (trainer.num_training_batches, trainer.global_step, module.firsts, module.layer.weight.item())
    out["unsharded_predict"] = torch.cat(trainer.predict(module, DataLoader(data, batch_size=4))).flatten().tolist()
    # overfit_batches: the first batches of this process's shard, in order, every epoch
    trainer = _trainer(tmp, max_epochs=2, overfit_batches=2)
    module = BatchRecorder()
    trainer.fit(module, DataLoader(data, batch_size=2, shuffle=True))
    out["overfit"] = module.firsts
    for name, kwargs in (("num_nodes", {"num_nodes": 2}), ("sync_batchnorm", {"sync_batchnorm": True})):
        try:
            _trainer(tmp, **kwargs)
            out[name] = None
        except ValueError as err:
            out[name] = str(err)
    return out


def test_lightning_arguments_on_two_processes(tmp_path: Any) -> None:
    ranks = run_distributed(_lightning_argument_checks, str(tmp_path), nprocs=2, timeout=240)
    for rank, out in enumerate(ranks):
        batches, steps, firsts, _ = out["unsharded"]
        assert (batches, steps) == (8, 8) and firsts == [float(2 * i) for i in range(8)]  # the whole loader on each process
        assert out["unsharded_predict"] == [float(i) for i in range(16)]  # this process's own outputs, not gathered
        assert out["overfit"] == [float(2 * rank), float(4 + 2 * rank)] * 2  # its shard's first 2 batches, unshuffled
        assert "num_nodes=2 but the launcher started 2 processes, 2 per machine" in out["num_nodes"]
        assert "sync_batchnorm=True on 2 CPU processes" in out["sync_batchnorm"]
    assert ranks[0]["unsharded"][3] == ranks[1]["unsharded"][3]  # DDP still averages the (equal) gradients


class LogsOnRankZero(Regression):
    """Logs a value on rank 0 only, as Lightning's ``rank_zero_only=True`` allows (sync_dist is then ignored)."""

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        loss = super().training_step(batch, batch_idx)
        if self.trainer.global_rank == 0:
            self.log("rank0_loss", loss, on_epoch=True, sync_dist=True, rank_zero_only=True)
        return loss


def _min_limits_checks(tmp: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    # should_stop on rank 0 only, at step 3 (4 batches per epoch and process); min_steps=6 holds the stop back (and,
    # as in Lightning, means a whole first epoch too): both processes stop at step 6, in epoch 1, per batch or by time
    for name, interval in (("per_batch", 1), ("timed", 1.0)):
        trainer = _trainer(tmp, max_epochs=5, callbacks=[StopOnRankZero()], min_steps=6, stop_check_interval=interval)
        trainer.fit(Regression(), DataLoader(_regression_data(), batch_size=2))
        out[name] = (trainer.global_step, trainer.current_epoch)
    trainer = _trainer(tmp, max_epochs=2)
    trainer.fit(LogsOnRankZero(), DataLoader(_regression_data(), batch_size=2))  # no collective waits for rank 1
    out["rank0_loss"] = "rank0_loss_epoch" in trainer.callback_metrics
    return out


def test_min_steps_and_rank_zero_only_logging_on_two_processes(tmp_path: Any) -> None:
    ranks = run_distributed(_min_limits_checks, str(tmp_path), nprocs=2, timeout=240)
    for rank, out in enumerate(ranks):
        assert out["per_batch"] == out["timed"] == (6, 2)
        assert out["rank0_loss"] is (rank == 0)


class OneValidationBatch(Regression):
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x), y)
        self.log("val_synced", loss, sync_dist=True)
        self.log("val_local", loss, prog_bar=True)


def _fewer_batches_than_processes(tmp: str) -> dict[str, Any]:
    from callbacks.early_stopping import EarlyStopping

    # one validation batch for two processes: rank 1 runs none (evaluation is never padded) and logs nothing
    trainer = _trainer(tmp, max_epochs=2, callbacks=[EarlyStopping(monitor="val_synced"), EarlyStopping(monitor="val_local")])
    data = _regression_data()
    trainer.fit(OneValidationBatch(), DataLoader(data, batch_size=2), DataLoader(data, batch_size=16))
    return {"metrics": {k: trainer.callback_metrics[k] for k in ("val_synced", "val_local")},
            "bar": sorted(trainer.progress_bar_metrics), "batches": trainer.num_val_batches}


def test_a_process_without_a_validation_batch_still_finds_the_monitored_values(tmp_path: Any) -> None:
    # before: rank 1's callback_metrics had neither name, and EarlyStopping raised there ("could not find 'val_synced'")
    ranks = run_distributed(_fewer_batches_than_processes, str(tmp_path), nprocs=2, timeout=240)
    assert [r["batches"] for r in ranks] == [1, 0]
    assert ranks[0]["metrics"] == ranks[1]["metrics"]  # rank 0 saw every sample: its value is the exact one
    assert "val_local" in ranks[1]["bar"]
