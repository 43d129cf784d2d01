"""A LightningCLI project ported by the rename alone (``lightning_scripts/cli_main.py`` with ``cli_config.yaml``).

The module, the datamodule and one callback are in the script; the config picks two callbacks, the optimizer and the
scheduler by class path, and the script links ``data.num_samples`` to ``model.hidden``. Each run is ``python cli_main.py
<subcommand> ...`` in a fresh directory, printing one JSON line of what it did. Set ``LIGHTNING_PYTHON`` to
a Python with Lightning 2.6 to compare the same runs with Lightning's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.lightning_rename import lightning_to_trainwright
from tests.helpers.scripts import run_python

pytest.importorskip("jsonargparse")

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).parent / "lightning_scripts"


def _prepare(cwd: Path, rename: bool = True) -> None:
    source = (SCRIPTS / "cli_main.py").read_text()
    (cwd / "cli_main.py").write_text(lightning_to_trainwright(source) if rename else source)
    shutil.copy(SCRIPTS / "cli_config.yaml", cwd / "cli_config.yaml")


def _cli(cwd: Path, *args: str, python: str = sys.executable, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    if python == sys.executable:  # forked from the tests' warm server, as a new process: the script is the subject
        proc = run_python([python, "cli_main.py", *args], cwd=cwd, env=env, timeout=180)
    else:  # another interpreter (Lightning's)
        proc = subprocess.run([python, "cli_main.py", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=180)
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def _out(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_fit_then_test_through_the_cli(tmp_path: Path) -> None:
    _prepare(tmp_path)
    fit = _out(_cli(tmp_path, "fit", "--config", "cli_config.yaml"))
    # 64 samples / batch 16 = 4 batches x 3 epochs; StepLR(step_size=1, gamma=0.5) from SGD's lr 0.05, once per epoch
    assert fit["global_step"] == 12 and fit["counted"] == 12
    assert fit["lr"] == pytest.approx(0.05 * 0.5**3)
    assert fit["hidden"] == 64 // 8  # the link from data.num_samples
    assert fit["seed"] == 7 and fit["callbacks"] == ["CountBatches", "EarlyStopping", "ModelCheckpoint"]
    assert set(fit["metrics"]) == {"train_loss", "val_loss"}
    saved = yaml.safe_load((tmp_path / "logs" / "Regressor" / "version_0" / "config.yaml").read_text())
    assert saved["trainer"]["max_epochs"] == 3 and saved["optimizer"]["class_path"] == "torch.optim.SGD"
    assert [c["class_path"] for c in saved["trainer"]["callbacks"]] == ["callbacks.EarlyStopping", "__main__.CountBatches"]

    checkpoint = tmp_path / "checkpoints" / "epoch=2-step=12"
    test = _out(_cli(tmp_path, "test", "--config", "cli_config.yaml", "--ckpt_path", str(checkpoint)))
    assert test["subcommand"] == "test" and set(test["metrics"]) == {"test_loss"}
    # the test set is the validation set and the checkpoint the last epoch's weights: the last validation's value
    assert test["metrics"]["test_loss"] == pytest.approx(fit["metrics"]["val_loss"], rel=1e-6)
    assert (tmp_path / "logs" / "Regressor" / "version_1" / "config.yaml").exists()  # a new run, a new directory


def test_print_config_round_trips(tmp_path: Path) -> None:
    _prepare(tmp_path)
    printed = _cli(tmp_path, "fit", "--config", "cli_config.yaml", "--trainer.max_epochs", "2", "--print_config").stdout
    assert not (tmp_path / "logs").exists()  # printing runs nothing
    config = yaml.safe_load(printed)
    assert config["trainer"]["max_epochs"] == 2 and config["data"]["batch_size"] == 16 and "hidden" not in config["model"]
    (tmp_path / "printed.yaml").write_text(printed)
    from_printed = _out(_cli(tmp_path, "fit", "--config", "printed.yaml"))
    shutil.rmtree(tmp_path / "logs")
    shutil.rmtree(tmp_path / "checkpoints")
    direct = _out(_cli(tmp_path, "fit", "--config", "cli_config.yaml", "--trainer.max_epochs", "2"))
    assert from_printed == direct and direct["global_step"] == 8


def test_a_wrong_key_names_the_key_and_the_file(tmp_path: Path) -> None:
    _prepare(tmp_path)
    (tmp_path / "typo.yaml").write_text("trainer:\n  max_epoch: 3\n")
    proc = _cli(tmp_path, "fit", "--config", "cli_config.yaml", "--config", "typo.yaml", check=False)
    assert proc.returncode == 2
    assert "'trainer.max_epoch'" in proc.stderr and "typo.yaml" in proc.stderr and "cli_config.yaml'" not in proc.stderr
    (tmp_path / "broken.yaml").write_text("trainer:\n  max_epochs: [3\n")
    proc = _cli(tmp_path, "fit", "--config", "broken.yaml", check=False)
    assert proc.returncode == 2 and "config file 'broken.yaml' is not valid YAML" in proc.stderr


@pytest.mark.skipif(not os.environ.get("LIGHTNING_PYTHON"), reason="set LIGHTNING_PYTHON to a Python with Lightning 2.6")
def test_the_same_runs_as_lightning(tmp_path: Path) -> None:
    ours, theirs = tmp_path / "ours", tmp_path / "lightning"
    ours.mkdir()
    theirs.mkdir()
    _prepare(ours)
    _prepare(theirs, rename=False)
    python = os.environ["LIGHTNING_PYTHON"]
    assert _out(_cli(ours, "fit", "--config", "cli_config.yaml")) == _out(_cli(theirs, "fit", "--config", "cli_config.yaml", python=python))
    ckpt_ours = ours / "checkpoints" / "epoch=2-step=12"
    ckpt_theirs = theirs / "lightning_logs" / "version_0" / "checkpoints" / "epoch=2-step=12.ckpt"
    assert _out(_cli(ours, "test", "--config", "cli_config.yaml", "--ckpt_path", str(ckpt_ours))) == _out(
        _cli(theirs, "test", "--config", "cli_config.yaml", "--ckpt_path", str(ckpt_theirs), python=python)
    )
