"""``lightning_scripts/swa.py`` (StochasticWeightAveraging with and without BatchNorm) ported by the rename alone.

With ``LIGHTNING_PYTHON`` set to a Python with Lightning 2.6, the same script runs there too and the learning rates
per epoch and the final weights are compared: equal without BatchNorm; with it the recomputed running statistics are
equal, while Lightning's weights differ because its extra BatchNorm epoch ends with one optimizer step (see
docs/migrating-from-lightning.md).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.integration.test_lightning_scripts import SCRIPTS, run_script


def test_swa_script(tmp_path: Path) -> None:
    out = run_script("swa.py", tmp_path)
    for run in out.values():
        assert run["n_averaged"] == 3  # the starts of epochs 2, 3 and 4 (swa_epoch_start=0.6 of 5 epochs)
        assert run["lrs"][:3] == pytest.approx([0.1, 0.09, 0.081]) and run["lrs"][4] == pytest.approx(0.05)
    assert "net.1.running_mean" in out["batch_norm"]["state"]


@pytest.mark.skipif(not os.environ.get("LIGHTNING_PYTHON"), reason="set LIGHTNING_PYTHON to a Python with Lightning 2.6")
def test_swa_matches_lightning(tmp_path: Path) -> None:
    ours = run_script("swa.py", tmp_path)
    proc = subprocess.run([os.environ["LIGHTNING_PYTHON"], str(SCRIPTS / "swa.py")], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])
    assert ours["plain_cos"] == theirs["plain_cos"] and ours["plain_linear"] == theirs["plain_linear"]
    assert ours["batch_norm"]["lrs"] == theirs["batch_norm"]["lrs"]
    for stat in ("net.1.running_mean", "net.1.running_var"):
        assert ours["batch_norm"]["state"][stat] == theirs["batch_norm"]["state"][stat]
