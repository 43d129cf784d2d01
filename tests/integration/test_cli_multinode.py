"""Two "machines" on loopback: two `trainer launch` commands meeting through torchrun's c10d rendezvous."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

TRAINER = shutil.which("trainer", path=os.path.dirname(sys.executable)) or "trainer"

SCRIPT = """
import json, os, sys
import torch
import torch.distributed as dist
from datetime import timedelta

dist.init_process_group("gloo", timeout=timedelta(seconds=60))
total = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(total)
with open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}.json"), "w") as fh:
    json.dump({"world": dist.get_world_size(), "node": os.environ["GROUP_RANK"], "sum": total.item(),
               "launched": os.environ["TRAINWRIGHT_LAUNCHED"]}, fh)
dist.destroy_process_group()
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def clean_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINWRIGHT_", "TORCHELASTIC_"))}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    env["TRAINWRIGHT_CONFIG_FILE"] = str(tmp_path / "no-config.yaml")
    return env


def node_command(port: int, machine_rank: int, script: Path, out: Path, join_timeout: int) -> list[str]:
    return [
        TRAINER, "launch", "--cpu", "--num_processes", "2", "--num_machines", "2",
        "--machine_rank", str(machine_rank), "--main_process_ip", "127.0.0.1", "--main_process_port", str(port),
        "--rdzv_backend", "c10d", "--rdzv_join_timeout", str(join_timeout), str(script), str(out),
    ]  # fmt: skip


def run_two_nodes(tmp_path: Path, script: Path, out: Path) -> tuple[list[int], list[str]]:
    """Launch `script` on two "machines" (one `trainer launch` each); their exit codes and stderr."""
    port, env = free_port(), clean_env(tmp_path)
    nodes = [
        subprocess.Popen(node_command(port, rank, script, out, 60), env=env, stderr=subprocess.PIPE, text=True)
        for rank in (0, 1)
    ]
    try:
        errors = [node.communicate(timeout=150)[1] for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
    return [node.returncode for node in nodes], errors


@pytest.mark.timeout(180)
def test_two_nodes_on_loopback(tmp_path: Path) -> None:
    script = tmp_path / "node.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    codes, errors = run_two_nodes(tmp_path, script, out)
    assert codes == [0, 0], errors
    seen = {int(p.stem[4:]): json.loads(p.read_text()) for p in out.glob("rank*.json")}
    assert sorted(seen) == [0, 1]
    assert all(s["world"] == 2 and s["sum"] == 3.0 and s["launched"] == "1" for s in seen.values())
    assert sorted(s["node"] for s in seen.values()) == ["0", "1"]


@pytest.mark.timeout(150)
def test_a_node_that_never_joins_fails_within_the_join_timeout(tmp_path: Path) -> None:
    script = tmp_path / "node.py"
    script.write_text(SCRIPT)
    start = time.monotonic()
    result = subprocess.run(
        node_command(free_port(), 0, script, tmp_path, 5),
        env=clean_env(tmp_path), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    elapsed = time.monotonic() - start
    assert result.returncode == 1
    assert "rendezvous failed: not all 2 machine(s) joined" in result.stderr
    assert "rdzv_join_timeout=5 s" in result.stderr
    assert elapsed < 90, f"waited {elapsed:.0f} s for a join timeout of 5 s (the default is 600 s)"
    assert not list(tmp_path.glob("rank*.json"))


@pytest.mark.faults
@pytest.mark.timeout(180)
def test_a_rank_hung_on_another_machine_prints_its_stack_there(tmp_path: Path) -> None:
    from tests.integration.test_hung_rank import HUNG

    script = tmp_path / "hung.py"
    script.write_text(HUNG)
    codes, errors = run_two_nodes(tmp_path, script, tmp_path)
    assert codes[0] == 1, errors
    assert "rank(s) [1] never reached it; on other machines: [1] (asked to print their Python stacks" in errors[0]
    assert "trainer launch: rank 1 never reached the collective rank 0 waited in for 6 s" in errors[0]
    # rank 1's own machine (the second launcher) printed where it hangs
    assert "rank 1 was asked for its Python stack" in errors[1] and "in stuck_before_the_collective" in errors[1], errors[1][-3000:]
