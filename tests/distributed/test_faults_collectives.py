"""Gathering tensors whose dtypes differ across ranks raises ValueError on every rank (real 2-process gloo)."""

from __future__ import annotations

import pytest

from tests.helpers.multiprocess import run_distributed

pytestmark = [pytest.mark.distributed]


def _gather_mismatched_dtypes() -> str:
    import torch
    import torch.distributed as dist

    from strategies import collectives

    dist.init_process_group("gloo", init_method="env://")
    rank = dist.get_rank()
    t = torch.ones(3, dtype=torch.float32) if rank == 0 else torch.ones(3, dtype=torch.int64)
    try:
        collectives.gather_tensor(t)
    except ValueError as err:
        return str(err)
    return "no error"


def test_gather_mismatched_dtypes_raises_on_every_rank():
    messages = run_distributed(_gather_mismatched_dtypes, nprocs=2, timeout=120)
    for msg in messages:
        assert "rank 0: torch.float32" in msg and "rank 1: torch.int64" in msg, msg


def _mismatched_collectives():
    import torch
    import torch.distributed as dist

    from trainer import Accelerator

    acc = Accelerator(cpu=True)
    try:
        if acc.process_index == 0:
            dist.all_reduce(torch.ones(3))
        else:
            dist.broadcast(torch.ones(5, dtype=torch.int64), src=0)
    except RuntimeError as err:
        return str(err)
    return "no error"


def test_debug_mode_names_mismatched_collectives() -> None:
    # the rank that detects it raises at once; its peer may then wait out the (here short) process-group timeout
    results = run_distributed(_mismatched_collectives, env={"TRAINWRIGHT_DEBUG_COLLECTIVES": "1", "TRAINWRIGHT_PG_TIMEOUT": "10"}, timeout=120)
    named = [m for m in results if "Detected mismatch between collectives on ranks" in m]
    assert named and all("ALLREDUCE" in m and "BROADCAST" in m for m in named), results


def _different_dataset_lengths() -> dict:
    import torch
    from torch.utils.data import DataLoader

    from trainer import Accelerator, Trainer

    acc = Accelerator(cpu=True)
    out = {}
    try:
        acc.prepare(DataLoader(list(range(8 + acc.process_index)), batch_size=2))  # 8 samples on rank 0, 9 on rank 1
        out["accelerator"] = "no error"
    except ValueError as err:
        out["accelerator"] = str(err)
    out["same_length_still_works"] = len(acc.prepare(DataLoader(list(range(8)), batch_size=2)))
    out["alive"] = acc.reduce(torch.ones(1)).item()  # the process group survived the refusal
    try:
        from torch.utils.data import TensorDataset

        from tests.unit.test_trainer_module import QUIET, Base

        n = 6 + 2 * acc.process_index
        Trainer(accelerator="cpu", max_epochs=1, **QUIET).fit(Base(), DataLoader(TensorDataset(torch.randn(n, 2), torch.randn(n, 1)), batch_size=2))
        out["trainer"] = "no error"
    except ValueError as err:
        out["trainer"] = str(err)
    return out


def test_ranks_with_different_dataset_lengths_are_refused_instead_of_hanging():
    for result in run_distributed(_different_dataset_lengths, nprocs=2, timeout=120):
        assert "has [8, 9] samples on processes 0..1" in result["accelerator"]
        assert "pass the whole data set on every process" in result["accelerator"]
        assert result["same_length_still_works"] == 2 and result["alive"] == 2.0
        assert "has [6, 8] samples" in result["trainer"]


def _save_and_load_in_a_directory_per_process(tmp: str) -> list[str]:
    import os
    import tempfile

    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from trainer import Accelerator

    acc = Accelerator(cpu=True)
    loader = acc.prepare(DataLoader(TensorDataset(torch.arange(32.0)), batch_size=4))
    next(iter(loader))
    errors = []
    mine = tempfile.mkdtemp(dir=tmp)  # each process its own directory, as Accelerate's data-loop test does
    for call in (acc.save_state, acc.load_state):
        try:
            call(mine)
        except ValueError as err:
            errors.append(str(err))
    shared = os.path.join(tmp, "shared")
    acc.save_state(shared)  # the same path everywhere: saved and loaded
    acc.load_state(shared)
    return errors


def test_a_directory_per_process_is_refused_on_every_rank_before_anything_is_written(tmp_path) -> None:
    # before: rank 0 wrote the manifest into its directory only; rank 1's load_state found "no manifest.json" and
    # raised while rank 0 waited in a collective, which failed with gloo's "Connection reset by peer"
    for errors in run_distributed(_save_and_load_in_a_directory_per_process, str(tmp_path), nprocs=2, timeout=180):
        assert len(errors) == 2, errors
        for what, message in zip(("save_state", "load_state"), errors):
            assert message.startswith(f"{what}() got a different directory on each process (rank 0 '{tmp_path}"), message
            assert "Pass the same path on every process: a tempfile.TemporaryDirectory() made on each process is not" in message
    per_process = [d for d in tmp_path.iterdir() if d.name != "shared"]
    assert len(per_process) == 2 and not any(any(d.iterdir()) for d in per_process)  # nothing was written into them


def _a_rank_hung_on_a_mesh_group() -> dict[str, object]:
    import time

    import torch
    import torch.distributed as dist

    from strategies import FSDPStrategy
    from strategies.mesh import ParallelDims
    from trainer import Accelerator

    acc = Accelerator(strategy=FSDPStrategy(parallel_dims=ParallelDims(world_size=2, dp_shard=1, tp=2), cpu=True, timeout=3))
    mesh = acc.strategy.device_mesh
    assert mesh is not None

    def seconds(group: object) -> float:
        return float(group._get_backend(torch.device("cpu")).options._timeout.total_seconds())  # type: ignore[attr-defined]

    # every group the run made: the mesh's dimensions, the flattened data-parallel one, the background saves' own
    timeouts = {name: seconds(mesh[name].get_group()) for name in ("dp_replicate", "dp_shard", "tp", "dp")}
    timeouts["background save"] = seconds(acc.checkpoints._background_group())
    if dist.get_rank() == 1:
        time.sleep(8)  # hung before the collective, past the 3 s timeout
        return {"timeouts": timeouts}
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(1), group=mesh["tp"].get_group())
    except RuntimeError as err:
        return {"timeouts": timeouts, "waited": time.monotonic() - start, "error": str(err)}
    return {"timeouts": timeouts, "waited": time.monotonic() - start, "error": None}


@pytest.mark.timeout(120)
def test_the_groups_a_run_makes_time_out_as_its_process_group_does() -> None:
    # torch gives every group after the default one its backend's default timeout (30 minutes for gloo, 10 for NCCL):
    # before, a rank hung before a tensor-parallel collective held the others half an hour, whatever the run's timeout
    waiting, hung = run_distributed(_a_rank_hung_on_a_mesh_group, nprocs=2, timeout=100, fresh=True)
    for result in (waiting, hung):
        assert result["timeouts"] == {"dp_replicate": 3.0, "dp_shard": 3.0, "tp": 3.0, "dp": 3.0, "background save": 3.0}
    assert waiting["error"] is not None and "Timed out" in str(waiting["error"]), waiting
    assert float(waiting["waited"]) < 15  # type: ignore[arg-type]
