"""`trainer launch` and `launch_current_script`, driven through the real console script in subprocesses."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

TRAINER = shutil.which("trainer", path=os.path.dirname(sys.executable)) or "trainer"

# Writes what each worker sees to OUT/rank<N>.json, through the Accelerator.
ACCELERATOR_SCRIPT = """
import json, os, sys
from trainer import Accelerator

acc = Accelerator(process_group_timeout=60)
out = sys.argv[sys.argv.index("--out") + 1]
seen = {
    "rank": acc.process_index,
    "num_processes": acc.num_processes,
    "mixed_precision": acc.mixed_precision,
    "gradient_accumulation_steps": acc.gradient_accumulation_steps,
    "argv": sys.argv[1:],
}
with open(os.path.join(out, f"rank{acc.process_index}.json"), "w") as fh:
    json.dump(seen, fh)
acc.wait_for_everyone()
acc.end_training()
"""

# Reads only the environment: no process group, so it is cheap.
ENV_SCRIPT = """
import json, os, sys
keys = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT", "TRAINWRIGHT_LAUNCHED", "TRAINWRIGHT_STRATEGY",
        "TRAINWRIGHT_MIXED_PRECISION", "TRAINWRIGHT_CPU", "TRAINWRIGHT_GRADIENT_ACCUMULATION_STEPS",
        "TRAINWRIGHT_PG_TIMEOUT"]
out = os.environ["PROBE_OUT"]
with open(os.path.join(out, "rank" + os.environ["RANK"] + ".json"), "w") as fh:
    json.dump({k: os.environ.get(k) for k in keys}, fh)
"""


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The test's environment: no launcher variables, no user config file."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINWRIGHT_", "TORCHELASTIC_"))}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    env["TRAINWRIGHT_CONFIG_FILE"] = str(tmp_path / "no-config.yaml")
    env.update(extra)
    return env


def run_trainer(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([TRAINER, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def read_ranks(out: Path) -> dict[int, dict]:
    return {int(p.stem[4:]): json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))}


@pytest.mark.timeout(180)
def test_two_processes_seen_by_accelerator(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(ACCELERATOR_SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    args = ["launch", "--num_processes", "2", "--cpu", "--mixed_precision", "bf16", "--gradient_accumulation_steps", "4"]
    result = run_trainer([*args, str(script), "--out", str(out), "--lr", "0.1"], clean_env(tmp_path), tmp_path)
    assert result.returncode == 0, result.stderr
    ranks = read_ranks(out)
    assert sorted(ranks) == [0, 1]
    for rank, seen in ranks.items():
        assert seen["rank"] == rank
        assert seen["num_processes"] == 2
        assert seen["mixed_precision"] == "bf16"
        assert seen["gradient_accumulation_steps"] == 4
        assert seen["argv"] == ["--out", str(out), "--lr", "0.1"]


@pytest.mark.timeout(120)
def test_flags_beat_config_file_beat_defaults_with_module(tmp_path: Path) -> None:
    (tmp_path / "probe_env.py").write_text(ENV_SCRIPT)
    config = tmp_path / "cfg.yaml"
    config.write_text("num_processes: 2\ncpu: true\nmixed_precision: fp16\ngradient_accumulation_steps: 3\n")
    out = tmp_path / "out"
    out.mkdir()
    env = clean_env(tmp_path, PROBE_OUT=str(out), PYTHONPATH=str(tmp_path))
    args = ["launch", "--config_file", str(config), "--mixed_precision", "bf16", "--process_group_timeout", "45"]
    result = run_trainer([*args, "-m", "probe_env"], env, tmp_path)
    assert result.returncode == 0, result.stderr
    ranks = read_ranks(out)
    assert sorted(ranks) == [0, 1]
    for seen in ranks.values():
        assert seen["WORLD_SIZE"] == "2"
        assert seen["TRAINWRIGHT_LAUNCHED"] == "1"
        assert seen["TRAINWRIGHT_MIXED_PRECISION"] == "bf16"  # flag over config file
        assert seen["TRAINWRIGHT_GRADIENT_ACCUMULATION_STEPS"] == "3"  # config file over default
        assert seen["TRAINWRIGHT_CPU"] == "true"
        assert seen["TRAINWRIGHT_STRATEGY"] == "auto"  # default
        assert float(seen["TRAINWRIGHT_PG_TIMEOUT"]) == 45.0


@pytest.mark.timeout(120)
def test_accelerate_config_file(tmp_path: Path) -> None:
    (tmp_path / "probe_env.py").write_text(ENV_SCRIPT)
    config = tmp_path / "default_config.yaml"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config.write_text(
        textwrap.dedent(
            """\
            compute_environment: LOCAL_MACHINE
            debug: false
            distributed_type: MULTI_CPU
            downcast_bf16: 'no'
            enable_cpu_affinity: false
            gpu_ids: all
            machine_rank: 0
            main_process_ip: null
            main_process_port: {port}
            main_training_function: main
            mixed_precision: bf16
            num_machines: 1
            num_processes: 2
            rdzv_backend: static
            same_network: true
            tpu_env: []
            tpu_use_cluster: false
            tpu_use_sudo: false
            use_cpu: true
            """
        ).format(port=port)
    )
    out = tmp_path / "out"
    out.mkdir()
    env = clean_env(tmp_path, PROBE_OUT=str(out))
    result = run_trainer(["launch", "--config_file", str(config), str(tmp_path / "probe_env.py")], env, tmp_path)
    assert result.returncode == 0, result.stderr
    ranks = read_ranks(out)
    assert sorted(ranks) == [0, 1]
    assert {seen["WORLD_SIZE"] for seen in ranks.values()} == {"2"}
    assert {seen["TRAINWRIGHT_STRATEGY"] for seen in ranks.values()} == {"ddp"}
    assert {seen["TRAINWRIGHT_CPU"] for seen in ranks.values()} == {"true"}
    assert {seen["TRAINWRIGHT_MIXED_PRECISION"] for seen in ranks.values()} == {"bf16"}
    assert {seen["MASTER_PORT"] for seen in ranks.values()} == {str(port)}


@pytest.mark.faults
@pytest.mark.timeout(120)
def test_crashing_rank_ends_the_job_fast_and_is_named(tmp_path: Path) -> None:
    script = tmp_path / "crash.py"
    script.write_text(
        "import os, sys, time\n"
        "if os.environ['RANK'] == '1':\n"
        "    time.sleep(1)\n"
        "    open(sys.argv[1], 'w').write(repr(time.time()))\n"
        "    sys.exit(7)\n"
        "time.sleep(100)\n"
    )
    failed_at = tmp_path / "failed_at"
    args = ["launch", "--num_processes", "2", "--cpu", str(script), str(failed_at)]
    result = run_trainer(args, clean_env(tmp_path), tmp_path)
    elapsed = time.time() - float(failed_at.read_text())
    assert result.returncode == 7, result.stderr
    assert "rank 1 (local rank 1" in result.stderr and "exit code 7" in result.stderr
    assert "also failed: rank 0 (was killed by SIGTERM)" in result.stderr
    assert elapsed < 20, f"the job took {elapsed:.0f} s to end after rank 1 failed"


@pytest.mark.timeout(120)
def test_launch_current_script_starts_its_own_workers(tmp_path: Path) -> None:
    script = tmp_path / "selfstart.py"
    script.write_text(
        textwrap.dedent(
            """\
            import json, os, sys, time
            from trainer.launchers import launch_current_script

            if "RANK" not in os.environ:
                launch_current_script(2, cpu=True, mixed_precision="bf16")
            target = os.path.join(sys.argv[1], "rank" + os.environ["RANK"] + ".json")
            with open(target + ".tmp", "w") as fh:
                json.dump({"WORLD_SIZE": os.environ["WORLD_SIZE"], "mp": os.environ["TRAINWRIGHT_MIXED_PRECISION"],
                           "argv": sys.argv[1:]}, fh)
            os.replace(target + ".tmp", target)  # complete when it appears
            if os.environ["RANK"] == "1":
                # fail only once rank 0 has written its file: the agent stops the others when a rank fails
                deadline = time.monotonic() + 60
                while not os.path.exists(os.path.join(sys.argv[1], "rank0.json")) and time.monotonic() < deadline:
                    time.sleep(0.05)
                sys.exit(5)
            """
        )
    )
    out = tmp_path / "out"
    out.mkdir()
    result = subprocess.run(
        [sys.executable, str(script), str(out), "--flag"],
        env=clean_env(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=100,
    )  # fmt: skip
    assert result.returncode == 5, result.stderr  # the job's exit code is the failing rank's
    ranks = read_ranks(out)
    assert sorted(ranks) == [0, 1]
    assert all(s == {"WORLD_SIZE": "2", "mp": "bf16", "argv": [str(out), "--flag"]} for s in ranks.values())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--num_processes", "3", "--num_machines", "2"], "not divisible by num_machines=2"),
        (["--mixed_precision", "fp61"], "mixed_precision='fp61' is not supported"),
        (["--machine_rank", "2", "--num_machines", "2", "--num_processes", "2"], "machine_rank=2 must be smaller"),
        (["--num_machines", "2", "--num_processes", "2", "--main_process_port", "0"], "only works on one machine"),
        (["--strategy", "warp"], "strategy='warp' is not known"),
        (["--rdzv_backend", "zmq"], "rdzv_backend='zmq' is not supported"),
    ],
)
def test_bad_settings_fail_before_starting_anything(tmp_path: Path, monkeypatch, capsys, args, message) -> None:
    from trainer.cli import main

    monkeypatch.setenv("TRAINWRIGHT_CONFIG_FILE", str(tmp_path / "none.yaml"))
    script = tmp_path / "never_run.py"
    script.write_text("raise SystemExit('must not run')\n")
    assert main(["launch", *args, str(script)]) == 2
    assert message in capsys.readouterr().err


def test_missing_script_is_reported(tmp_path: Path, monkeypatch, capsys) -> None:
    from trainer.cli import main

    monkeypatch.setenv("TRAINWRIGHT_CONFIG_FILE", str(tmp_path / "none.yaml"))
    assert main(["launch", "--num_processes", "2", str(tmp_path / "missing.py")]) == 2
    assert "missing.py' does not exist" in capsys.readouterr().err


def _start_sleepers(tmp_path: Path, script_text: str) -> subprocess.Popen[str]:
    script = tmp_path / "sleeper.py"
    script.write_text(script_text)
    args = [TRAINER, "launch", "--num_processes", "2", "--cpu", str(script), str(tmp_path)]
    launcher = subprocess.Popen(args, env=clean_env(tmp_path), stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    while not all((tmp_path / f"pid{r}").exists() for r in (0, 1)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return launcher


def _assert_workers_gone(tmp_path: Path, within: float = 10) -> None:
    deadline = time.monotonic() + within
    for rank in (0, 1):
        pid = int((tmp_path / f"pid{rank}").read_text())
        while time.monotonic() < deadline and Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text():
            time.sleep(0.1)
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text(), f"rank {rank} lives on"


SLEEPER = (
    "import os, sys, time\n"
    "open(os.path.join(sys.argv[1], 'pid' + os.environ['RANK']), 'w').write(str(os.getpid()))\n"
    "time.sleep(100)\n"
)


@pytest.mark.faults
@pytest.mark.timeout(180)
@pytest.mark.parametrize("signame", ["SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2"])
def test_a_signal_to_the_launcher_stops_every_worker(tmp_path: Path, signame: str) -> None:
    import signal

    launcher = _start_sleepers(tmp_path, SLEEPER)
    try:
        launcher.send_signal(getattr(signal, signame))
        _, err = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 128 + getattr(signal, signame), err
    assert signame in err  # "stopped by signal SIGTERM", or the workers "killed by SIGUSR1" it passed on
    _assert_workers_gone(tmp_path)


@pytest.mark.faults
@pytest.mark.timeout(180)
def test_workers_die_with_a_killed_launcher(tmp_path: Path) -> None:
    import signal

    script = "from trainer import Accelerator\nacc = Accelerator(cpu=True, process_group_timeout=60)\n" + SLEEPER
    launcher = _start_sleepers(tmp_path, script)
    launcher.send_signal(signal.SIGKILL)  # no handler runs: only the kernel's parent-death signal can stop the workers
    launcher.communicate(timeout=60)
    _assert_workers_gone(tmp_path)


@pytest.mark.faults
@pytest.mark.timeout(180)
def test_a_rank_killed_by_sigkill_is_named_with_its_signal(tmp_path: Path) -> None:
    script = tmp_path / "die.py"
    script.write_text(
        "import os, signal, time\n"
        "if os.environ['RANK'] == '1':\n"
        "    time.sleep(1)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "time.sleep(100)\n"
    )
    result = run_trainer(["launch", "--num_processes", "2", "--cpu", str(script)], clean_env(tmp_path), tmp_path)
    assert result.returncode == 137, result.stderr
    assert "rank 1 (local rank 1" in result.stderr and "was killed by SIGKILL" in result.stderr
    assert "also failed: rank 0 (was killed by SIGTERM)" in result.stderr


def test_python_dash_m_trainer_is_the_cli(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "trainer", "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "{launch,config,env,test,convert-checkpoint,estimate-memory}" in result.stdout
    result = subprocess.run([sys.executable, "-m", "trainer"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
