"""`notebook_launcher` / `debug_launcher`: run in a fresh Python process, as a notebook kernel would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

DRIVER = """
import json, os, sys
from trainer.launchers import debug_launcher, notebook_launcher

def training_function(tag, out):
    from trainer import Accelerator

    acc = Accelerator(process_group_timeout=60)
    seen = {"num_processes": acc.num_processes, "rank": acc.process_index, "mixed_precision": acc.mixed_precision,
            "device": str(acc.device)}
    with open(os.path.join(out, f"{tag}-{acc.process_index}.json"), "w") as fh:
        json.dump(seen, fh)
    acc.wait_for_everyone()
    acc.end_training()

def crashing_function():
    import torch.distributed as dist

    dist.init_process_group("gloo")
    if dist.get_rank() == 1:
        raise ValueError("rank one cannot go on")
    dist.barrier()

if __name__ == "__main__":
    out = sys.argv[1]
    notebook_launcher(training_function, ("first", out), num_processes=2, mixed_precision="bf16")
    notebook_launcher(training_function, ("second", out), num_processes=2)  # again, in the same process
    debug_launcher(training_function, ("debug", out))
    try:
        notebook_launcher(crashing_function, num_processes=2)
    except RuntimeError as err:
        print("CAUGHT:", err)
    notebook_launcher(training_function, ("after-failure", out), num_processes=2)
    assert "RANK" not in os.environ and "TRAINWRIGHT_LAUNCHED" not in os.environ, "environment leaked"
    print("DRIVER DONE")
"""


@pytest.mark.timeout(240)
def test_repeated_notebook_launches_in_one_process(tmp_path: Path) -> None:
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    out = tmp_path / "out"
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINWRIGHT_")}
    result = subprocess.run(
        [sys.executable, str(driver), str(out)], env=env, capture_output=True, text=True, timeout=220
    )
    assert result.returncode == 0, result.stderr
    assert "DRIVER DONE" in result.stdout
    assert "CAUGHT: crashing_function: rank 1 failed first: ValueError: rank one cannot go on" in result.stdout
    seen = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
    for tag, precision in (("first", "bf16"), ("second", "no"), ("debug", "no"), ("after-failure", "no")):
        for rank in (0, 1):
            got = seen[f"{tag}-{rank}"]
            assert got["num_processes"] == 2 and got["rank"] == rank, got
            assert got["mixed_precision"] == precision, got
    assert seen["debug-0"]["device"] == "cpu"


def test_one_process_runs_in_this_process(tmp_path: Path, monkeypatch) -> None:
    from trainer.launchers import notebook_launcher

    for key in [k for k in os.environ if k.startswith("TRAINWRIGHT_")]:
        monkeypatch.delenv(key)
    calls = []
    notebook_launcher(lambda x: calls.append((x, os.getpid(), os.environ["TRAINWRIGHT_MIXED_PRECISION"])), (3,),
                      num_processes=1, mixed_precision="fp16")  # fmt: skip
    assert calls == [(3, os.getpid(), "fp16")]
    assert "TRAINWRIGHT_MIXED_PRECISION" not in os.environ


def test_refuses_to_run_inside_a_launched_process(monkeypatch) -> None:
    from trainer.launchers import launch_current_script, notebook_launcher

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match="inside an already launched process"):
        notebook_launcher(print, num_processes=2)
    with pytest.raises(RuntimeError, match="inside an already launched process"):
        launch_current_script(2)


def test_bad_arguments(monkeypatch) -> None:
    from trainer.launchers import notebook_launcher

    for key in ("RANK", "WORLD_SIZE", "TRAINWRIGHT_LAUNCHED"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(ValueError, match="mixed_precision='fp61' is not supported"):
        notebook_launcher(print, num_processes=2, mixed_precision="fp61")
    with pytest.raises(ValueError, match="num_processes=0 must be an integer >= 1"):
        notebook_launcher(print, num_processes=0)
