"""Every stress scenario, repeated a few times in the suite: each run must end the way a user must see it end.

``python -m tests.stress --runs 50 --load 1`` runs the same scenarios many times (the figures in ``docs/faults.md``);
here each runs ``Scenario.suite_runs`` times so ``.ci/run`` carries a bounded slice of it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.stress.scenarios import SCENARIOS

pytestmark = [pytest.mark.stress, pytest.mark.distributed, pytest.mark.faults, pytest.mark.slow]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_run_ends_as_it_must(name: str, tmp_path: Path) -> None:
    scenario = SCENARIOS[name]
    failures = []
    for attempt in range(scenario.suite_runs):
        problem, _ = scenario.run(tmp_path / str(attempt))
        if problem:
            failures.append((attempt, problem))
    assert not failures, f"{name}: {len(failures)} of {scenario.suite_runs} runs failed: {failures}"
