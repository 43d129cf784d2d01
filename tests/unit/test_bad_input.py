"""The catalog of misuse: each case gets a built-in exception (or one warning) naming the bad value and the fix,
and loses nothing already saved. Listed in docs/faults.md."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from trainer import Accelerator, Trainer, TrainModule

QUIET = dict(log_with=None, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)


class Net(TrainModule):
    def __init__(self, skip_every: int = 0) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(2, 1)
        self.skip_every = skip_every

    def training_step(self, batch, batch_idx):
        if self.skip_every and batch_idx % self.skip_every == 0:
            return None
        x, y = batch
        return torch.nn.functional.mse_loss(self.lin(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _loader(n: int) -> DataLoader:
    return DataLoader(TensorDataset(torch.randn(n, 2), torch.randn(n, 1)), batch_size=4)


def test_empty_training_loader_is_an_error_not_a_zero_step_success(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"the train dataloader has no batches \(dataset of 0 samples, batch_size=4"):
        Trainer(project_dir=tmp_path, max_epochs=1, **QUIET).fit(Net(), _loader(0))


def test_training_step_returning_none_warns_once_per_fit(tmp_path: Path) -> None:
    trainer = Trainer(project_dir=tmp_path, max_epochs=2, **QUIET)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(Net(skip_every=2), _loader(16))  # 4 batches per epoch, 2 skipped in each
    skipped = [w for w in caught if "training_step returned None for batch 0" in str(w.message)]
    assert len(skipped) == 1 and "every process skipped it" in str(skipped[0].message)
    assert trainer.global_step == 4  # the other batches trained


@pytest.mark.parametrize(
    ("obj", "fix"),
    [
        (42, r"an int \(42\), .*; prepare\(\) takes models, .* leave this one out of prepare\(\) and use it as it is"),
        ("text", r"a str \('text'\), .*; prepare\(\) takes models, .* leave this one out of prepare\(\)"),
        ((i for i in range(3)), r"a generator .*, so every process reads all of it \(nothing is sharded\). Wrap the data in a torch.utils.data.DataLoader \(for a generator or stream: over an IterableDataset"),
        (TensorDataset(torch.zeros(4)), r"a TensorDataset .*nothing is sharded.*Wrap the data in a torch.utils.data.DataLoader"),
    ],
    ids=["int", "str", "generator", "dataset"],
)
def test_prepare_warns_about_what_it_does_not_prepare_and_says_what_to_do(obj, fix) -> None:
    acc = Accelerator(cpu=True)
    with pytest.warns(UserWarning, match=rf"prepare\(\) got {fix}") as caught:
        assert acc.prepare(obj) is obj
    assert "which it does not prepare; it is returned unchanged" in str(caught[0].message)


@pytest.mark.parametrize("call", ["prepare_data_loader", "skip_first_batches"])
def test_a_generator_where_a_loader_goes_names_its_type_and_what_to_pass(call: str) -> None:
    acc = Accelerator(cpu=True)
    args = (1,) if call == "skip_first_batches" else ()
    with pytest.raises(TypeError, match=rf"{call} expects a torch.utils.data.DataLoader, got a generator \(<generator .*\); "
                                        r"wrap the data in a torch.utils.data.DataLoader \(a generator or stream: over an IterableDataset"):
        getattr(acc, call)((i for i in range(3)), *args)


def test_non_scalar_loss_names_its_shape() -> None:
    acc = Accelerator(cpu=True)
    model = acc.prepare(torch.nn.Linear(2, 3))
    with pytest.raises(ValueError, match=r"backward needs a scalar loss, got a tensor of shape \(5, 3\); reduce it first"):
        acc.backward(model(torch.randn(5, 2)))


def test_malformed_config_yaml_names_the_file_and_line(tmp_path: Path) -> None:
    from trainer.cli.config import load_config_file

    bad = tmp_path / "config.yaml"
    bad.write_text("num_processes: 2\nmixed_precision: [bf16\n")
    with pytest.raises(ValueError, match=r"config.yaml' is not valid YAML at line \d+, column \d+: .*recreate the file with `trainer config`"):
        load_config_file(bad)


class Exploding(Net):
    """The loss is NaN on batch 1 of every epoch."""

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        return loss * float("nan") if batch_idx == 1 else loss


def test_nonfinite_loss_skip_keeps_the_weights_finite(tmp_path: Path) -> None:
    module = Exploding()
    trainer = Trainer(project_dir=tmp_path, max_epochs=2, on_nonfinite="skip", **QUIET)
    with pytest.warns(UserWarning, match=r"training loss is not finite at step 1, epoch 0, batch 1; every process skipped"):
        trainer.fit(module, _loader(16))
    assert trainer.nonfinite_skipped == 2 and trainer.global_step == 6
    assert all(bool(torch.isfinite(p).all()) for p in module.parameters())


def test_nonfinite_loss_stop_names_the_step(tmp_path: Path) -> None:
    with pytest.raises(FloatingPointError, match=r"not finite at step 1, epoch 0, batch 1 \(this process: nan\); the parameters are still finite"):
        Trainer(project_dir=tmp_path, max_epochs=1, on_nonfinite="stop", **QUIET).fit(Exploding(), _loader(16))


def test_without_on_nonfinite_nan_trains_on_as_in_lightning(tmp_path: Path) -> None:
    module = Exploding()
    with pytest.warns(RuntimeWarning, match=r"NaN or inf at step 4 or before \(epoch 0\)"):  # read at the epoch's end
        Trainer(project_dir=tmp_path, max_epochs=1, **QUIET).fit(module, _loader(16))
    assert not all(bool(torch.isfinite(p).all()) for p in module.parameters())


class LoggingNaN(Net):
    """The loss is NaN at every step, and logged."""

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx) * float("nan")
        self.log("train_loss", loss)
        return loss


@pytest.mark.parametrize("shown_by", ["tracker", "progress bar"])
def test_a_nan_loss_read_anyway_warns_once_by_default(tmp_path: Path, shown_by: str) -> None:
    """A loss NaN at every step used to finish fit with NaN weights and no word. The value the loop reads anyway
    (the step values sent to the trackers every log_every_n_steps; the values the progress bar draws) is checked."""
    import io

    settings = dict(QUIET, log_every_n_steps=2) if shown_by == "tracker" else dict(QUIET, enable_progress_bar=True, log_every_n_steps=1000)
    callbacks = []
    if shown_by == "progress bar":
        from callbacks.progress import ProgressBar

        callbacks = [ProgressBar(file=io.StringIO(), min_interval=0.0)]
        settings.pop("enable_progress_bar")
    trainer = Trainer(project_dir=tmp_path, max_epochs=2, callbacks=callbacks, **settings)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(LoggingNaN(), _loader(16))
    nonfinite = [w for w in caught if "non-finite" in str(w.message)]
    assert len(nonfinite) == 1, [str(w.message) for w in caught]
    message = str(nonfinite[0].message)
    assert nonfinite[0].category is RuntimeWarning and "is nan at step" in message and "on_nonfinite='stop'" in message


class SilentNaN(Net):
    """The loss is NaN at every step and nothing logs it; stepped by the Trainer, or by hand (manual optimization)."""

    def __init__(self, manual: bool) -> None:
        super().__init__()
        self.automatic_optimization = not manual

    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx) * float("nan")
        if not self.automatic_optimization:
            opt = self.optimizers()
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()
        return loss


@pytest.mark.parametrize("validation", [False, True], ids=["read-at-epoch-end", "read-after-validation"])
@pytest.mark.parametrize("manual", [False, True], ids=["automatic", "manual"])
def test_a_nan_loss_nobody_logs_warns_once_where_the_loop_synchronizes(tmp_path: Path, manual: bool, validation: bool) -> None:
    """Trained to NaN weights without a word: nothing was read to the host. The losses trained on are folded into a
    flag on the device and read after a validation or at an epoch's end, where the loop synchronizes anyway."""
    module = SilentNaN(manual)
    if validation:
        module.validation_step = lambda batch, batch_idx: None
    trainer = Trainer(project_dir=tmp_path, max_epochs=2, val_check_interval=2, **QUIET)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(module, _loader(16), _loader(4) if validation else None)
    nonfinite = [w for w in caught if "non-finite" in str(w.message)]
    assert len(nonfinite) == 1, [str(w.message) for w in caught]
    step = 2 if validation else 4  # the first validation (after 2 batches), else the first epoch's end
    assert nonfinite[0].category is RuntimeWarning
    assert f"the loss training_step returned was NaN or inf at step {step} or before" in str(nonfinite[0].message)
    assert "on_nonfinite='stop'" in str(nonfinite[0].message)


def test_accelerator_mixed_precision_conflicting_with_a_strategy_instance_is_refused() -> None:
    """Was silently ignored: the instance kept its own precision and the run trained in float32."""
    from strategies import SingleDeviceStrategy
    from trainer import Accelerator

    with pytest.raises(ValueError, match=r"mixed_precision='bf16' but the SingleDeviceStrategy passed was built with precision='no'"):
        Accelerator(strategy=SingleDeviceStrategy(cpu=True), mixed_precision="bf16")
    assert Accelerator(strategy=SingleDeviceStrategy(cpu=True, precision="bf16"), mixed_precision="bf16-mixed").mixed_precision == "bf16"


def test_a_checkpoint_of_another_model_is_refused_and_nothing_is_loaded(tmp_path: Path) -> None:
    from strategies.checkpoint_io import CheckpointError

    saver = Accelerator(cpu=True)
    saver.prepare(torch.nn.Linear(3, 2), torch.nn.Linear(2, 2))
    saver.save_state(tmp_path / "ckpt")
    acc = Accelerator(cpu=True)
    first, _ = acc.prepare(torch.nn.Linear(3, 2), torch.nn.Linear(2, 7))  # the second model differs
    before = {k: v.clone() for k, v in first.state_dict().items()}
    with pytest.raises(CheckpointError, match=r"model_1\.safetensors' holds the weights of another model than this Linear: "
                       r"bias: \(2,\) in the checkpoint, \(7,\) in the model") as info:
        acc.load_state(tmp_path / "ckpt")
    assert isinstance(info.value, ValueError) and "Nothing was loaded" in str(info.value)
    assert all(torch.equal(before[k], v) for k, v in first.state_dict().items())  # the first model was not touched
    other = Accelerator(cpu=True)
    other.prepare(torch.nn.Linear(3, 2), torch.nn.Linear(2, 2))
    other.load_state(tmp_path / "ckpt")  # the checkpoint itself is intact


def test_load_from_checkpoint_of_another_architecture_names_the_keys(tmp_path: Path) -> None:
    from strategies.checkpoint_io import CheckpointError

    trainer = Trainer(max_steps=1, accelerator="cpu", project_dir=str(tmp_path), **QUIET)
    trainer.fit(Net(), _loader(8))
    trainer.save_checkpoint(tmp_path / "net")

    class Wider(Net):
        def __init__(self) -> None:
            super().__init__()
            self.extra = torch.nn.Linear(1, 1)

    with pytest.raises(CheckpointError, match=r"missing in the checkpoint: extra\.bias, extra\.weight.*strict=False"):
        Wider.load_from_checkpoint(tmp_path / "net")


def test_a_checkpoint_from_a_newer_release_names_both_versions(tmp_path: Path) -> None:
    import json

    from strategies.checkpoint_io import CheckpointError

    acc = Accelerator(cpu=True)
    acc.prepare(torch.nn.Linear(2, 2))
    path = Path(acc.save_state(tmp_path / "ckpt"))
    manifest = json.loads((path / "manifest.json").read_text())
    (path / "manifest.json").write_text(json.dumps({**manifest, "format_version": 99}))
    with pytest.raises(CheckpointError, match=r"format version 99, newer than this Trainwright reads \(3\); upgrade Trainwright"):
        acc.load_state(path)


def test_saving_to_a_read_only_filesystem_names_the_directory_and_keeps_the_rest(tmp_path: Path) -> None:
    import subprocess

    disk = tmp_path / "ro"
    disk.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m,ro", "tmpfs", str(disk)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here (needs root): {done.stderr.strip()}")
    try:
        acc = Accelerator(cpu=True)
        model = acc.prepare(torch.nn.Linear(2, 2))
        with pytest.raises(OSError, match=r"Read-only file system.*ro") as info:
            acc.save_state(disk / "ckpt")
        assert info.value.errno == 30  # EROFS
        acc.save_state(tmp_path / "elsewhere")  # the accelerator still works: save elsewhere
        assert model.weight.shape == (2, 2)
    finally:
        subprocess.run(["umount", str(disk)], check=False)


@pytest.mark.parametrize("n", [1, 3])
def test_a_loader_of_one_batch_with_more_accumulation_steps_still_steps(tmp_path: Path, n: int) -> None:
    # fewer batches than accumulate_grad_batches: the epoch's last batch still steps (as Lightning)
    trainer = Trainer(max_epochs=2, accumulate_grad_batches=4, accelerator="cpu", project_dir=str(tmp_path), **QUIET)
    trainer.fit(Net(), _loader(n))
    assert trainer.global_step == 2


def _wrong_types() -> dict:
    acc = Accelerator(cpu=True)
    model = acc.prepare(torch.nn.Linear(2, 2))
    return {
        "project_dir": (lambda: Accelerator(cpu=True, project_dir=3), TypeError, "project_dir=3 must be a directory path"),
        "save_state": (lambda: acc.save_state(3), TypeError, "output_dir=3 must be a directory path"),
        "load_state": (lambda: acc.load_state(3), TypeError, "input_dir=3 must be a directory path"),
        "save_model": (lambda: acc.save_model(model, 3), TypeError, "save_directory=3 must be a directory path"),
        "gather": (lambda: acc.gather("x"), TypeError, r"gather\(\) takes tensors .*got str 'x'; use gather_object"),
        "gather_mixed": (lambda: acc.gather({"a": torch.ones(1), "n": 3}), TypeError, r"got int 3; use gather_object"),
        "reduce": (lambda: acc.reduce([1.0]), TypeError, r"reduce\(\) takes tensors .*got float 1.0"),
        "pad": (lambda: acc.pad_across_processes("x"), TypeError, r"pad_across_processes\(\) takes tensors"),
        "broadcast": (lambda: acc.broadcast(3), TypeError, r"got int 3; use broadcast_object"),
        "clip": (lambda: acc.clip_grad_norm_(model.parameters(), "1"), TypeError, "max_norm='1' must be a number"),
        "backward": (lambda: acc.backward("x"), TypeError, "backward needs the loss tensor, got str 'x'"),
        "accumulate": (lambda: acc.accumulate("x").__enter__(), TypeError, r"accumulate\(\) takes the prepared models.*\['x'\]"),
        "log": (lambda: acc.log("x"), TypeError, r"log\(\) takes a dict .*got str"),
        "unwrap_model": (lambda: acc.unwrap_model("x"), TypeError, r"unwrap_model\(\) takes a model .*got str"),
        "fit": (lambda: Trainer(accelerator="cpu", **QUIET).fit("x"), TypeError, r"fit\(\) needs a TrainModule, got str"),
        "fit_loader": (lambda: Trainer(accelerator="cpu", **QUIET).fit(Net(), "loader"), TypeError, "must be a torch.utils.data.DataLoader, got str"),
    }


@pytest.mark.parametrize("case", list(_wrong_types()))
def test_wrong_types_to_public_entry_points_name_the_value(case: str) -> None:
    call, kind, message = _wrong_types()[case]
    with pytest.raises(kind, match=message):
        call()
