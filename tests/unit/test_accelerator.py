import os
import pickle
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch.utils.data import DataLoader, TensorDataset

from strategies.checkpoint_io import CheckpointError
from trainer import Accelerator, ProjectConfiguration
from trainer.utils import set_seed


def make(n=32, bs=4, shuffle=True, **kwargs):
    set_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    data = TensorDataset(torch.randn(n, 4), torch.randn(n, 1))
    loader = DataLoader(data, batch_size=bs, shuffle=shuffle)
    acc = Accelerator(cpu=True, **kwargs)
    return (acc, *acc.prepare(model, opt, sched, loader))


def forever(loader):
    while True:
        yield from loader


def train_steps(acc, model, opt, sched, it, n):
    losses = []
    for _ in range(n):
        x, y = next(it)
        with acc.accumulate(model):
            loss = torch.nn.functional.mse_loss(model(x), y)
            acc.backward(loss)
            opt.step()
            sched.step()
            opt.zero_grad()
        losses.append(loss.item())
    return losses


def test_prepare_keeps_order_and_types():
    acc, model, opt, _sched, loader = make()
    assert isinstance(model, torch.nn.Module) and isinstance(opt, torch.optim.Optimizer)
    assert len(loader) == 8 and acc.num_processes == 1 and acc.is_main_process
    assert next(model.parameters()).device == acc.device


def test_accumulation_matches_manual_loop():
    acc, model, opt, _sched, loader = make(shuffle=False, gradient_accumulation_steps=2)
    model.eval()  # no dropout: compare to a hand-written loop
    set_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1)).eval()
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    steps = 0
    for i, (x, y) in enumerate(loader):
        with acc.accumulate(model):
            acc.backward(torch.nn.functional.mse_loss(model(x), y))
            opt.step()
            opt.zero_grad()
        (torch.nn.functional.mse_loss(ref(x), y) / 2).backward()
        if i % 2 == 1:
            ref_opt.step()
            ref_opt.zero_grad()
            steps += 1
    assert steps == 4
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_sync_at_end_of_dataloader():
    acc, model, _opt, _sched, loader = make(n=12, gradient_accumulation_steps=4)
    flags = []
    for _x, _y in loader:
        with acc.accumulate(model):
            flags.append(acc.sync_gradients)
    assert flags == [False, False, True]  # 3 batches, 4 accumulation steps: the end of the loader is a boundary


def test_save_and_load_state_resume_exactly(tmp_path):
    acc, model, opt, sched, loader = make()
    it = forever(loader)
    train_steps(acc, model, opt, sched, it, 3)
    path = acc.save_state(tmp_path / "ckpt")
    straight = train_steps(acc, model, opt, sched, it, 9)  # crosses into the next epoch
    weights = [p.detach().clone() for p in model.parameters()]

    acc2, model2, opt2, sched2, loader2 = make()
    acc2.load_state(path)
    resumed = train_steps(acc2, model2, opt2, sched2, forever(loader2), 9)
    assert resumed == straight
    assert all(torch.equal(a, b) for a, b in zip(weights, model2.parameters()))
    keys = load_file(str(Path(path) / "model.safetensors")).keys()
    assert set(keys) == set(model.state_dict().keys())


def test_automatic_naming_total_limit_and_counter(tmp_path):
    config = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True, total_limit=2)
    acc, _model, _opt, _sched, _loader = make(project_config=config)
    for _ in range(3):
        acc.save_state()
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["checkpoint_1", "checkpoint_2"]
    config2 = ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True, total_limit=2)
    acc2, *_objs = make(project_config=config2)
    acc2.load_state()  # newest, and the counter continues after it
    assert acc2.save_state().endswith("checkpoint_3")


class Boom:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_tampered_checkpoint_is_refused(tmp_path):
    acc, _model, _opt, _sched, _loader = make()
    path = Path(acc.save_state(tmp_path / "ckpt"))
    (path / "optimizer.bin").write_bytes(pickle.dumps({"state": Boom()}))
    with pytest.raises(CheckpointError, match="refusing to load"):
        acc.load_state(path)
    assert not Path("pwned").exists()


def test_incomplete_checkpoint_is_refused(tmp_path):
    acc, _model, _opt, _sched, _loader = make()
    path = Path(acc.save_state(tmp_path / "ckpt"))
    (path / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        acc.load_state(path)


def test_one_manifest_hashes_every_file_as_written(tmp_path):
    import json

    import xxhash

    acc, _model, _opt, _sched, _loader = make()
    path = Path(acc.save_state(tmp_path / "ckpt"))
    manifest = json.loads((path / "manifest.json").read_text())
    on_disk = {p.name for p in path.iterdir()} - {"manifest.json"}
    assert set(manifest["files"]) == on_disk and manifest["format_version"] == 3 and manifest["hash"] == "xxh3_128"
    for name, entry in manifest["files"].items():
        assert entry["digest"] == xxhash.xxh3_128((path / name).read_bytes()).hexdigest()
    assert not list(tmp_path.glob(".*"))  # the staging directory is gone


def test_format_1_directory_still_loads(tmp_path):
    import json

    acc, model, _opt, _sched, _loader = make()
    path = Path(acc.save_state(tmp_path / "ckpt"))
    want = {k: v.clone() for k, v in model.state_dict().items()}
    (path / "manifest.json").unlink()  # the previous release marked a directory complete with checkpoint.json
    (path / "checkpoint.json").write_text(json.dumps({"format_version": 1, "num_processes": 1, "models": 1, "optimizers": 1, "schedulers": 1}))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    acc.load_state(path)
    assert all(torch.equal(model.state_dict()[k], want[k]) for k in want)


def test_save_model_shards_with_index(tmp_path):
    acc = Accelerator(cpu=True)
    model = acc.prepare(torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)]))
    acc.save_model(model, tmp_path / "out", max_shard_size="20KB")
    files = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert "model.safetensors.index.json" in files and len(files) > 2
    loaded = {}
    for f in files:
        if f.endswith(".safetensors"):
            loaded.update(load_file(str(tmp_path / "out" / f)))
    assert loaded.keys() == model.state_dict().keys()


def test_fp16_skipped_step_is_reported():
    acc = Accelerator(cpu=True, mixed_precision="fp16")
    model = acc.prepare(torch.nn.Linear(2, 1))
    opt = acc.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    acc.backward(model(torch.ones(1, 2)).sum() * float("inf"))
    opt.step()
    assert acc.optimizer_step_was_skipped


@pytest.mark.parametrize("mixed_precision", ["no", "fp16"])
def test_backward_and_step_pass_their_arguments_on(mixed_precision):
    """backward's keywords reach loss.backward (with and without a scaler) and step's closure reaches the optimizer."""
    acc = Accelerator(cpu=True, mixed_precision=mixed_precision)
    model = acc.prepare(torch.nn.Linear(3, 1, bias=False))  # a bias's gradient, scaled, would overflow fp16
    with torch.no_grad():
        model.weight.zero_()  # a zero loss, so scaled it stays finite in fp16
    opt = acc.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    loss = model(torch.full((2, 3), 0.5)).mean()  # each weight's gradient: 0.5 (times the scale: 32768 fits fp16)
    acc.backward(loss, retain_graph=True)
    acc.backward(loss)  # the graph was kept: a second backward works and doubles the gradient
    scale = acc.scaler.get_scale() if acc.scaler is not None else 1.0
    torch.testing.assert_close(model.weight.grad / scale, torch.full((1, 3), 1.0))
    if acc.scaler is not None:  # torch's GradScaler refuses closures
        opt.step()
    else:
        evaluated = []

        def closure():
            evaluated.append(True)
            return loss.detach()

        opt.step(closure)
        assert evaluated == [True]
    assert not acc.optimizer_step_was_skipped
    torch.testing.assert_close(model.weight.detach(), torch.full((1, 3), -0.1))  # stepped: 0 - lr * 1.0


def test_clip_grad_norm_unscales_first():
    acc = Accelerator(cpu=True, mixed_precision="fp16")
    model = acc.prepare(torch.nn.Linear(3, 1))
    opt = acc.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    acc.backward(model(torch.ones(4, 3)).mean() * 0.1)  # every gradient is 0.1 once unscaled
    norm = acc.clip_grad_norm_(model.parameters(), 1e9)
    torch.testing.assert_close(norm, torch.tensor(0.2), rtol=1e-3, atol=1e-3)
    opt.step()
    assert not acc.optimizer_step_was_skipped


def test_bad_arguments():
    with pytest.raises(ValueError, match="gradient_accumulation_steps=0"):
        Accelerator(gradient_accumulation_steps=0)
    with pytest.raises(ValueError, match="mixed_precision='fp8'"):
        Accelerator(mixed_precision="fp8", cpu=True)  # refused on CPU (on an FP8-capable GPU it is accepted)
    with pytest.raises(ValueError, match="strategy='nope'"):
        Accelerator(strategy="nope")


def test_env_settings_are_defaults(monkeypatch):
    monkeypatch.setenv("TRAINWRIGHT_MIXED_PRECISION", "bf16")
    monkeypatch.setenv("TRAINWRIGHT_GRADIENT_ACCUMULATION_STEPS", "3")
    acc = Accelerator(cpu=True)
    assert acc.mixed_precision == "bf16" and acc.gradient_accumulation_steps == 3
    assert Accelerator(cpu=True, mixed_precision="no").mixed_precision == "no"


def test_split_batches_is_honoured():
    acc = Accelerator(cpu=True, split_batches=True)
    assert acc.split_batches is True


def test_gather_for_metrics_after_another_loader_finished():
    acc = Accelerator(cpu=True)
    train, evaluation = acc.prepare(DataLoader(list(range(10)), batch_size=4), DataLoader(list(range(7)), batch_size=4))
    assert [len(b) for b in train] == [4, 4, 2]
    seen = [acc.gather_for_metrics(b).tolist() for b in evaluation]
    assert seen == [[0, 1, 2, 3], [4, 5, 6]]


def test_unregistered_unpadded_loader_is_not_checkpointed(tmp_path):
    acc = Accelerator(cpu=True)
    train = acc.prepare(DataLoader(list(range(8)), batch_size=2))
    evaluation = acc.prepare_data_loader(DataLoader(list(range(5)), batch_size=2), even_batches=False, register=False)
    assert [b.tolist() for b in evaluation] == [[0, 1], [2, 3], [4]]
    next(iter(train))
    path = Path(acc.save_state(tmp_path / "ckpt"))
    import json

    assert len(json.loads((path / "dataloaders.json").read_text())["dataloaders"]) == 1


def test_base_strategy_prepare_for_backward_is_a_no_op():
    acc = Accelerator(cpu=True)
    model = acc.prepare(torch.nn.Linear(2, 1))
    out = model(torch.ones(1, 2))
    acc.strategy.prepare_for_backward(model, out)  # nothing to prepare on one process
    acc.backward(out.sum())
    assert model.weight.grad is not None


def test_single_process_helpers():
    acc = Accelerator(cpu=True)
    assert acc.is_last_process and acc.is_main_process
    assert acc.on_process(lambda: "ran", process_index=0)() == "ran"
    assert acc.on_process(lambda: "ran", process_index=1)() == "ran"  # one process runs everything, as in Accelerate
    assert acc.on_main_process(lambda: 1)() == 1 and acc.on_local_main_process(lambda: 2)() == 2
    with acc.main_process_first(), acc.local_main_process_first():
        pass
    assert acc.check_trigger() is False
    acc.set_trigger()
    assert acc.check_trigger() is True
    assert acc.check_trigger() is False  # reset after it was seen


def test_load_state_refuses_a_flipped_byte_before_loading(tmp_path):
    acc, model, _opt, _sched, _loader = make()
    path = Path(acc.save_state(tmp_path / "ckpt"))
    data = bytearray((path / "model.safetensors").read_bytes())
    data[-1] ^= 0xFF  # same size, different weights
    (path / "model.safetensors").write_bytes(bytes(data))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"model.safetensors was modified"):
        acc.load_state(path)
    assert all(torch.equal(model.state_dict()[k], before[k]) for k in before)  # nothing was loaded
    (path / "model.safetensors").write_bytes(bytes(data[:-4]))  # truncated: caught even with verify=False
    with pytest.raises(CheckpointError, match=r"model.safetensors was modified"):
        acc.load_state(path, verify=False)


def test_a_real_signal_triggers_check_trigger_once():
    import os
    import signal

    acc = Accelerator(cpu=True)
    previous = signal.getsignal(signal.SIGUSR1)
    try:
        acc.trigger_on_signals(signal.SIGUSR1)
        assert acc.check_trigger() is False
        os.kill(os.getpid(), signal.SIGUSR1)
        assert acc.received_signal == signal.SIGUSR1  # the process was not terminated
        assert acc.check_trigger() is True
        assert acc.check_trigger() is False  # reset after it was seen
    finally:
        signal.signal(signal.SIGUSR1, previous)


def _accumulation_pattern(plugin_kwargs, epochs=2):
    from trainer.utils import GradientAccumulationPlugin

    acc = Accelerator(cpu=True, gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=3, **plugin_kwargs))
    model = torch.nn.Linear(1, 1)
    model, opt, loader = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.utils.data.DataLoader(torch.ones(10, 1), batch_size=1))
    synced, stepped = [], []
    for _ in range(epochs):
        for i, batch in enumerate(loader):
            with acc.accumulate(model):
                before = model.weight.detach().clone()
                acc.backward(model(batch).sum())
                opt.step()
                opt.zero_grad()
                if acc.sync_gradients:
                    synced.append(i + 1)
                if not torch.equal(before, model.weight):
                    stepped.append(i + 1)
    return synced, stepped


def test_accumulation_restarts_at_each_loader_end_as_in_accelerate():
    synced, stepped = _accumulation_pattern({})
    assert synced == [3, 6, 9, 10] * 2 and stepped == synced  # epoch 2 syncs at 3 again, not at 2


def test_sync_each_batch_still_steps_every_n_batches():
    _, stepped = _accumulation_pattern({"sync_each_batch": True})
    assert stepped == [3, 6, 9, 10] * 2


def test_accelerates_resume_recipe_gives_accelerates_result(tmp_path):
    """The by_feature/checkpointing.py recipe: load_state, starting_epoch = step // len(loader), skip_first_batches."""

    def run(resume_from=None, stop_at=None):
        acc = Accelerator(cpu=True)
        torch.manual_seed(0)
        loader = acc.prepare(torch.utils.data.DataLoader(torch.arange(40), batch_size=4, shuffle=True))
        starting_epoch, resume_step, seen, overall_step = 0, None, [], 0
        if resume_from is not None:
            acc.load_state(resume_from)
            overall_step = int(Path(resume_from).name.replace("step_", ""))
            starting_epoch = overall_step // len(loader)
            resume_step = overall_step - starting_epoch * len(loader)
        for epoch in range(starting_epoch, 4):
            active = acc.skip_first_batches(loader, resume_step) if epoch == starting_epoch and resume_step is not None else loader
            for batch in active:
                seen.append(batch.tolist())
                overall_step += 1
                if overall_step == stop_at:
                    acc.save_state(tmp_path / f"step_{overall_step}")
                    return seen
        return seen

    straight = run()
    first = run(stop_at=25)
    resumed = run(resume_from=tmp_path / "step_25")
    assert first + resumed == straight


def test_missing_rng_states_are_an_error_not_skipped(tmp_path):
    import json

    acc = make()[0]
    path = Path(acc.save_state(tmp_path / "ckpt"))
    (path / "random_states_0.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"random_states_0\.safetensors is missing"):  # the manifest notices first
        acc.load_state(path)
    (path / "manifest.json").unlink()  # a format-1 directory has no manifest to notice it
    (path / "checkpoint.json").write_text(json.dumps({"format_version": 1, "num_processes": 1}))
    with pytest.raises(CheckpointError, match="the RNG states of process 0 are missing"):
        acc.load_state(path)


def _zero_grad_names(trace):
    return [e.name for e in trace.events() if "zero_grad" in e.name]


def test_zero_grad_sets_gradients_to_none_as_torch_does():
    """The prepared optimizer's and the Trainer's zero_grad skip torch's profiler label, not its effect: every gradient
    in every group becomes None (a frozen parameter's stays None), and the next backward fills them again."""
    from strategies.optim import zero_grad_to_none

    acc = Accelerator(cpu=True)
    model = acc.prepare(torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1)))
    model[0].bias.requires_grad_(False)
    raw = torch.optim.SGD([{"params": [model[0].weight]}, {"params": list(model[1].parameters()), "lr": 0.5}], lr=0.1)
    opt = acc.prepare(raw)
    for zero in (opt.zero_grad, lambda: zero_grad_to_none(raw)):
        acc.backward(model(torch.ones(2, 3)).sum())
        assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
        zero()
        assert [p.grad for p in model.parameters()] == [None] * 4
    opt.zero_grad(set_to_none=False)  # the other mode is torch's own: zeros, not None
    acc.backward(model(torch.ones(2, 3)).sum())
    opt.zero_grad(set_to_none=False)
    assert all(bool((p.grad == 0).all()) for p in model.parameters() if p.requires_grad)


def test_zero_grad_runs_torchs_method_under_the_profiler_and_an_optimizers_own():
    """Under torch.profiler the trace keeps torch's zero_grad label; an optimizer defining zero_grad (in its class or
    on the instance) has it called, with set_to_none=True."""
    from strategies.optim import zero_grad_to_none

    param = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([param], lr=0.1)
    param.grad = torch.ones(2)
    with torch.profiler.profile() as trace:
        zero_grad_to_none(opt)
    assert param.grad is None
    assert _zero_grad_names(trace) == ["Optimizer.zero_grad#SGD.zero_grad"]
    param.grad = torch.ones(2)
    with torch.profiler.profile() as quiet:
        pass
    zero_grad_to_none(opt)  # no profiler: the label is skipped
    assert param.grad is None and _zero_grad_names(quiet) == []

    calls = []

    class Own(torch.optim.SGD):
        def zero_grad(self, set_to_none=True):
            calls.append(("class", set_to_none))

    zero_grad_to_none(Own([param], lr=0.1))
    patched = torch.optim.SGD([param], lr=0.1)
    patched.zero_grad = lambda set_to_none=True: calls.append(("instance", set_to_none))
    zero_grad_to_none(patched)
    assert calls == [("class", True), ("instance", True)]


def _step_names(trace):
    return [e.name for e in trace.events() if e.name.startswith("Optimizer.step#")]


def _three_layer_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))


@pytest.mark.parametrize("make", [
    lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=0.01),
    lambda params: torch.optim.AdamW(params, lr=0.01),  # lazily created state
])
def test_step_optimizer_changes_the_weights_exactly_as_step(make):
    """The step without torch's wrapper is the same step: after several steps (state created lazily on the first),
    the weights and the optimizer state are bitwise those of ``optimizer.step()``."""
    from strategies.optim import step_optimizer

    results = []
    for step in (lambda opt: opt.step(), step_optimizer):
        model = _three_layer_model()
        opt = make(model.parameters())
        for i in range(5):
            opt.zero_grad()
            model(torch.full((2, 3), float(i))).pow(2).sum().backward()
            step(opt)
        results.append((model.state_dict(), opt.state_dict()["state"]))
    (weights, state), (weights2, state2) = results
    assert all(torch.equal(weights[k], weights2[k]) for k in weights)
    assert all(torch.equal(state[i][k], state2[i][k]) for i in state for k in state[i] if isinstance(state[i][k], torch.Tensor))


def test_step_optimizer_skips_torchs_wrapper_only_where_nothing_sees_it():
    """No profiler and no hook: torch's record_function is not entered (what the 9 µs are). Under torch.profiler the
    trace keeps the step's label; step hooks registered on the optimizer or for every optimizer run; a step patched on
    the instance runs; a learning-rate scheduler sees that the optimizer stepped (no 'lr_scheduler.step() before
    optimizer.step()' warning)."""
    import sys

    from torch.optim.optimizer import register_optimizer_step_pre_hook

    from strategies.optim import step_optimizer

    model = _three_layer_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(2, 3)).sum().backward()
    entered = []

    def watch(frame, event, arg):
        if event == "call" and frame.f_code.co_name == "__enter__" and "profiler" in frame.f_code.co_filename:
            entered.append(frame.f_code.co_filename)

    sys.setprofile(watch)
    try:
        step_optimizer(opt)
        opt.step()  # torch's own call, for contrast: it enters record_function
    finally:
        sys.setprofile(None)
    assert len(entered) == 1

    with torch.profiler.profile() as trace:
        step_optimizer(opt)
    assert _step_names(trace) == ["Optimizer.step#SGD.step"]

    calls = []
    handles = [opt.register_step_pre_hook(lambda *a: calls.append("pre")), opt.register_step_post_hook(lambda *a: calls.append("post")),
               register_optimizer_step_pre_hook(lambda *a: calls.append("global pre"))]
    try:
        step_optimizer(opt)
    finally:
        for handle in handles:
            handle.remove()
    assert calls == ["global pre", "pre", "post"]

    patched = torch.optim.SGD(model.parameters(), lr=0.1)
    patched.step = lambda closure=None: calls.append("instance")
    step_optimizer(patched)
    assert calls[-1] == "instance"

    scheduled = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.StepLR(scheduled, step_size=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        step_optimizer(scheduled)
        scheduler.step()
    assert scheduled.param_groups[0]["lr"] == pytest.approx(0.01)


def test_backward_and_step_go_through_a_strategy_that_overrides_them():
    """Where the strategy or its precision does more than loss.backward() / optimizer.step() (a subclass, a loss
    scaler), the prepared calls go through it; otherwise they make those calls directly, with the same result."""
    from strategies.precision import Precision
    from strategies.single_device import SingleDeviceStrategy

    calls = []

    class Counting(SingleDeviceStrategy):
        def backward(self, loss, **kwargs):
            calls.append("backward")
            super().backward(loss, **kwargs)

        def optimizer_step(self, optimizer, **kwargs):
            calls.append("step")
            return super().optimizer_step(optimizer, **kwargs)

    class CountingPrecision(Precision):
        def backward(self, loss, **kwargs):
            calls.append("precision backward")
            super().backward(loss, **kwargs)

    plain = SingleDeviceStrategy(cpu=True)
    scaled = SingleDeviceStrategy(cpu=True, precision="fp16")
    assert plain.plain_steps() and not scaled.plain_steps() and not Counting(cpu=True).plain_steps()
    scaled.precision = CountingPrecision()
    assert not scaled.plain_steps()
    results = []
    for strategy in (plain, Counting(cpu=True), scaled):
        torch.manual_seed(0)
        acc = Accelerator(strategy=strategy)
        model = acc.prepare(torch.nn.Linear(3, 1))
        opt = acc.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
        acc.backward(model(torch.ones(2, 3)).sum())
        opt.step()
        results.append(model.weight.detach().clone())
    assert calls == ["backward", "step", "precision backward"]
    assert torch.equal(results[0], results[1]) and torch.equal(results[0], results[2])
