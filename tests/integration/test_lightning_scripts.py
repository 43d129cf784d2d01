"""Lightning 2.x scripts, ported by the rename alone, run in a process of their own; each asserts on what the run observably did.

The scripts in ``lightning_scripts/`` are written as a Lightning user writes them (``import lightning.pytorch as pl``,
``from lightning.pytorch.callbacks import ModelCheckpoint``, ...). `tests.helpers.lightning_rename.lightning_to_trainwright`
replaces the import paths and class names (the migration guide's rename table) and nothing else; the renamed script runs
as ``python script.py`` in a fresh directory (`tests.helpers.scripts.run_python`: a new process without a new interpreter
start) and prints one JSON line of what it saw as its last line.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.lightning_rename import lightning_to_trainwright
from tests.helpers.scripts import run_python

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).parent / "lightning_scripts"


def run_script(name: str, cwd: Path, timeout: float = 120, args: tuple[str, ...] = ()) -> dict[str, Any]:
    """Rename `name` into `cwd`, run it there (with `args`), and return the JSON of its last output line."""
    source = (SCRIPTS / name).read_text()
    renamed = lightning_to_trainwright(source)
    assert "lightning" not in renamed.replace("Lightning", "").lower().split('"""', 2)[-1]  # nothing left to rename
    script = cwd / name
    script.write_text(renamed)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = run_python([sys.executable, str(script), *args], cwd=cwd, env=env, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_the_rename_touches_only_import_paths_and_class_names() -> None:
    source = ("import lightning as L\nimport lightning.pytorch as pl\nfrom pytorch_lightning.callbacks import ModelCheckpoint\n"
              "from lightning.pytorch.loggers import CSVLogger\nclass M(pl.LightningModule): pass\n"
              "class D(L.LightningDataModule): pass\nt = pl.Trainer(logger=CSVLogger('.'))\n")
    assert lightning_to_trainwright(source) == (
        "import trainer as L\nimport trainer as pl\nfrom callbacks import ModelCheckpoint\n"
        "from callbacks.trackers import CSVLogger\nclass M(pl.TrainModule): pass\n"
        "class D(L.DataModule): pass\nt = pl.Trainer(logger=CSVLogger('.'))\n"
    )


def test_module_with_val_test_predict(tmp_path: Path) -> None:
    out = run_script("module_val_test_predict.py", tmp_path)
    assert out["global_step"] == 12 and out["epoch"] == 3  # 4 batches x 3 epochs
    assert set(out["test"]) == {"test_acc"} and 0.0 <= out["test"]["test_acc"] <= 1.0
    assert out["predicted"] == 32 and out["batches"] == 4  # every predict sample once, batch_size 10
    assert out["fit_metrics"] == ["train_loss", "val_loss"]


def test_datamodule(tmp_path: Path) -> None:
    out = run_script("datamodule.py", tmp_path)
    assert out["calls"] == ["prepare_data", "setup:fit", "teardown:fit", "prepare_data", "setup:test", "teardown:test"]
    assert out["global_step"] == 80 and out["batch_size"] == 16 and (tmp_path / "numbers.pt").exists()
    assert out["test_mse"] < 0.05  # a linear target, learned
    assert not (tmp_path / "logs").exists() and not (tmp_path / "checkpoints").exists()  # logger=False, enable_checkpointing=False


def test_model_checkpoint_top_k_with_a_filename_template(tmp_path: Path) -> None:
    out = run_script("checkpoint_topk.py", tmp_path)
    losses = out["val_losses"]
    assert len(losses) == 4
    best_two = sorted(range(4), key=lambda e: losses[e])[:2]
    expected = {f"model-epoch={e:02d}-val_loss={losses[e]:.3f}" for e in best_two}
    assert set(out["best_k_models"]) == expected
    assert Path(out["best_model_path"]).name == f"model-epoch={best_two[0]:02d}-val_loss={losses[best_two[0]]:.3f}"
    assert out["best_model_score"] == pytest.approx(min(losses), rel=1e-6)
    assert Path(out["best_model_path"]).is_dir() and Path(out["last_model_path"]).is_dir()
    assert expected <= set(out["files"]) and len([f for f in out["files"] if f.startswith("model-")]) == 2


def test_early_stopping(tmp_path: Path) -> None:
    out = run_script("early_stopping.py", tmp_path)
    # epoch 0 sets the best; epochs 1 and 2 do not improve (lr=0): patience 2 stops after epoch 2, as in Lightning
    assert out["stopped_epoch"] == 2 and out["current_epoch"] == 3 and out["global_step"] == 12 and out["should_stop"]


def test_self_log_forms_with_torchmetrics_and_csv_logger(tmp_path: Path) -> None:
    out = run_script("logging_torchmetrics.py", tmp_path)
    assert out["log_dir"] == "logs/metrics_run/version_0"  # relative to save_dir, as Lightning
    assert out["columns"] == sorted(["step", "epoch", "train_loss_step", "train_loss_epoch", "train_acc", "a", "b", "val_loss", "val_acc"])
    rows = out["rows"]
    assert [int(r["step"]) for r in rows if r["train_loss_step"]] == [1, 3, 5, 7, 9, 11, 13, 15]  # log_every_n_steps=2, from 0
    assert [r["b"] for r in rows if r["b"]] == ["1.0", "3.0", "5.0", "7.0"] * 2  # log_dict on_step: batch_idx of those steps
    epoch_rows = [(r["step"], r["epoch"]) for r in rows if r["train_acc"]]
    assert epoch_rows == [("7", "0"), ("15", "1")]  # the epoch values, at the epoch's last step
    assert len([r for r in rows if r["val_acc"]]) == 2
    assert set(out["callback_metrics"]) == {"train_loss", "train_loss_step", "train_loss_epoch", "train_acc", "a", "b", "val_loss", "val_acc"}
    assert out["progress_bar"] == ["train_loss_epoch", "train_loss_step"]
    assert 0.0 <= out["callback_metrics"]["val_acc"] <= 1.0 and out["callback_metrics"]["train_loss"] == out["callback_metrics"]["train_loss_epoch"]


def test_manual_optimization_with_two_optimizers(tmp_path: Path) -> None:
    out = run_script("manual_two_optimizers.py", tmp_path)
    assert out["global_step"] == 20  # 5 batches x 2 epochs x 2 optimizer steps, as Lightning counts them
    assert out["backward_calls"] == 20 and out["all_changed"]  # on_after_backward runs for manual_backward too
    assert out["metrics"] == ["d_loss", "g_loss"]


def test_step_and_epoch_schedulers_with_frequency(tmp_path: Path) -> None:
    out = run_script("schedulers.py", tmp_path)
    step = out["step/2"]
    assert step["global_step"] == 24 and step["lr"] == 0.5**12  # stepped after every 2nd optimizer step
    assert step["logged"][:5] == [[0, 1.0], [1, 1.0], [2, 0.5], [3, 0.5], [4, 0.25]]  # the custom name "my_lr", as Lightning
    assert out["epoch/1"]["lr"] == 0.5**4 and out["epoch/1"]["logged"] == [[0, 1.0], [6, 0.5], [12, 0.25], [18, 0.125]]
    assert out["epoch/2"]["lr"] == 0.5**2 and out["epoch/2"]["logged"] == [[0, 1.0], [6, 1.0], [12, 0.5], [18, 0.5]]


def test_accumulation_and_clipping(tmp_path: Path) -> None:
    out = run_script("accumulate_clip.py", tmp_path)
    assert out["global_step"] == 6 and out["estimated_stepping_batches"] == 6  # ceil(10 / 4) steps per epoch, 2 epochs
    assert out["steps_seen"] == [0, 1, 2, 3, 4, 5]  # on_before_optimizer_step once per optimizer step
    assert out["norms"] == 6 and out["max_norm"] <= 0.5 + 1e-6  # clipped to gradient_clip_val


def test_loop_limits(tmp_path: Path) -> None:
    out = run_script("loop_limits.py", tmp_path)
    assert out["limits"] == {"global_step": 18, "epoch": 3, "train": 18, "val": 12, "sanity": 1,
                             "validations": [[0, 3], [0, 6], [1, 9], [1, 12], [2, 15], [2, 18]]}
    assert out["every_2"] == {"global_step": 32, "epoch": 4, "train": 32, "val": 4, "sanity": 0, "validations": [[1, 16], [3, 32]]}
    # max_steps ends the fit inside epoch 1, before its first validation, and current_epoch counts that epoch (Lightning
    # 2.6.6 gives the same dict); num_sanity_val_steps=-1 runs all 5 batches
    assert out["max_steps"] == {"global_step": 11, "epoch": 2, "train": 11, "val": 10, "sanity": 5, "validations": [[0, 4], [0, 8]]}
    # overfit_batches=2: 2 train batches an epoch and 2 validation batches (Lightning 2.x)
    assert out["overfit"] == {"global_step": 4, "epoch": 2, "train": 4, "val": 4, "sanity": 0, "validations": [[0, 2], [1, 4]]}


def test_fast_dev_run(tmp_path: Path) -> None:
    out = run_script("fast_dev_run.py", tmp_path)
    assert out["calls"] == {"train": 1, "val": 1, "test": 1, "predict": 1} and out["global_step"] == 1 and out["predictions"] == 1
    assert out["written"] == []  # no checkpoint, no logs


def test_save_hyperparameters_and_load_from_checkpoint(tmp_path: Path) -> None:
    out = run_script("hparams_load.py", tmp_path)
    assert out["hparams"] == out["loaded_hparams"] == {"hidden": 12, "lr": 0.05, "activation": "tanh"}
    assert out["override"] == {"hidden": 12, "lr": 0.5, "activation": "tanh"}
    assert out["same_weights"] and out["same_output"] and out["hidden"] == 12 and out["tanh"]


def test_fit_then_test_and_predict_from_best(tmp_path: Path) -> None:
    out = run_script("fit_test_best_predict.py", tmp_path)
    assert Path(out["best_model_path"]).name == "epoch=1-step=8"  # the monitored score is best at epoch 1
    assert out["differs_from_last"] and out["predictions_match_best"] and out["rows"] == 32
    assert out["test_loss"] == pytest.approx(out["best_score"], rel=1e-5)  # the validation data at epoch 1 (its offset is 0), best weights


def test_resume_from_last(tmp_path: Path) -> None:
    out = run_script("resume_last.py", tmp_path)
    assert out["global_step"] == 20 and out["epochs_started"] == [2, 3]
    assert out["same_weights"]  # the resumed run ends with the weights of the straight run, bit for bit
    assert out["lr"] == pytest.approx(0.01 * 0.9**4)


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_two_process_ddp(tmp_path: Path) -> None:
    out = run_script("ddp.py", tmp_path, timeout=200)
    assert out["world_size"] == 2 and out["global_step"] == 8  # 64 samples / 2 processes / batch 8 = 4 steps an epoch
    assert out["train_samples"] == 64  # this process's half, twice
    assert out["predictions"] == 64 and out["predictions_in_order"] and out["same_weights_on_ranks"]
    assert Path(out["best_model_path"]).name == "epoch=1-step=8"


# What Lightning 2.6.6 printed for optimizer_step_warmup.py (run with it in a side environment): global_step, epoch,
# the first weight, the bias, and what the hooks saw ([epoch, batch_idx, global_step, lr] per optimizer_step call;
# [gradient_clip_val, algorithm == "value", the largest gradient before clipping] per configure_gradient_clipping call)
_WARMUP_LIGHTNING = {
    "warmup": (12, 2, [2.9797070026397705, 2.9858365058898926], [-0.019476676359772682],
               [[0, 0, 0, 0.025], [0, 1, 1, 0.05], [0, 2, 2, 0.075], [0, 3, 3, 0.1], [0, 4, 4, 0.1], [0, 5, 5, 0.1],
                [1, 0, 6, 0.1], [1, 1, 7, 0.1], [1, 2, 8, 0.1], [1, 3, 9, 0.1], [1, 4, 10, 0.1], [1, 5, 11, 0.1]]),
    "warmup_accumulate": (4, 2, [1.2438055276870728, 1.7492091655731201], [-0.35497304797172546],
                          [[0, 3, 0, 0.025], [0, 5, 1, 0.05], [1, 3, 2, 0.075], [1, 5, 3, 0.1]]),
    "clipping": (12, 2, [0.006706019397825003, 0.3913227319717407], [-0.5819807648658752],
                 [[None, False, 7.27599573135376], [None, False, 15.918280601501465], [None, False, 8.846294403076172]]),
    "clipping_trainer_value": (12, 2, [0.006706019397825003, 0.3913227319717407], [-0.5819807648658752],
                               [[None, True, 7.27599573135376], [None, True, 15.918280601501465], [None, True, 8.846294403076172]]),
}


def test_optimizer_step_warmup_and_configure_gradient_clipping(tmp_path: Path) -> None:
    """Lightning's warm-up recipe (optimizer_step calling optimizer.step(closure=optimizer_closure)) with and without
    accumulation, and a configure_gradient_clipping override: the same steps, learning rates and weights as Lightning."""
    out = run_script("optimizer_step_warmup.py", tmp_path)
    for run, (global_step, epoch, weight, bias, seen) in _WARMUP_LIGHTNING.items():
        assert (out[run]["global_step"], out[run]["epoch"]) == (global_step, epoch), run
        # abs as well: the bias ends near 0 (-0.019), where another CPU's kernels moved it by 4.3e-8 (2.2e-6 relative;
        # measured with ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE, docs/testing.md); each step's lr is checked below
        close = {"rel": 1e-6, "abs": 1e-6}
        assert out[run]["weight"] == pytest.approx(weight, **close) and out[run]["bias"] == pytest.approx(bias, **close), run
        assert len(out[run]["seen"]) == global_step, run
        for got, expected in zip(out[run]["seen"], seen):
            assert [g if e is None or isinstance(e, bool) else pytest.approx(g, rel=1e-6) for g, e in zip(got, expected)] == expected, run


# What Lightning 2.6.6 printed for module_extras.py (run with it in a side environment)
_EXTRAS_LIGHTNING = json.loads(
    '{"from_datasets": [4, true, 2, [1, 2], false], "early_stopping_monitors": ["val_loss"], "recorders": 1, "after_fit": [true, false], '
    '"after_test": [true, false], "after_predict": [true, false], "calls": ["configure_callbacks", "setup", "Recorder.on_fit_start", '
    '"on_validation_model_eval", "on_validation_start", "validation_step training=False frozen=False", "on_validation_end", '
    '"on_validation_model_train", "configure_callbacks", "setup", "on_test_model_eval", "test_step training=False", '
    '"configure_callbacks", "setup", "on_predict_model_eval", "setup"], "partial_loaded": true, "strict_conflict": true, '
    '"traced": [true, true, true], "toggled": [[true, true, true, true, true, true, false, false], [true, true, true, true, true, true, '
    'true, true]]}'
)


def test_module_extras_as_lightning(tmp_path: Path) -> None:
    """toggled_optimizer, configure_callbacks (replacing the Trainer's EarlyStopping, before setup), the evaluation model
    hooks (an on_validation_model_train override keeps a frozen layer in eval mode; other submodules' modes restored),
    example_input_array with to_torchscript, strict_loading, DataModule.from_datasets: what Lightning 2.6.6 printed."""
    assert run_script("module_extras.py", tmp_path) == _EXTRAS_LIGHTNING



# What Lightning 2.6.6 printed for combined_loaders.py (run with it in a side environment)
_COMBINED_LIGHTNING = json.loads(
    "{\"dict\": {\"global_step\": 3, \"num_training_batches\": 3, \"seen\": [[0, {\"a\": [0.0, 1.0], \"b\": [100.0, 101.0]}], [1, {\"a\": ["
    "2.0, 3.0], \"b\": [102.0, 103.0]}], [2, {\"a\": [0.0, 1.0], \"b\": [104.0, 105.0]}]], \"val_seen\": [[0, 0, [10.0, 11.0]], [1, 0"
    ", [20.0, 21.0]], [1, 1, [22.0, 23.0]]], \"metrics\": [\"val_loss/dataloader_idx_0\", \"val_loss/dataloader_idx_1\"], \"weight\":"
    " 16051.525390625}, \"list\": {\"global_step\": 3, \"num_training_batches\": 3, \"seen\": [[0, {\"0\": [0.0, 1.0], \"1\": [100.0, 101"
    ".0]}], [1, {\"0\": [2.0, 3.0], \"1\": [102.0, 103.0]}], [2, {\"0\": [0.0, 1.0], \"1\": [104.0, 105.0]}]], \"val_seen\": [], \"metri"
    "cs\": [], \"weight\": 16051.525390625}, \"min_size\": {\"global_step\": 2, \"num_training_batches\": 2, \"seen\": [[0, {\"a\": [0.0, "
    "1.0], \"b\": [100.0, 101.0]}], [1, {\"a\": [2.0, 3.0], \"b\": [102.0, 103.0]}]], \"val_seen\": [], \"metrics\": [], \"weight\": -767"
    ".9849853515625}, \"max_size\": {\"global_step\": 3, \"num_training_batches\": 3, \"seen\": [[0, {\"a\": [0.0, 1.0], \"b\": [100.0, 1"
    "01.0]}], [1, {\"a\": [2.0, 3.0], \"b\": [102.0, 103.0]}], [2, {\"a\": null, \"b\": [104.0, 105.0]}]], \"val_seen\": [], \"metrics\":"
    " [], \"weight\": 16050.748046875}, \"limited\": {\"global_step\": 2, \"num_training_batches\": 2, \"seen\": [[0, {\"a\": [0.0, 1.0],"
    " \"b\": [100.0, 101.0]}], [1, {\"a\": [2.0, 3.0], \"b\": [102.0, 103.0]}]], \"val_seen\": [], \"metrics\": [], \"weight\": -767.9849"
    "853515625}}"
)


def test_several_train_loaders_and_combined_loader_modes(tmp_path: Path) -> None:
    """A dict and a list of training loaders (max_size_cycle), CombinedLoader in min_size and max_size modes and with
    limit_train_batches, and a dict of validation loaders: the batches, steps, metric names and weights Lightning 2.6.6
    gave."""
    out = run_script("combined_loaders.py", tmp_path)
    assert out.keys() == _COMBINED_LIGHTNING.keys()
    for mode, lightning in _COMBINED_LIGHTNING.items():
        got = dict(out[mode])
        # The batches, steps and names exactly; the trained weight within 2e-6 relative: between CPUs its last bits
        # differ (1.9e-7 relative at most, measured here and under other kernels: ATEN_CPU_CAPABILITY=default,
        # MKL_CBWR=COMPATIBLE), while the modes' weights differ from one another by 5e-5 relative and more.
        assert got.pop("weight") == pytest.approx(lightning["weight"], rel=2e-6), mode
        assert got == {k: v for k, v in lightning.items() if k != "weight"}, mode


def test_save_last_then_open_last_ckpt(tmp_path: Path) -> None:
    out = run_script("save_last_ckpt.py", tmp_path)
    assert out == {"exists": True, "loaded_same": True, "lr": 0.05, "resumed_step": 9}  # 3 batches x 3 epochs, 6 of them restored
    assert (tmp_path / "ckpts" / "last.ckpt").is_symlink()


@pytest.mark.parametrize(("fixture", "expected"), [("lightning_tiny.ckpt", "from_epoch_end"), ("lightning_tiny_mid.ckpt", "straight")])
def test_a_lightning_checkpoint_converted_and_resumed(tmp_path: Path, fixture: str, expected: str) -> None:
    """The fixtures are checkpoints Lightning 2.6.6 wrote with this script, at an epoch's end and at step 6 inside the
    second epoch; the expected values were recorded under Lightning by tests/helpers/lightning_checkpoint_fixture.py.
    From the epoch-end file the resumed run reaches what Lightning's own resume reached; from the mid-epoch file it
    reaches what the uninterrupted Lightning run reached (Lightning's own resume draws the epoch's first batches again)."""
    fixtures = ROOT / "tests" / "fixtures"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    convert = run_python([sys.executable, "-m", "trainer", "convert-checkpoint", str(fixtures / fixture), str(tmp_path / "converted")],
                         env=env, timeout=120)
    assert convert.returncode == 0, convert.stderr
    out = run_script("resume_lightning_ckpt.py", tmp_path, args=("resume", str(tmp_path / "converted")))
    lightning = json.loads((fixtures / "lightning_tiny_resumed.json").read_text())[expected]
    assert (out["global_step"], out["epoch"], out["hparams"]) == (lightning["global_step"], lightning["epoch"], lightning["hparams"])
    assert out["lr"] == pytest.approx(lightning["lr"], rel=1e-9)
    for name, values in lightning["weights"].items():
        assert out["weights"][name] == pytest.approx(values, abs=1e-6), name
    for mine, theirs in zip(out["momentum"], lightning["momentum"], strict=True):
        assert mine == pytest.approx(theirs, abs=1e-6)


def run_script_printing(name: str, cwd: Path) -> tuple[dict[str, Any], list[str]]:
    """`run_script`, also returning the lines the script printed before its JSON line."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    script = cwd / name
    script.write_text(lightning_to_trainwright((SCRIPTS / name).read_text()))
    proc = run_python([sys.executable, str(script)], cwd=cwd, env=env, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    *printed, last = proc.stdout.strip().splitlines()
    return dict(json.loads(last)), printed


def test_max_time_stops_inside_the_first_epoch(tmp_path: Path) -> None:
    """Lightning 2.6.6 on max_time.py (a 40 s epoch, a 1 s limit) stopped inside epoch 0 after about 1 s (47 and 46
    steps in one run here), counted the epoch (current_epoch 1), printed "Time limit reached. Elapsed time is 0:00:01.
    Signaling Trainer to stop." once per run, validated at the stop where a validation loader was given (2 batches),
    and ModelCheckpoint saved epoch=0-step=<global_step> there. The step counts depend on the clock: the test compares
    the shape. Our checkpoint is a directory without the `.ckpt` suffix (the checkpoint row of
    docs/migrating-from-lightning.md)."""
    out, printed = run_script_printing("max_time.py", tmp_path)
    stops = [line for line in printed if re.fullmatch(r"Time limit reached\. Elapsed time is 0:00:0\d\. Signaling Trainer to stop\.", line)]
    assert len(stops) == 2, printed  # 0:00:01 unless a step ran late on a busy machine
    for run, validations in (("dict", 0), ("string", 2)):
        got = out[run]
        assert got["global_step"] > 0 and got["epochs_started"] == [0] and got["current_epoch"] == 1 and got["should_stop"], run
        assert got["timers"] == 1 and got["train_elapsed"] >= 1.0 and got["time_remaining"] <= 0 and got["seconds"] < 20, run
        assert got["validations"] == validations, run
        assert got["files"] == [f"epoch=0-step={got['global_step']}"] and got["best_model_path"] == got["files"][0], run


# What Lightning 2.6.6 printed for min_epochs_early_stopping.py (run with it in a side environment)
_MIN_EPOCHS_LIGHTNING = json.loads(
    '{"no_minimum": {"stopped_epoch": 1, "current_epoch": 2, "global_step": 8, "should_stop": true, "wait_count": 1, "validated": '
    '[[0, 4], [1, 8]]}, "min_epochs": {"stopped_epoch": 4, "current_epoch": 5, "global_step": 20, "should_stop": true, "wait_count": 4, '
    '"validated": [[0, 4], [1, 8], [2, 12], [3, 16], [4, 20]]}, "min_steps": {"stopped_epoch": 5, "current_epoch": 6, "global_step": 22, '
    '"should_stop": true, "wait_count": 5, "validated": [[0, 4], [1, 8], [2, 12], [3, 16], [4, 20], [5, 22]]}, "min_steps_half_epoch": '
    '{"stopped_epoch": 2, "current_epoch": 3, "global_step": 10, "should_stop": true, "wait_count": 4, "validated": [[0, 2], [0, 4], '
    '[1, 6], [1, 8], [2, 10]]}}'
)


def test_min_epochs_and_min_steps_hold_an_early_stop(tmp_path: Path) -> None:
    """EarlyStopping asks to stop after epoch 1; min_epochs=5 and min_steps hold the stop until they are met, and a
    stop that takes effect inside an epoch validates first (the [5, 22] entry): the epochs, steps, validations and
    counters Lightning 2.6.6 gave."""
    assert run_script("min_epochs_early_stopping.py", tmp_path) == _MIN_EPOCHS_LIGHTNING


# What Lightning 2.6.6 gave for early_stopping_verbose.py: its JSON line and the lines EarlyStopping(verbose=True) logged
_VERBOSE_LIGHTNING = json.loads(
    '{"patience": {"stopped_epoch": 5, "current_epoch": 6, "best_score": 0.375, "wait_count": 2}, "threshold": {"stopped_epoch": 3, '
    '"current_epoch": 4, "best_score": 0.5, "wait_count": 1}, "divergence": {"stopped_epoch": 1, "current_epoch": 2, "best_score": 1.0, '
    '"wait_count": 0}, "divergence_min": {"stopped_epoch": 0, "current_epoch": 1, "best_score": Infinity, "wait_count": 0}}'
)
_VERBOSE_LINES_LIGHTNING = [
    "Metric val_loss improved. New best score: 1.000",
    "Metric val_loss improved by 0.500 >= min_delta = 0.02. New best score: 0.500",
    "Metric val_loss improved by 0.125 >= min_delta = 0.02. New best score: 0.375",
    "Monitored metric val_loss did not improve in the last 2 records. Best score: 0.375. Signaling Trainer to stop.",
    "Metric val_loss improved. New best score: 1.000",
    "Metric val_loss improved by 0.500 >= min_delta = 0.0. New best score: 0.500",
    "Stopping threshold reached: val_loss = 0.375 < 0.4. Signaling Trainer to stop.",
    "Metric val_loss improved. New best score: 1.000",
    "Divergence threshold reached: val_loss = 0.5 > 0.55. Signaling Trainer to stop.",
    "Divergence threshold reached: val_loss = 1.0 < 0.7. Signaling Trainer to stop.",
]


def test_early_stopping_verbose_prints_lightnings_lines(tmp_path: Path) -> None:
    """The same stops and counters as Lightning 2.6.6 and the same printed lines, to stdout (Lightning logs them to
    stderr through `logging`), except the sign of the divergence lines: ours is the one that holds (Lightning prints
    the improvement's sign); see the EarlyStopping row of docs/migrating-from-lightning.md."""
    out, printed = run_script_printing("early_stopping_verbose.py", tmp_path)
    assert out == _VERBOSE_LIGHTNING
    ours = {8: "Divergence threshold reached: val_loss = 0.5 < 0.55. Signaling Trainer to stop.",
            9: "Divergence threshold reached: val_loss = 1.0 > 0.7. Signaling Trainer to stop."}
    assert printed == [ours.get(i, line) for i, line in enumerate(_VERBOSE_LINES_LIGHTNING)]


# The predictions Lightning 2.6.6 wrote for predict_writer.py (rounded to 6 decimals), each row one sample
_PREDICTIONS_LIGHTNING = [[0.073559, 1.171571], [0.253972, 1.069595], [-0.167166, 1.121633], [-0.134011, 0.462645], [0.664402, 0.127416],
                          [0.606194, 0.15589], [-0.346261, 0.593549], [-1.720695, 1.164306], [0.154711, 0.415414], [1.211648, -0.214743]]


def test_predict_without_returning_writes_through_callbacks(tmp_path: Path) -> None:
    """predict(return_predictions=False) returns None and the writers' files hold what Lightning 2.6.6's held: a file
    per batch and loader, the epoch's predictions per loader, and a plain on_predict_batch_end's outputs. The epoch
    writer's batch_indices are empty lists here (Lightning: each batch's sample indices); see the BasePredictionWriter
    row of docs/migrating-from-lightning.md."""
    out = run_script("predict_writer.py", tmp_path)
    assert out["returned"] == [None, None]
    assert out["files"] == {"batches": [f"batch_{loader}_{i}.pt" for loader in (0, 1) for i in range(3)], "epoch": ["epoch_rank0.pt"],
                            "hook": ["hook_0.pt", "hook_1.pt", "hook_2.pt"]}
    assert out["epoch_two_loaders"] == [2, [3, 3]]
    for name in ("batches", "hook", "epoch", "expected"):
        assert out[name] == [pytest.approx(row, abs=2e-6) for row in _PREDICTIONS_LIGHTNING], name
    assert out["epoch_batch_indices"] == [[], []]  # Lightning: [[[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]] * 2
