"""`trainer config`: questionnaire with piped answers, defaults, flags, file locations, Accelerate files."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import yaml

from trainer.cli import main
from trainer.cli.accelerate_config import settings_from_accelerate
from trainer.cli.config import LaunchSettings, default_config_path, load_config_file

TRAINER = shutil.which("trainer", path=os.path.dirname(sys.executable)) or "trainer"


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINWRIGHT_")}
    env.pop("XDG_CONFIG_HOME", None)
    env["HOME"] = str(tmp_path / "home")
    env.update(extra)
    return env


@pytest.mark.timeout(60)
def test_piped_answers_round_trip_through_launch_settings(tmp_path: Path) -> None:
    path = tmp_path / "cfg" / "config.yaml"
    # machines, cpu, processes (a bad answer first), strategy, precision, accumulation
    answers = "1\nyes\ntwo\n2\nddp\nbf16\n4\n"
    result = subprocess.run(
        [TRAINER, "config", "--config_file", str(path)],
        input=answers, env=clean_env(tmp_path), capture_output=True, text=True, timeout=50,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "'two' is not a whole number; try again" in result.stdout
    assert f"Configuration saved at {path}" in result.stdout
    saved = yaml.safe_load(path.read_text())
    assert saved["num_processes"] == 2 and saved["cpu"] is True and saved["strategy"] == "ddp"
    assert saved["mixed_precision"] == "bf16" and saved["gradient_accumulation_steps"] == 4
    assert load_config_file(path) == LaunchSettings(
        num_processes=2, cpu=True, strategy="ddp", mixed_precision="bf16", gradient_accumulation_steps=4
    )


@pytest.mark.timeout(60)
def test_questionnaire_multi_machine_and_empty_answers_keep_defaults(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    answers = "2\n1\n10.0.0.5\n\nc10d\n30\n\n4\n\n\n\n"
    result = subprocess.run(
        [TRAINER, "config", "--config_file", str(path)],
        input=answers, env=clean_env(tmp_path), capture_output=True, text=True, timeout=50,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert load_config_file(path) == LaunchSettings(
        num_machines=2, machine_rank=1, main_process_ip="10.0.0.5", main_process_port=29500,
        rdzv_backend="c10d", rdzv_join_timeout=30, num_processes=4,
    )  # fmt: skip


def test_default_location_env_var_then_xdg_then_home(tmp_path: Path) -> None:
    assert default_config_path({"TRAINWRIGHT_CONFIG_FILE": "/x/y.yaml", "XDG_CONFIG_HOME": "/xdg"}) == Path("/x/y.yaml")
    assert default_config_path({"XDG_CONFIG_HOME": "/xdg"}) == Path("/xdg/trainwright/default_config.yaml")
    home = Path(os.path.expanduser("~"))
    assert default_config_path({}) == home / ".config" / "trainwright" / "default_config.yaml"


@pytest.mark.timeout(60)
def test_config_default_writes_to_xdg_location_and_launch_reads_it(tmp_path: Path, monkeypatch, capsys) -> None:
    monkeypatch.delenv("TRAINWRIGHT_CONFIG_FILE", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert main(["config", "default", "--num_processes", "2", "--cpu"]) == 0
    path = tmp_path / "xdg" / "trainwright" / "default_config.yaml"
    assert load_config_file(path) == LaunchSettings(num_processes=2, cpu=True)
    # flags without an action update the existing file without asking
    assert main(["config", "--mixed_precision", "fp16"]) == 0
    assert load_config_file(path) == LaunchSettings(num_processes=2, cpu=True, mixed_precision="fp16")
    capsys.readouterr()
    assert main(["config", "show"]) == 0
    shown = capsys.readouterr().out
    assert str(path) in shown and "mixed_precision: fp16" in shown and "num_processes: 2" in shown


def test_unknown_keys_raise_a_clear_value_error(tmp_path: Path, monkeypatch, capsys) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("num_processes: 2\nnum_proceses: 4\n")
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['num_proceses'\]; valid keys are"):
        load_config_file(path)
    monkeypatch.setenv("TRAINWRIGHT_CONFIG_FILE", str(path))
    assert main(["config", "show"]) == 2
    assert "num_proceses" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- 1\n- 2\n", "must hold a YAML mapping"),
        ("num_processes: two\n", "num_processes='two' must be an integer >= 1"),
        ("mixed_precision: fp61\n", "mixed_precision='fp61' is not supported"),
        ("cpu: maybe\n", "cpu='maybe' must be true or false"),
    ],
)
def test_bad_values_in_config_files(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_config_file(path)


def test_missing_config_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist; create one with `trainer config`"):
        load_config_file(tmp_path / "nope.yaml")


def test_accelerate_config_mapping() -> None:
    multi_gpu = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "MULTI_GPU",
        "num_processes": 8,
        "num_machines": 2,
        "machine_rank": 1,
        "main_process_ip": "10.1.2.3",
        "main_process_port": 29555,
        "mixed_precision": "fp16",
        "gpu_ids": "0,1,2,3",
        "rdzv_backend": "c10d",
        "same_network": True,
        "use_cpu": False,
        "downcast_bf16": "no",
        "tpu_use_cluster": False,
    }
    assert settings_from_accelerate(multi_gpu) == LaunchSettings(
        num_processes=8, num_machines=2, machine_rank=1, main_process_ip="10.1.2.3", main_process_port=29555,
        mixed_precision="fp16", gpu_ids="0,1,2,3", rdzv_backend="c10d", strategy="ddp",
    )  # fmt: skip
    single = {"compute_environment": "LOCAL_MACHINE", "distributed_type": "NO", "mixed_precision": "no", "use_cpu": False}
    assert settings_from_accelerate(single) == LaunchSettings()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"distributed_type": "MEGA_CLUSTER"}, "distributed_type='MEGA_CLUSTER' .* is not supported; use one of"),
        ({"distributed_type": "NO", "mixed_precision": "fp8"}, "mixed_precision='fp8'"),
        ({"compute_environment": "AMAZON_SAGEMAKER"}, "compute_environment='AMAZON_SAGEMAKER' .* is not supported"),
        ({"distributed_type": "NO", "rocket_mode": True}, r"\['rocket_mode'\] that Trainwright does not know"),
    ],
)
def test_accelerate_config_errors(data: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        settings_from_accelerate(data)


def test_accelerate_tpu_only_setting_warns() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        settings_from_accelerate({"distributed_type": "NO", "downcast_bf16": "yes"})
    assert any("downcast_bf16" in str(w.message) for w in caught)
