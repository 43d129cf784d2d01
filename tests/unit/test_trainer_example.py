"""``examples/digits.py --fast`` runs end to end in one process and reports where its outputs went."""

from __future__ import annotations

import csv
import runpy
import sys
from pathlib import Path
from typing import Any

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "digits.py"


@pytest.mark.timeout(280)
def test_digits_example_fast(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    pytest.importorskip("sklearn")
    pytest.importorskip("torchmetrics")
    monkeypatch.setattr(sys, "argv", [str(EXAMPLE), "--fast", "--project-dir", str(tmp_path / "run")])
    runpy.run_path(str(EXAMPLE), run_name="__main__")
    out = capsys.readouterr().out
    assert "trained 3 epochs (60 steps) on 1 process(es)" in out
    test_acc = float(out.split("test_acc of that checkpoint ")[1].split()[0])
    assert test_acc > 0.8  # 3 epochs of a small MLP on the 8x8 digits
    checkpoints = tmp_path / "run" / "checkpoints"
    assert any((p / "manifest.json").is_file() for p in checkpoints.iterdir() if p.is_dir())
    metrics_file = Path(out.split("metrics: ")[1].split()[0])
    metrics_file = metrics_file if metrics_file.is_absolute() else Path.cwd() / metrics_file
    rows = list(csv.DictReader(metrics_file.open()))
    assert {"train_loss_step", "val_loss", "val_acc", "test_acc"} <= set(rows[0])
    assert [r["val_acc"] for r in rows if r["val_acc"]][-1]  # validation accuracy was written every epoch
