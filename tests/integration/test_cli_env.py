"""`trainer env`: a bug-report summary that imports no optional package."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

TRAINER = shutil.which("trainer", path=os.path.dirname(sys.executable)) or "trainer"


@pytest.mark.timeout(60)
def test_env_reports_versions_hardware_and_config(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("num_processes: 3\ncpu: true\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINWRIGHT_")}
    env.update(TRAINWRIGHT_CONFIG_FILE=str(config), TRAINWRIGHT_MIXED_PRECISION="bf16")
    result = subprocess.run([TRAINER, "env"], env=env, capture_output=True, text=True, timeout=50)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert f"- Python: {platform.python_version()}" in out
    assert f"- torch: {metadata.version('torch')}" in out
    assert f"- trainwright: {metadata.version('trainwright')}" in out
    assert f"- numpy: {metadata.version('numpy')}" in out
    assert "- CUDA available:" in out and f"- CPU cores: {os.cpu_count()}" in out
    assert f"- config file: {config}" in out and "- num_processes: 3" in out and "- cpu: True" in out
    assert "- TRAINWRIGHT_MIXED_PRECISION: bf16" in out
    for name in ("wandb", "tensorboard", "mlflow", "deepspeed"):
        assert f"- {name}: " in out


@pytest.mark.timeout(60)
def test_env_imports_no_optional_package() -> None:
    # tqdm is left out of the list: `import torch` itself imports it
    code = (
        "import sys\n"
        "from trainer.cli import main\n"
        "main(['env'])\n"
        "optional = ['wandb', 'tensorboard', 'comet_ml', 'aim', 'mlflow', 'clearml', 'dvclive', 'trackio',\n"
        "            'swanlab', 'deepspeed', 'torchmetrics', 'accelerate', 'lightning']\n"
        "print('IMPORTED', sorted(m for m in optional if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=50)
    assert result.returncode == 0, result.stderr
    assert "IMPORTED []" in result.stdout
