"""Regenerate the Lightning checkpoint fixture with a real Lightning (run it with a Python that has ``lightning``):

    /path/to/lightning-venv/bin/python -m tests.helpers.lightning_checkpoint_fixture

It runs ``tests/integration/lightning_scripts/resume_lightning_ckpt.py`` under Lightning: ``write`` trains 2 epochs and
keeps the epoch-end checkpoint as ``tests/fixtures/lightning_tiny.ckpt``, ``write-mid`` the one saved at step 6 (inside
the second epoch) as ``lightning_tiny_mid.ckpt``. Recorded in ``tests/fixtures/lightning_tiny_resumed.json`` (global
step, epoch, learning rate, weights, momentum buffers, hyperparameters):

- ``from_epoch_end``: Lightning's own resume from ``lightning_tiny.ckpt`` to 3 epochs — what the converted file
  resumed here must reach;
- ``straight``: the same 3 epochs uninterrupted — what the converted mid-epoch file resumed here reaches;
- ``from_mid_epoch``: Lightning's own resume from ``lightning_tiny_mid.ckpt``, which differs (its loader has no
  ``state_dict``, so Lightning draws the epoch's first batches again; it warns so).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "tests" / "integration" / "lightning_scripts" / "resume_lightning_ckpt.py"
FIXTURES = ROOT / "tests" / "fixtures"
CKPT = FIXTURES / "lightning_tiny.ckpt"
MID = FIXTURES / "lightning_tiny_mid.ckpt"
RESUMED = FIXTURES / "lightning_tiny_resumed.json"


def _run(*args: str, cwd: str) -> dict:
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, capture_output=True, text=True, check=True)
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def main() -> None:
    import lightning

    with tempfile.TemporaryDirectory() as tmp:
        _run("write", str(CKPT), cwd=tmp)
    with tempfile.TemporaryDirectory() as tmp:
        _run("write-mid", str(MID), cwd=tmp)
    record: dict = {"lightning_version": lightning.__version__}
    for key, args in (("from_epoch_end", ("resume", str(CKPT))), ("straight", ("straight", "-")), ("from_mid_epoch", ("resume", str(MID)))):
        with tempfile.TemporaryDirectory() as tmp:
            record[key] = _run(*args, cwd=tmp)
    RESUMED.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {CKPT} ({CKPT.stat().st_size} bytes), {MID} ({MID.stat().st_size} bytes) and {RESUMED}")


if __name__ == "__main__":
    main()
