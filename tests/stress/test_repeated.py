"""Every stress scenario in the suite: each run must end the way a user must see it end.

The default run gives each scenario one run, so ``.ci/run`` carries every check at a bounded cost; the repetitions
that find a 1-in-20 failure live outside it: ``pytest -m stress --stress-runs 10`` repeats each scenario inside
pytest, and ``python -m tests.stress --runs 50 --load 1`` runs them many times under load (the figures in
``docs/faults.md``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.stress.scenarios import SCENARIOS

pytestmark = [pytest.mark.stress, pytest.mark.distributed, pytest.mark.faults, pytest.mark.slow]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_every_run_ends_as_it_must(name: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    runs = request.config.getoption("stress_runs")
    failures = []
    for attempt in range(runs):
        problem, _ = SCENARIOS[name].run(tmp_path / str(attempt))
        if problem:
            failures.append((attempt, problem))
    assert not failures, f"{name}: {len(failures)} of {runs} runs failed: {failures}"
