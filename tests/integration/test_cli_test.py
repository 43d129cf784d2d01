"""`trainer test`: the built-in distributed self-check, run through the real console script."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

TRAINER = shutil.which("trainer", path=os.path.dirname(sys.executable)) or "trainer"


def run_test_command(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINWRIGHT_", "TORCHELASTIC_"))}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    config = tmp_path / "config.yaml"
    config.write_text("num_processes: 2\ncpu: true\nprocess_group_timeout: 60\n")
    env["TRAINWRIGHT_CONFIG_FILE"] = str(config)
    return subprocess.run([TRAINER, "test", *args], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=150)


@pytest.mark.timeout(180)
def test_self_check_passes_on_two_processes_from_the_config_file(tmp_path: Path) -> None:
    result = run_test_command(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"settings from {tmp_path / 'config.yaml'}" in result.stdout
    assert "Trainwright self-test: 2 process(es), device cpu" in result.stdout
    for check in ("process layout", "collectives", "data sharding", "training steps"):
        assert f"[ok] {check}" in result.stdout
    assert "self-test passed on 2 process(es)" in result.stdout
    assert "trainer test: success" in result.stdout


@pytest.mark.timeout(180)
def test_self_check_reports_failure_with_a_non_zero_exit(tmp_path: Path) -> None:
    # 'single' cannot run two processes: the Accelerator in every worker refuses, so the check must fail
    result = run_test_command(tmp_path, "--strategy", "single")
    assert result.returncode != 0
    assert "strategy='single' cannot run the 2 processes" in result.stderr
    assert "trainer test: FAILED" in result.stderr
    assert "trainer test: success" not in result.stdout
