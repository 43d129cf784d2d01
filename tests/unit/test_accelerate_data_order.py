"""One process sees the batches Accelerate 1.15 gives, and leaves torch's global RNG as Accelerate does after each.

The expected traces were recorded from Accelerate itself by `tests/helpers/data_order_trace.py` (see there) into
`tests/fixtures/accelerate_data_order.json`; the two-process half is checked in
`tests/distributed/test_accelerate_data_order_ddp.py`. Where `accelerate` is installed the traces are also
compared live. Mid-epoch resume, which Accelerate does not redraw exactly, is checked against our own uninterrupted
runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, RandomSampler, TensorDataset

from strategies.data import prepare_data_loader
from tests.helpers import data_order_trace as dot

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "accelerate_data_order.json"
RECORDED = json.loads(FIXTURE.read_text())


def _same_torch() -> None:
    recorded, ours = RECORDED["torch"].split(".")[:2], torch.__version__.split(".")[:2]
    if recorded != ours:
        pytest.skip(f"the traces were recorded with torch {RECORDED['torch']}; this is {torch.__version__} (draws may differ)")


def test_the_fixture_covers_every_case():
    assert RECORDED["framework"] == "accelerate 1.15.0"
    assert set(RECORDED["1"]) == set(RECORDED["2"]) == set(dot.CASES)


@pytest.mark.parametrize("case", dot.CASES)
def test_one_process_matches_accelerate(case):
    _same_torch()
    expected = RECORDED["1"][case]
    got = [dot.trace("trainer", case)]
    if ("1", case) in dot.KNOWN_DIFFERENCES:
        assert "error" in expected[0] and "error" not in got[0], dot.KNOWN_DIFFERENCES["1", case]
        return
    assert dot.differences(expected, got) == []


def test_live_against_installed_accelerate(tmp_path):
    accelerate = pytest.importorskip("accelerate")
    if not accelerate.__version__.startswith("1.15."):
        pytest.skip(f"accelerate {accelerate.__version__} is installed; the traces compare with 1.15")
    out = tmp_path / "live.json"
    script = Path(dot.__file__)
    proc = subprocess.run([sys.executable, str(script), "--framework", "accelerate", "--out", str(out)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    live = json.loads(out.read_text())
    assert live["1"] == RECORDED["1"] and live["2"] == RECORDED["2"]


# --- exact mid-epoch resume on top of Accelerate's order ------------------------------------------------------------

def _ids(batch) -> list[int]:
    return batch[0].tolist() if isinstance(batch, (list, tuple)) else batch.tolist()


def _make(kind: str, num_processes: int = 1, process_index: int = 0) -> DataLoader:
    data = TensorDataset(torch.arange(23))
    if kind == "shuffle":  # draws its order from torch's global RNG
        loader = DataLoader(data, batch_size=3, shuffle=True)
    elif kind == "generator":  # from the user's generator (as the script builds it anew when it restarts)
        loader = DataLoader(data, batch_size=3, shuffle=True, generator=torch.Generator().manual_seed(5))
    elif kind == "replacement":
        loader = DataLoader(data, batch_size=3, sampler=RandomSampler(data, replacement=True, num_samples=40))
    elif kind == "custom":  # a batch sampler of its own drawing from the global RNG
        loader = DataLoader(data, batch_sampler=dot.Buckets(23))
    else:
        loader = DataLoader(data, batch_size=3, shuffle=True, num_workers=1)
    return prepare_data_loader(loader, num_processes=num_processes, process_index=process_index, seed=None,
                               even_batches=kind != "custom")


def _run(loader, epochs: range, stop: tuple[int, int] | None = None):
    """Batches and the RNG after each, dropout drawn in between; with ``stop``, returns the loader's state where
    batch ``stop[1]`` of epoch ``stop[0]`` comes next (taken inside the loop, as `save_state` is)."""
    seen = []
    for epoch in epochs:
        if (epoch, 0) == stop:
            return seen, loader.state_dict()
        for i, batch in enumerate(loader):
            seen.append((epoch, _ids(batch), dot.rng_hash()))
            torch.rand(2)
            if (epoch, i + 1) == stop:
                return seen, loader.state_dict()
    return seen, None


@pytest.mark.parametrize("kind", ["shuffle", "generator", "replacement", "custom", "workers"])
@pytest.mark.parametrize("stop", [(1, 2), (1, 0), (0, 3)])
@pytest.mark.parametrize("process_index", [0, 1])
def test_mid_epoch_resume_continues_the_uninterrupted_run(kind, stop, process_index):
    if kind == "workers" and (stop != (1, 2) or process_index):
        pytest.skip("one workers case is enough (each starts processes)")
    num_processes = 2
    torch.manual_seed(0)
    whole, _ = _run(_make(kind, num_processes, process_index), range(3))

    torch.manual_seed(0)
    first, state = _run(_make(kind, num_processes, process_index), range(3), stop=stop)
    state = json.loads(json.dumps(state))  # what save_state writes
    rng = torch.get_rng_state()  # what save_state saves

    torch.manual_seed(123)  # a new process: another RNG until load_state restores it
    resumed = _make(kind, num_processes, process_index)
    resumed.load_state_dict(state)
    torch.set_rng_state(rng)
    rest, _ = _run(resumed, range(stop[0], 3))
    assert first + rest == whole


def test_resume_needs_the_order_it_was_saved_with():
    loader = _make("generator")
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    assert set(state["order"]) == {"generator"}
    with pytest.raises(ValueError, match="state_dict\\['order'\\]"):
        _make("generator").load_state_dict({**state, "order": {"generator": "not base64!"}})
    with pytest.raises(ValueError, match="state_dict\\['order'\\]"):
        _make("generator").load_state_dict({**state, "order": {"other": "AAAA"}})
