"""Accelerate's own test scripts (``accelerate/test_utils/scripts`` of Accelerate 1.15), with only the import rename,
on two gloo processes started as ``trainer launch`` starts them (forked from the tests' warm server with the variables
it and ``torchrun`` set; a real launch is `test_accelerate_examples`'s ``nlp_example_2proc``): each passes where it
passes under Accelerate itself on this machine.

``tests/fixtures/accelerate_examples/test_utils_scripts/accelerate_results.json`` records which pass under Accelerate
(two processes, ``torchrun``, CPU); a script that fails there (it needs GPUs) is skipped with Accelerate's own error.
`GAPS` lists the scripts ours does not pass yet, why, and the error they stop at: such a script is an xfail only
while it stops at that error; another failure, or passing, fails the test (passing: move it out of the list).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.accelerate_examples import TEST_UTILS_RESULTS, first_error, run_test_utils_script

RESULTS: dict[str, Any] = json.loads(TEST_UTILS_RESULTS.read_text())

GAPS: dict[str, tuple[str, str]] = {}  # script -> (why ours does not pass yet, what its first error says)


def _params() -> list[Any]:
    params = []
    for name, result in sorted(RESULTS["scripts"].items()):
        marks: list[Any] = [pytest.mark.slow, pytest.mark.distributed]
        if not result["passed"]:
            marks.append(pytest.mark.skip(reason=f"fails under Accelerate {RESULTS['accelerate']} itself here: {result['error']}"))
        params.append(pytest.param(name, id=name, marks=marks))
    return params


def test_the_record_covers_every_copied_script() -> None:
    copied = {p.stem for p in TEST_UTILS_RESULTS.parent.glob("test_*.py")}
    assert copied == set(RESULTS["scripts"]) and RESULTS["processes"] == 2
    assert RESULTS["accelerate"].startswith("1.15")
    assert set(GAPS) <= {name for name, result in RESULTS["scripts"].items() if result["passed"]}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", _params())
def test_accelerates_test_script_passes_renamed(name: str, tmp_path: Path) -> None:
    proc = run_test_utils_script(name, "trainer", tmp_path)
    output = f"{first_error(proc)}\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    if name in GAPS:
        reason, error = GAPS[name]
        assert proc.returncode != 0, f"{name} passes now: remove it from GAPS"
        assert error in first_error(proc), f"{name} fails for another reason than the known gap:\n{output}"
        pytest.xfail(reason)
    assert proc.returncode == 0, output
