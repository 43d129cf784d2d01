"""The pieces of a resume on another number of processes, in one process: loader positions in global terms, the
refusals that name the fix, the order of a sampler's generator continued on one process, derived RNG streams."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, TensorDataset

from strategies.data import prepare_data_loader
from trainer.accelerator.state import derive_rng_state


def _data(n: int = 40) -> TensorDataset:
    return TensorDataset(torch.arange(n))


def _steps(loaders: list, steps: int) -> list[list[int]]:
    """The sorted sample indices of each of the next `steps` global steps, the processes' loaders read together."""
    iterators = [iter(loader) for loader in loaders]
    return [sorted(i for it in iterators for i in next(it)[0].tolist()) for _ in range(steps)]


def _shards(processes: int, seed: int | None = 3, **kwargs: object) -> list:
    """Each process's loader, built from the same global RNG state (as processes seeded alike build theirs)."""
    loaders = []
    for rank in range(processes):
        torch.manual_seed(0)
        loader = DataLoader(_data(), batch_size=12 // processes, shuffle=True, **kwargs)  # type: ignore[arg-type]
        loaders.append(prepare_data_loader(loader, num_processes=processes, process_index=rank, seed=seed))
    return loaders


@pytest.mark.parametrize(("saved", "resumed"), [(2, 3), (3, 2), (4, 1), (1, 4)])
def test_a_position_taken_on_some_processes_resumes_on_others_at_the_same_sample(saved: int, resumed: int) -> None:
    straight = _steps(_shards(saved, drop_last=True), 3)  # (one process pads no step: the last is dropped everywhere)
    interrupted = _shards(saved, drop_last=True)
    _steps(interrupted, 2)
    state = json.loads(json.dumps(interrupted[0].state_dict()))
    assert state["samples"] == 24 and state["total_batch_size"] == 12 and state["num_processes"] == saved
    loaders = _shards(resumed, drop_last=True)
    for loader in loaders:
        loader.load_state_dict(state)
    assert _steps(loaders, 1) == straight[2:]


def test_another_global_batch_is_refused_with_the_batch_size_that_keeps_it() -> None:
    saved = _shards(2)
    _steps(saved, 1)
    state = saved[0].state_dict()
    three = prepare_data_loader(DataLoader(_data(), batch_size=6, shuffle=True), num_processes=3, process_index=0, seed=3)
    with pytest.raises(ValueError, match=r"took 12 samples a step over 2 processes, this one takes 18 over 3; .*batch_size=4 \(12 / 3"):
        three.load_state_dict(state)
    five = prepare_data_loader(DataLoader(_data(), batch_size=2, shuffle=True), num_processes=5, process_index=0, seed=3)
    with pytest.raises(ValueError, match=r"12 samples cannot be dealt evenly to 5 processes: .*divides 12 \(1, 2, 3, 4, 6, 12\)"):
        five.load_state_dict(state)
    split = prepare_data_loader(DataLoader(_data(), batch_size=6, shuffle=True), num_processes=3, process_index=0, seed=3,
                                split_batches=True)
    with pytest.raises(ValueError, match=r"batch_size=12 \(split_batches=True"):
        split.load_state_dict(state)


def test_a_custom_batch_sampler_position_is_refused_on_another_number_of_processes() -> None:
    class Batches(BatchSampler):  # a subclass: dealt whole batch by whole batch
        pass

    def loader(processes: int) -> object:
        batches = Batches(RandomSampler(_data()), batch_size=12 // processes, drop_last=False)
        return prepare_data_loader(DataLoader(_data(), batch_sampler=batches), num_processes=processes, process_index=0)

    saved = loader(2)
    next(iter(saved))  # type: ignore[call-overload]
    state = saved.state_dict()  # type: ignore[attr-defined]
    loader(2).load_state_dict(state)  # type: ignore[attr-defined]  (the same number: fine)
    with pytest.raises(ValueError, match=r"Batches\) is dealt to the processes whole batch by whole batch.*resume on 2 processes"):
        loader(3).load_state_dict(state)  # type: ignore[attr-defined]


def test_an_order_drawn_from_the_shared_generator_continues_on_one_process() -> None:
    """Without a seed, several processes draw the order from a generator of the sampler's (`ordered`); one process
    resumed from their state goes on drawing from it, through the epochs after the interrupted one too."""
    straight = _shards(2, seed=None, drop_last=True)
    reference = _steps(straight, 3) + _steps(straight, 3)  # two epochs of three steps
    assert all(len(set(step)) == 12 for step in reference)
    interrupted = _shards(2, seed=None, drop_last=True)
    _steps(interrupted, 2)
    one = prepare_data_loader(DataLoader(_data(), batch_size=12, shuffle=True, drop_last=True), seed=None)
    one.load_state_dict(json.loads(json.dumps(interrupted[0].state_dict())))
    assert _steps([one], 1) + _steps([one], 3) == reference[2:]


def test_new_processes_get_rng_streams_of_their_own_the_same_on_every_resume() -> None:
    def draws(rank: int) -> tuple[float, float, float]:
        torch.manual_seed(7), random.seed(7), np.random.seed(7)  # (the restored states of process rank % W)
        derive_rng_state(rank)
        return float(torch.rand(())), random.random(), float(np.random.rand())

    assert draws(3) == draws(3)
    assert len({draws(rank)[i] for rank in (2, 3, 4) for i in range(3)}) == 9


# ----------------------------------------------------------------------------------------------- `trainer launch`
def test_launch_passes_torchruns_elastic_settings() -> None:
    from trainer.cli.config import LaunchSettings
    from trainer.cli.launch import torchrun_arguments

    settings = LaunchSettings(num_processes=4, num_machines=2, min_machines=1, max_machines=2, rdzv_backend="c10d",
                              main_process_port=29400, max_restarts=3, monitor_interval=0.5, rdzv_conf="last_call_timeout=5",
                              rdzv_join_timeout=30)
    args = torchrun_arguments(settings, "train.py", ["--lr", "1"])
    flags = dict(zip(args[:-3:2], args[1:-3:2]))
    assert flags == {"--nnodes": "1:2", "--nproc-per-node": "2", "--max-restarts": "3", "--monitor-interval": "0.5",
                     "--rdzv-backend": "c10d", "--rdzv-endpoint": "127.0.0.1:29400", "--rdzv-id": "trainwright",
                     "--rdzv-conf": "join_timeout=30,last_call_timeout=5"}
    assert args[-3:] == ["train.py", "--lr", "1"]
    plain = dict(zip(*[iter(torchrun_arguments(LaunchSettings(num_processes=2), "t.py", [])[:-1])] * 2))
    assert plain["--nnodes"] == "1" and plain["--monitor-interval"] == "0.1"


@pytest.mark.parametrize(("changes", "message"), [
    ({"num_machines": 2, "min_machines": 1, "max_machines": 2}, r"need a rendezvous that machines can leave and join: pass --rdzv_backend c10d"),
    ({"num_machines": 2, "min_machines": 3, "rdzv_backend": "c10d"}, r"give min_machines <= num_machines <= max_machines"),
    ({"monitor_interval": 0}, r"monitor_interval=0 must be a number of seconds > 0"),
    ({"rdzv_conf": "last_call_timeout"}, r"rdzv_conf='last_call_timeout' must be key=value pairs"),
    ({"rdzv_conf": "join_timeout=5"}, r"pass it as --rdzv_join_timeout"),
])
def test_bad_elastic_settings_are_refused_naming_the_fix(changes: dict, message: str) -> None:
    from trainer.cli.config import LaunchSettings

    with pytest.raises(ValueError, match=message):
        LaunchSettings(**changes)


def test_a_job_that_may_grow_from_one_machine_needs_a_known_port() -> None:
    from trainer.cli.config import LaunchSettings
    from trainer.cli.launch import torchrun_arguments

    with pytest.raises(ValueError, match=r"max_machines=2: .* pass --main_process_port"):
        torchrun_arguments(LaunchSettings(max_machines=2, rdzv_backend="c10d"), "t.py", [])


def test_a_deepspeed_checkpoint_of_another_number_of_processes_is_refused_by_another_strategy(tmp_path: object) -> None:
    """DeepSpeed's ZeRO partitions are resharded by strategy='deepspeed' only (through DeepSpeed's universal format):
    under another strategy the engine's folder in a checkpoint of another count is refused with the way out, and
    nothing is loaded."""
    from pathlib import Path

    from trainer import Accelerator

    folder = Path(str(tmp_path)) / "state"
    acc = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    model, _ = acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    acc.save_state(folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({**manifest, "world_size": 4, "num_processes": 4}))
    (folder / "deepspeed").mkdir()  # (what strategy='deepspeed' writes its engine's files into)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight.add_(1.0)
    changed = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ValueError, match=r"strategy='deepspeed' on 4 processes and this run has 1 with strategy='\w+': .* Resume with it"):
        acc.load_state(folder)
    assert all(torch.equal(model.state_dict()[k], changed[k]) for k in changed)
    assert not all(torch.equal(before[k], changed[k]) for k in before)
    acc.end_training()


@pytest.mark.parametrize("dispatch", [False, True])
def test_an_iterable_data_sets_position_is_taken_in_steps_on_another_number_of_processes(dispatch: bool) -> None:
    from torch.utils.data import IterableDataset

    class Stream(IterableDataset):
        def __iter__(self):  # type: ignore[no-untyped-def]
            return iter(torch.arange(60).tolist())

    def shards(processes: int) -> list:
        return [prepare_data_loader(DataLoader(Stream(), batch_size=12 // processes), num_processes=processes, process_index=rank,
                                    dispatch_batches=dispatch) for rank in range(processes)]

    def steps(loaders: list, count: int) -> list[list[int]]:
        iterators = [iter(loader) for loader in loaders]
        return [sorted(i for it in iterators for i in next(it).tolist()) for _ in range(count)]

    straight = steps(shards(2), 5)
    interrupted = shards(2)
    steps(interrupted, 2)
    loaders = shards(3)
    for loader in loaders:
        loader.load_state_dict(json.loads(json.dumps(interrupted[0].state_dict())))
    assert steps(loaders, 3) == straight[2:]


def test_a_position_at_the_start_of_an_epoch_is_taken_with_any_batch() -> None:
    """Between epochs the position is the next epoch's first sample for any loader (a batch size search restores the
    run's start with loaders of the size it found)."""
    saved = _shards(2)
    for _ in saved[0]:
        pass
    state = saved[0].state_dict()
    assert state["batches_yielded"] == 0 and state["epoch"] == 1
    other = prepare_data_loader(DataLoader(_data(), batch_size=5, shuffle=True), num_processes=3, process_index=0, seed=3)
    other.load_state_dict(state)
    assert other.epoch == 1 and len(list(other)) == len(other)


def test_one_processs_order_from_the_global_rng_resumes_its_epoch_on_several_with_a_warning() -> None:
    """One process without a seed draws its order from torch's global RNG, several from a generator they share: the
    interrupted epoch is drawn again as the one process drew it; later epochs differ, and the warning says so."""
    def one() -> object:
        torch.manual_seed(0)
        return prepare_data_loader(DataLoader(_data(), batch_size=12, shuffle=True, drop_last=True), seed=None)

    straight = _steps([one()], 3)
    interrupted = one()
    _steps([interrupted], 1)
    state = json.loads(json.dumps(interrupted.state_dict()))  # type: ignore[attr-defined]
    assert set(state["order"]) == {"global"}
    two = _shards(2, seed=None, drop_last=True)
    with pytest.warns(UserWarning, match="the epochs after it are drawn differently"):
        for loader in two:
            loader.load_state_dict(state)
    assert _steps(two, 2) == straight[1:]
