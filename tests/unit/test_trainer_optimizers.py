"""Every ``configure_optimizers`` form, scheduler stepping, accumulation, clipping and manual optimization."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from trainer.fit.module import LRSchedulerConfig, TrainModule, parse_optimizers
from trainer.fit.trainer import Trainer


def _params() -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(torch.zeros(2))]


def _sgd(lr: float = 1.0) -> torch.optim.SGD:
    return torch.optim.SGD(_params(), lr=lr)


# ------------------------------------------------------------------------------------- parse forms
def test_single_optimizer() -> None:
    opt = _sgd()
    assert parse_optimizers(opt) == ([opt], [])


def test_list_of_optimizers() -> None:
    a, b = _sgd(), _sgd()
    assert parse_optimizers([a, b]) == ([a, b], [])


def test_optimizers_and_schedulers_tuple() -> None:
    a, b = _sgd(), _sgd()
    sa, sb = torch.optim.lr_scheduler.StepLR(a, 1), torch.optim.lr_scheduler.StepLR(b, 1)
    opts, configs = parse_optimizers(([a, b], [sa, sb]))
    assert opts == [a, b]
    assert [(c.scheduler, c.interval, c.frequency, c.opt_idx) for c in configs] == [(sa, "epoch", 1, 0), (sb, "epoch", 1, 1)]


def test_dict_with_plain_scheduler() -> None:
    opt = _sgd()
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    opts, configs = parse_optimizers({"optimizer": opt, "lr_scheduler": sched})
    assert opts == [opt] and configs == [LRSchedulerConfig(scheduler=sched)]


def test_dict_with_scheduler_config() -> None:
    opt = _sgd()
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    _, configs = parse_optimizers({"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step", "frequency": 3, "name": "lr"}})
    assert (configs[0].interval, configs[0].frequency, configs[0].name) == ("step", 3, "lr")


def test_list_of_dicts_and_plateau_with_monitor() -> None:
    a, b = _sgd(), _sgd()
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(b)
    opts, configs = parse_optimizers([{"optimizer": a}, {"optimizer": b, "lr_scheduler": plateau, "monitor": "val_loss"}])
    assert opts == [a, b]
    assert (configs[0].scheduler, configs[0].monitor, configs[0].opt_idx) == (plateau, "val_loss", 1)


def test_plateau_without_monitor_is_refused() -> None:
    opt = _sgd()
    with pytest.raises(ValueError, match="ReduceLROnPlateau needs a metric to monitor"):
        parse_optimizers({"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(opt)})


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        ("adam", TypeError, "configure_optimizers returned str"),
        ({"lr_scheduler": None}, ValueError, "needs an 'optimizer' key"),
        ({"optimizer": None}, TypeError, "where an optimizer was expected"),
        ({"optimizer": "x", "extra": 1}, ValueError, "unknown configure_optimizers key"),
    ],
)
def test_bad_forms_are_explained(value: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        parse_optimizers(value)


def test_bad_scheduler_interval_and_frequency() -> None:
    opt = _sgd()
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    with pytest.raises(ValueError, match="interval='batch'"):
        parse_optimizers({"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "batch"}})
    with pytest.raises(ValueError, match="frequency=0"):
        parse_optimizers({"optimizer": opt, "lr_scheduler": {"scheduler": sched, "frequency": 0}})


# ------------------------------------------------------------------------------------- in a fit
class Linear(TrainModule):
    """A bias-free linear model whose ``configure_optimizers`` is given by the test."""

    def __init__(self, configure: Callable[[TrainModule], Any], val_value: float | None = None) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1, bias=False)
        torch.nn.init.constant_(self.layer.weight, 0.5)
        self.configure = configure
        self.val_value = val_value
        self.lrs: list[float] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (x,) = batch
        return self.layer(x).pow(2).mean()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.log("val_loss", self.val_value if self.val_value is not None else 1.0)

    def configure_optimizers(self) -> Any:
        return self.configure(self)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.lrs.append(self.trainer.optimizers[0].param_groups[0]["lr"])


def _data(n: int = 4) -> DataLoader:
    return DataLoader(TensorDataset(torch.arange(2 * n, dtype=torch.float32).reshape(n, 2) / 10), batch_size=1)


def _fit(module: TrainModule, tmp_path: Any, val: bool = False, **kwargs: Any) -> Trainer:
    trainer = Trainer(log_with=None, project_dir=tmp_path, enable_progress_bar=False, enable_model_summary=False,
                      enable_checkpointing=False, num_sanity_val_steps=0, **kwargs)
    trainer.fit(module, _data(), _data(1) if val else None)
    return trainer


def test_step_interval_scheduler_with_frequency(tmp_path: Any) -> None:
    def configure(m: TrainModule) -> Any:
        opt = torch.optim.SGD(m.parameters(), lr=1.0)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step", "frequency": 2}}

    module = Linear(configure)
    trainer = _fit(module, tmp_path, max_epochs=1)
    assert trainer.global_step == 4
    assert module.lrs == [1.0, 0.5, 0.5, 0.25]
    assert trainer.lr_scheduler_configs[0].interval == "step"


def test_epoch_interval_scheduler(tmp_path: Any) -> None:
    def configure(m: TrainModule) -> Any:
        opt = torch.optim.SGD(m.parameters(), lr=1.0)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)]

    module = Linear(configure)
    _fit(module, tmp_path, max_epochs=3)
    assert module.lrs == [1.0] * 4 + [0.5] * 4 + [0.25] * 4


def test_plateau_scheduler_reads_the_monitored_metric(tmp_path: Any) -> None:
    def configure(m: TrainModule) -> Any:
        opt = torch.optim.SGD(m.parameters(), lr=1.0)
        plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, patience=0, factor=0.1)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": plateau, "monitor": "val_loss"}}

    module = Linear(configure, val_value=2.0)
    _fit(module, tmp_path, val=True, max_epochs=3)
    # epoch 0 sets the best value; epochs 1 and 2 do not improve on it: two reductions
    assert module.lrs[0] == 1.0 and module.lrs[4] == pytest.approx(1.0) and module.lrs[8] == pytest.approx(0.1)
    assert module.trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.01)


def test_plateau_scheduler_with_a_metric_never_logged_fails_clearly(tmp_path: Any) -> None:
    def configure(m: TrainModule) -> Any:
        opt = torch.optim.SGD(m.parameters(), lr=1.0)
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.ReduceLROnPlateau(opt), "monitor": "nope"}

    with pytest.raises(RuntimeError, match="monitors 'nope', which was not logged"):
        _fit(Linear(configure), tmp_path, max_epochs=1)


def test_automatic_optimization_with_two_optimizers_is_refused(tmp_path: Any) -> None:
    with pytest.raises(ValueError, match="exactly one optimizer"):
        _fit(Linear(lambda m: [torch.optim.SGD(m.parameters(), lr=1), torch.optim.SGD(m.parameters(), lr=1)]), tmp_path, max_epochs=1)


def test_accumulation_matches_the_averaged_gradient(tmp_path: Any) -> None:
    module = Linear(lambda m: torch.optim.SGD(m.parameters(), lr=1.0))
    reference = torch.nn.Linear(2, 1, bias=False)
    torch.nn.init.constant_(reference.weight, 0.5)
    xs = _data().dataset.tensors[0]
    # batches 0-1 then 2-3: two steps of the mean gradient over each pair (loss / 2 per batch)
    for pair in (xs[:2], xs[2:]):
        reference.zero_grad()
        sum(reference(x[None]).pow(2).mean() / 2 for x in pair).backward()
        with torch.no_grad():
            reference.weight -= reference.weight.grad
    trainer = _fit(module, tmp_path, max_epochs=1, accumulate_grad_batches=2)
    assert trainer.global_step == 2
    torch.testing.assert_close(module.layer.weight, reference.weight)


def test_accumulation_steps_at_the_end_of_the_epoch(tmp_path: Any) -> None:
    trainer = _fit(Linear(lambda m: torch.optim.SGD(m.parameters(), lr=0.1)), tmp_path, max_epochs=2, accumulate_grad_batches=3)
    assert trainer.global_step == 4  # 4 batches per epoch: steps after batch 3 and after the last batch


class ClipProbe(Linear):
    def __init__(self) -> None:
        super().__init__(lambda m: torch.optim.SGD(m.parameters(), lr=0.0))
        self.norms: list[float] = []

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # the clipped gradients of this step: as in Lightning they are zeroed on the next batch, not after the step
        self.norms.append(float(self.layer.weight.grad.norm()))


def test_gradient_clipping_by_norm_and_value(tmp_path: Any) -> None:
    module = ClipProbe()
    _fit(module, tmp_path, max_epochs=1, gradient_clip_val=1e-3)
    assert module.norms and max(module.norms) <= 1e-3 + 1e-7
    module = ClipProbe()
    _fit(module, tmp_path, max_epochs=1, gradient_clip_val=1e-4, gradient_clip_algorithm="value")
    assert all(float(n) <= 1e-4 * 2**0.5 + 1e-8 for n in module.norms)


class Fp16Overflow(Linear):
    """Produces inf gradients on the first batch: fp16 loss scaling must skip that optimizer step."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        return loss * float("inf") if batch_idx == 0 else loss


def test_fp16_skipped_step_does_not_step_the_scheduler(tmp_path: Any) -> None:
    def configure(m: TrainModule) -> Any:
        opt = torch.optim.SGD(m.parameters(), lr=1.0)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    module = Fp16Overflow(configure)
    trainer = _fit(module, tmp_path, max_epochs=1, precision="16-mixed")
    assert trainer.accelerator.mixed_precision == "fp16"
    assert module.lrs == [1.0, 0.5, 0.25, 0.125]


# ------------------------------------------------------------------------------------- manual optimization
class TwoPlayer(TrainModule):
    """GAN-style: two sub-networks, two optimizers, stepped by hand."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.gen = torch.nn.Linear(2, 2)
        self.disc = torch.nn.Linear(2, 1)
        self.steps: list[int] = []

    def training_step(self, batch: Any, batch_idx: int) -> None:
        (x,) = batch
        opt_g, opt_d = self.optimizers()
        sched_g, _ = self.lr_schedulers()
        self.toggle_optimizer(opt_d)
        d_loss = self.disc(self.gen(x).detach()).pow(2).mean() + (1 - self.disc(x)).pow(2).mean()
        assert not self.gen.weight.requires_grad and self.disc.weight.requires_grad
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        opt_d.step()
        self.untoggle_optimizer(opt_d)
        assert self.gen.weight.requires_grad
        g_loss = (1 - self.disc(self.gen(x))).pow(2).mean()
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        opt_g.step()
        sched_g.step()
        self.steps.append(self.global_step)
        self.log("g_loss", g_loss)

    def configure_optimizers(self) -> Any:
        opt_g = torch.optim.SGD(self.gen.parameters(), lr=0.1)
        opt_d = torch.optim.SGD(self.disc.parameters(), lr=0.1)
        return [opt_g, opt_d], [torch.optim.lr_scheduler.StepLR(opt_g, 1, gamma=0.5), torch.optim.lr_scheduler.StepLR(opt_d, 1)]


def test_manual_optimization_gan_style(tmp_path: Any) -> None:
    module = TwoPlayer()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    trainer = _fit(module, tmp_path, max_epochs=1)
    assert module.steps == [2, 4, 6, 8] and trainer.global_step == 8
    assert all(not torch.equal(before[k], v) for k, v in module.state_dict().items())
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.1 * 0.5**4)  # stepped by hand, once per batch
    assert trainer.optimizers[1].param_groups[0]["lr"] == pytest.approx(0.1)  # epoch scheduler not stepped for manual modules
    assert "g_loss" in trainer.callback_metrics


def test_manual_optimization_refuses_accumulation_and_clipping(tmp_path: Any) -> None:
    with pytest.raises(ValueError, match="do not apply to manual optimization"):
        _fit(TwoPlayer(), tmp_path, max_epochs=1, accumulate_grad_batches=2)


def test_manual_backward_in_automatic_mode_is_refused(tmp_path: Any) -> None:
    module = Linear(lambda m: torch.optim.SGD(m.parameters(), lr=1.0))
    trainer = _fit(module, tmp_path, max_epochs=1)
    with pytest.raises(RuntimeError, match="automatic_optimization = False"):
        module.manual_backward(torch.tensor(1.0, requires_grad=True))
    assert trainer.global_step == 4


def test_manual_optimization_calls_the_backward_and_step_hooks(tmp_path: Any) -> None:
    from callbacks.base import Callback

    class Record(Callback):
        def __init__(self) -> None:
            self.events: list[str] = []

        def on_before_backward(self, trainer: Any, module: Any, loss: Any) -> None:
            self.events.append("before_backward")

        def on_after_backward(self, trainer: Any, module: Any) -> None:
            assert module.disc.weight.grad is not None or module.gen.weight.grad is not None  # gradients exist here
            self.events.append("after_backward")

        def on_before_optimizer_step(self, trainer: Any, module: Any, optimizer: Any) -> None:
            self.events.append("before_optimizer_step")

    record = Record()
    _fit(TwoPlayer(), tmp_path, max_epochs=1, callbacks=[record])
    one_batch = ["before_backward", "after_backward", "before_optimizer_step"] * 2  # discriminator, then generator
    assert record.events == one_batch * 4


def test_fit_goes_through_a_strategy_that_overrides_backward_and_step(tmp_path: Any) -> None:
    """The Trainer calls loss.backward() and the optimizer's step() itself only where the strategy would add nothing;
    a strategy (or precision) doing more is called for every batch, with the same weights where it adds nothing new."""
    from strategies.precision import Precision
    from strategies.single_device import SingleDeviceStrategy

    calls: list[str] = []

    class Counting(SingleDeviceStrategy):
        def backward(self, loss: Any, **kwargs: Any) -> None:
            calls.append("backward")
            super().backward(loss, **kwargs)

        def optimizer_step(self, optimizer: Any, **kwargs: Any) -> Any:
            calls.append("step")
            return super().optimizer_step(optimizer, **kwargs)

    class CountingPrecision(Precision):
        def backward(self, loss: Any, **kwargs: Any) -> None:
            calls.append("precision backward")
            super().backward(loss, **kwargs)

    class Line(TrainModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            return self.layer(batch[0]).pow(2).mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    counted_precision = SingleDeviceStrategy(cpu=True)
    counted_precision.precision = CountingPrecision()
    weights = []
    for strategy in (SingleDeviceStrategy(cpu=True), Counting(cpu=True), counted_precision):
        torch.manual_seed(0)
        module = Line()
        trainer = Trainer(strategy=strategy, max_epochs=1, log_with=None, project_dir=tmp_path, enable_progress_bar=False,
                          enable_model_summary=False, enable_checkpointing=False)
        trainer.fit(module, DataLoader(TensorDataset(torch.randn(6, 2)), batch_size=2))
        weights.append(module.layer.weight.detach().clone())
    assert calls == ["backward", "step"] * 3 + ["precision backward"] * 3
    assert torch.equal(weights[0], weights[1]) and torch.equal(weights[0], weights[2])


class ZeroGradOverride(TrainModule):
    """Lightning's ``optimizer_zero_grad`` override: records its calls and zeroes without freeing the gradients."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1, bias=False)
        torch.nn.init.constant_(self.layer.weight, 0.5)
        self.calls: list[tuple[Any, ...]] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (x,) = batch
        return self.layer(x).pow(2).mean()

    def on_before_backward(self, loss: torch.Tensor) -> None:
        self.calls.append(("before_backward", self.current_epoch, "none" if self.layer.weight.grad is None else "tensor"))

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Any) -> None:
        self.calls.append(("zero_grad", epoch, batch_idx, isinstance(optimizer, torch.optim.SGD)))
        optimizer.zero_grad(set_to_none=False)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_an_optimizer_zero_grad_override_runs_where_lightning_runs_it(tmp_path: Any) -> None:
    """With ``accumulate_grad_batches=2``: the override runs on each window's first batch, after ``training_step`` and
    before backward, with the torch optimizer; its ``set_to_none=False`` leaves zero tensors where the Trainer's own
    zeroing leaves None. The calls, weights and step count are Lightning 2.6.6's for the same script (run in a side
    environment)."""
    module = ZeroGradOverride()
    data = DataLoader(TensorDataset(torch.arange(12.0).reshape(6, 2) / 10), batch_size=1)
    trainer = Trainer(max_epochs=2, accumulate_grad_batches=2, log_with=None, project_dir=tmp_path, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False)
    trainer.fit(module, data)
    window = [("before_backward", 0, "tensor"), ("before_backward", 0, "tensor")]
    lightning = [("zero_grad", 0, 0, True), ("before_backward", 0, "none"), ("before_backward", 0, "tensor"),
                 ("zero_grad", 0, 2, True), *window, ("zero_grad", 0, 4, True), *window]
    lightning += [(c[0], 1, *c[2:]) if c[0] == "zero_grad" else (c[0], 1, "tensor") for c in lightning]
    assert module.calls == lightning
    assert trainer.global_step == 6
    assert module.layer.weight.tolist()[0] == pytest.approx([0.17432844638824463, 0.12756307423114777], abs=1e-7)

    class Plain(ZeroGradOverride):  # without the override: the Trainer's zeroing, to None
        optimizer_zero_grad = TrainModule.optimizer_zero_grad

    plain = Plain()
    Trainer(max_epochs=1, accumulate_grad_batches=2, log_with=None, project_dir=tmp_path, enable_progress_bar=False,
            enable_model_summary=False, enable_checkpointing=False).fit(plain, data)
    assert [c[2] for c in plain.calls] == ["none", "tensor"] * 3


@pytest.mark.parametrize("hook", ["backward", "on_validation_model_zero_grad"])
def test_lightning_hooks_this_trainer_does_not_call_are_refused_not_ignored(tmp_path: Any, hook: str) -> None:
    """A module ported from Lightning with a ``backward`` or ``on_validation_model_zero_grad`` override: fit refuses it
    before training, naming the hook and where its work goes, instead of training without it."""

    def override(self: TrainModule, *args: Any, **kwargs: Any) -> None:
        raise AssertionError("never called")

    Ported = type("Ported", (Linear,), {hook: override})
    module = Ported(lambda m: torch.optim.SGD(m.parameters(), lr=0.1))
    before = module.layer.weight.detach().clone()
    with pytest.raises(NotImplementedError, match=rf"Ported defines {hook}\(.*a Lightning hook this Trainer does not call"):
        _fit(module, tmp_path, max_epochs=1)
    assert torch.equal(module.layer.weight, before)  # nothing trained
