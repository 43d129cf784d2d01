"""Accelerate's debug mode on 2 gloo processes: with `PartialState().debug` on, collectives given shapes that differ
across processes raise `DistributedOperationException` on every process (no hang); `destroy_process_group` leaves."""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.multiprocess import run_distributed


def _collectives(set_debug: bool) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from trainer import Accelerator
    from trainer.state import PartialState
    from trainer.utils import DistributedOperationException, broadcast, gather, pad_across_processes, reduce

    state = PartialState()
    result: dict[str, Any] = {"debug_at_start": state.debug}
    rank = state.process_index
    uneven = torch.ones(rank + 1)  # shape (1,) on process 0, (2,) on process 1
    result["gathered_without_debug"] = gather(uneven).shape[0] if not state.debug else None
    if set_debug:
        state.debug = True
    accelerator = Accelerator(cpu=True)
    calls = {
        "gather": lambda: gather(uneven),
        "reduce": lambda: reduce(uneven),
        "broadcast": lambda: broadcast(uneven),
        "pad_across_processes": lambda: pad_across_processes(torch.ones((2,) * (rank + 1))),
        "Accelerator.gather": lambda: accelerator.gather(uneven),
        "Accelerator.pad_across_processes": lambda: accelerator.pad_across_processes(torch.ones((2,) * (rank + 1))),
    }
    raised = {}
    for name, call in calls.items():
        try:
            call()
            raised[name] = None
        except DistributedOperationException as err:
            raised[name] = (isinstance(err, ValueError), str(err).splitlines()[0])
    result["raised"] = raised
    result["padded_in_debug"] = pad_across_processes(torch.ones(rank + 1)).shape[0]  # same number of dims: allowed
    result["gathered_in_debug"] = gather(torch.full((2,), float(rank))).tolist()
    state.debug = False
    result["gathered_after"] = gather(uneven).shape[0]
    # the defaults of Accelerate: accelerate.utils.reduce means, Accelerator.reduce sums
    result["reduced_by_default"] = (reduce(torch.tensor([rank + 1.0])).item(), accelerator.reduce(torch.tensor([rank + 1.0])).item())
    state.destroy_process_group()
    result["group_left"] = not dist.is_initialized()
    return result


@pytest.mark.timeout(300)
@pytest.mark.parametrize("by", ["attribute", "environment"])
def test_debug_mode_raises_on_mismatched_shapes(by: str) -> None:
    env = {"ACCELERATE_DEBUG_MODE": "1"} if by == "environment" else {}
    results = run_distributed(_collectives, by == "attribute", env=env)
    for result in results:
        assert result["debug_at_start"] is (by == "environment")
        assert result["reduced_by_default"] == (1.5, 3.0)
        if by == "attribute":
            assert result["gathered_without_debug"] == 3  # without debug mode, gather pads dim 0
        for name, raised in result["raised"].items():
            assert raised is not None, f"{name} did not raise in debug mode"
            assert raised[0], "DistributedOperationException is a ValueError"
        assert "shapes differ" in result["raised"]["gather"][1]
        assert "pad_across_processes" in result["raised"]["pad_across_processes"][1]
        assert result["padded_in_debug"] == 2
        assert result["gathered_in_debug"] == [0.0, 0.0, 1.0, 1.0]
        assert result["gathered_after"] == 3
        assert result["group_left"]
