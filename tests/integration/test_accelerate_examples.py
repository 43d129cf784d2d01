"""Accelerate's own example scripts, with only ``accelerate`` renamed to ``trainer`` in their imports, train exactly as
they do under Accelerate: the same batches on every process, the same losses, the same printed metrics and the same
TensorBoard scalars, on one process and on two (``trainer launch``, gloo).

The scripts are copies from an Accelerate release (``tests/fixtures/accelerate_examples/``, see its README), run offline
on a tiny BERT and a synthetic GLUE/MRPC (`tests.helpers.accelerate_examples`). Accelerate's side is the traces recorded
with Accelerate 1.15 (``traces.json``), or a live run when Accelerate is importable here.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.accelerate_examples import (
    CASES,
    EXAMPLES,
    TRACES,
    Case,
    Run,
    accelerate_to_trainer,
    build_offline_hub,
    differences,
    run_case,
)

RECORDED: dict[str, Any] = json.loads(TRACES.read_text())
LIVE = importlib.util.find_spec("accelerate") is not None


@pytest.fixture(scope="module")
def hub_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return build_offline_hub(tmp_path_factory.mktemp("offline_hub"))


def test_the_rename_touches_only_import_statements() -> None:
    source = ("from accelerate import Accelerator\nimport accelerate.utils as au\n    from accelerate.local_sgd import LocalSGD\n"
              "# run with accelerate launch\nprint('accelerate')\nx = accelerate_like\n")
    assert accelerate_to_trainer(source) == (
        "from trainer import Accelerator\nimport trainer.utils as au\n    from trainer.local_sgd import LocalSGD\n"
        "# run with accelerate launch\nprint('accelerate')\nx = accelerate_like\n"
    )


def test_the_copies_keep_their_license_and_every_case_was_recorded() -> None:
    for case in CASES:
        head = (EXAMPLES / case.script).read_text()[:700]
        assert "Copyright" in head and "Apache License, Version 2.0" in head, case.script
    assert set(RECORDED["cases"]) == {case.name for case in CASES}
    assert RECORDED["versions"]["accelerate"].startswith("1.15")


def test_the_comparison_sees_a_changed_batch_loss_metric_or_scalar() -> None:
    recorded = RECORDED["cases"]["tracking"]
    same = Run([[dict(f) for f in rank] for rank in recorded["ranks"]], list(recorded["results"]),
               {k: [list(p) for p in v] for k, v in recorded["scalars"].items()}, "")
    assert differences(recorded, same) == []
    for change in ("batch", "loss", "result", "scalar"):
        other = dataclasses.replace(same, ranks=[[dict(f) for f in rank] for rank in same.ranks], results=list(same.results),
                                    scalars={k: [list(p) for p in v] for k, v in same.scalars.items()})
        if change == "batch":
            other.ranks[0][0]["batch"] = "0" * 16
        elif change == "loss":
            other.ranks[0][3]["loss"] *= 1.001
        elif change == "result":
            other.results[-1] = other.results[-1].replace("accuracy", "acc")
        else:
            tag = sorted(other.scalars)[0]
            other.scalars[tag][-1][1] += 0.01
        assert len(differences(recorded, other)) == 1, change


def _params() -> list[Any]:
    marks = {1: [pytest.mark.slow], 2: [pytest.mark.slow, pytest.mark.distributed]}
    return [pytest.param(case, id=case.name, marks=marks[case.processes]) for case in CASES]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("case", _params())
def test_the_example_trains_as_under_accelerate(case: Case, hub_env: dict[str, str], tmp_path: Path) -> None:
    expected = RECORDED["cases"][case.name]
    if LIVE:
        live = run_case(case, "accelerate", hub_env, tmp_path / "accelerate")
        expected = {"ranks": live.ranks, "results": live.results, "scalars": live.scalars}
    run = run_case(case, "trainer", hub_env, tmp_path / "trainer")
    assert run.results and (run.ranks[0] or case.script.endswith("run_me.py")), "the script printed no results or never ran the model"
    found = differences(expected, run)
    assert not found, "\n".join(found[:10]) + f"\n... {len(found)} differences; the run printed:\n{run.stdout[-3000:]}"
    for name in case.files:
        assert (tmp_path / "trainer" / name).exists(), f"{case.script} should have written {name}"
