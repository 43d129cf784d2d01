"""`prepare_data_loader`, `DataLoaderShard` and `skip_first_batches`, with ranks simulated in one process."""

from __future__ import annotations

import collections
import dataclasses
import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    IterableDataset,
    SequentialSampler,
    SubsetRandomSampler,
    TensorDataset,
)

from strategies.data import (
    DataLoaderShard,
    SeedableRandomSampler,
    find_batch_size,
    prepare_data_loader,
    send_to_device,
    skip_first_batches,
)
from strategies.sharding import last_batch_real_count


class Counting(Dataset):
    """A map-style data set that counts the samples it loads."""

    def __init__(self, n):
        self.n, self.loads = n, 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.loads += 1
        return {"x": torch.tensor([float(i)]), "i": i}


class Stream(IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))

    def __len__(self):
        return self.n


def ids(batch):
    if isinstance(batch, dict):
        return batch["i"].tolist()
    if isinstance(batch, (list, tuple)):
        return batch[-1].tolist()
    return batch.tolist()


def ranks(make_loader, num_processes, **kwargs):
    return [prepare_data_loader(make_loader(), num_processes=num_processes, process_index=r, **kwargs)
            for r in range(num_processes)]


def tensor_data(n):
    return TensorDataset(torch.randn(n, 3), torch.arange(n))


# --- the anchors through the loader ------------------------------------------------------------------------


def test_two_process_example_through_the_loader():
    data = tensor_data(22)
    loaders = ranks(lambda: DataLoader(data, batch_size=3), 2)
    assert [ids(b) for b in loaders[0]] == [[0, 1, 2], [6, 7, 8], [12, 13, 14], [18, 19, 20]]
    assert [ids(b) for b in loaders[1]] == [[3, 4, 5], [9, 10, 11], [15, 16, 17], [21, 0, 1]]
    assert [len(dl) for dl in loaders] == [4, 4]
    assert (loaders[0].batch_size, loaders[0].total_batch_size, loaders[0].total_dataset_length) == (3, 6, 22)
    assert loaders[0].remainder == 4


def test_uneven_and_drop_last_through_the_loader():
    data = tensor_data(20)
    uneven = ranks(lambda: DataLoader(data, batch_size=3), 2, even_batches=False)
    assert [[ids(b) for b in dl] for dl in uneven] == [
        [[0, 1, 2], [6, 7, 8], [12, 13, 14], [18, 19]],
        [[3, 4, 5], [9, 10, 11], [15, 16, 17]],
    ]
    assert [len(dl) for dl in uneven] == [4, 3]
    assert uneven[0].remainder == 2
    dropped = ranks(lambda: DataLoader(data, batch_size=3, drop_last=True), 2)
    assert [[ids(b) for b in dl][-1] for dl in dropped] == [[12, 13, 14], [15, 16, 17]]
    assert [len(dl) for dl in dropped] == [3, 3] and dropped[0].remainder == 6


def test_split_batches_through_the_loader():
    loaders = ranks(lambda: DataLoader(tensor_data(22), batch_size=4), 2, split_batches=True)
    assert [ids(b) for b in loaders[1]][-1] == [0, 1]
    assert [ids(b) for b in loaders[0]][-1] == [20, 21]
    assert loaders[0].batch_size == 2 and loaders[0].total_batch_size == 4
    with pytest.raises(ValueError, match=r"batch_size=3.*multiple of 2"):
        prepare_data_loader(DataLoader(tensor_data(22), batch_size=3), num_processes=2, split_batches=True)


def test_gather_for_metrics_trim_and_end_of_dataloader():
    loaders = ranks(lambda: DataLoader(tensor_data(7), batch_size=2), 2)
    gathered, flags = [], []
    for step in zip(*loaders):
        flags.append([dl.end_of_dataloader for dl in loaders])
        batch = [i for b in step for i in ids(b)]
        gathered.append(batch[: loaders[0].remainder] if loaders[0].end_of_dataloader else batch)
    assert gathered == [[0, 1, 2, 3], [4, 5, 6]]
    assert flags == [[False, False], [True, True]]
    assert [dl.end_of_dataloader for dl in loaders] == [False, False]  # the passes are over


def test_iterable_dataset_is_sharded_and_completed():
    loaders = ranks(lambda: DataLoader(Stream(7), batch_size=2), 2)
    assert [ids(b) for b in loaders[0]] == [[0, 1], [4, 5]]
    assert [ids(b) for b in loaders[1]] == [[2, 3], [6, 0]]
    assert [len(dl) for dl in loaders] == [2, 2]
    assert loaders[0].remainder == 3
    dl = prepare_data_loader(DataLoader(Stream(7), batch_size=2), num_processes=2, process_index=1)
    it = iter(dl)
    next(it)
    state = dl.state_dict()
    resumed = prepare_data_loader(DataLoader(Stream(7), batch_size=2), num_processes=2, process_index=1)
    resumed.load_state_dict(state)
    assert [ids(b) for b in resumed] == [[6, 0]]


# --- shuffling ------------------------------------------------------------------------------------------------


@settings(max_examples=40, deadline=None, database=None)
@given(n=st.integers(1, 60), batch_size=st.integers(1, 7), num_processes=st.integers(1, 4), seed=st.integers(0, 99))
def test_shuffle_same_permutation_on_every_rank(n, batch_size, num_processes, seed):
    data = tensor_data(n)
    loaders = ranks(lambda: DataLoader(data, batch_size=batch_size, shuffle=True), num_processes, seed=seed)
    orders = []
    for epoch in range(2):
        per_rank = [[ids(b) for b in dl] for dl in loaders]
        gathered = []
        for k in range(len(per_rank[0])):
            step = [i for r in range(num_processes) for i in per_rank[r][k]]
            gathered.extend(step[: loaders[0].remainder] if k == len(per_rank[0]) - 1 else step)
        expected = SeedableRandomSampler(data, seed=seed)
        expected.set_epoch(epoch)
        assert gathered == list(expected)  # the union is the epoch's permutation, each sample once
        assert sorted(gathered) == list(range(n))
        orders.append(gathered)
        assert all(dl.epoch == epoch + 1 for dl in loaders)
    if n >= 8:
        assert orders[0] != orders[1]


def test_shuffle_differs_between_epochs_and_follows_set_epoch():
    dl = prepare_data_loader(DataLoader(tensor_data(50), batch_size=5, shuffle=True), seed=3)
    first, second = [ids(b) for b in dl], [ids(b) for b in dl]
    assert first != second
    dl.set_epoch(0)
    assert [ids(b) for b in dl] == first


# --- resume -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("epoch", [0, 2])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("process_index", [0, 1])
def test_state_dict_round_trip_mid_epoch(epoch, shuffle, process_index):
    def make():
        return prepare_data_loader(DataLoader(Counting(23), batch_size=3, shuffle=shuffle), num_processes=2,
                                   process_index=process_index, seed=11)

    reference = make()
    for _ in range(epoch):
        list(reference)
    expected = [ids(b) for b in reference]

    interrupted = make()
    for _ in range(epoch):
        list(interrupted)
    it = iter(interrupted)
    for _ in range(2):
        next(it)
    state = json.loads(json.dumps(interrupted.state_dict()))
    assert state == {"epoch": epoch, "batches_yielded": 2, "seed": 11, "samples": 12, "total_batch_size": 6, "num_processes": 2}

    resumed = make()
    resumed.load_state_dict(state)
    assert len(resumed) == len(expected)  # a whole epoch, as Accelerate's loader reports it
    data = resumed.dataset
    passed = iter(resumed)
    assert len(resumed) == len(expected) - 2  # the resumed pass itself is shorter
    assert [ids(b) for b in passed] == expected[2:]
    assert data.loads == 3 * (len(expected) - 2)  # nothing of the skipped batches was loaded
    assert resumed.epoch == epoch + 1
    assert resumed.state_dict()["batches_yielded"] == 0


@pytest.mark.parametrize("workers", [{}, {"num_workers": 1}, {"num_workers": 1, "persistent_workers": True}])
def test_resume_leaves_the_rng_where_the_uninterrupted_run_has_it(workers):
    def make():
        loader = DataLoader(tensor_data(12), batch_size=2, shuffle=True, **workers)
        return prepare_data_loader(loader, seed=2)

    torch.manual_seed(0)
    interrupted = make()
    it = iter(interrupted)
    next(it), next(it)
    state, rng_at_checkpoint = interrupted.state_dict(), torch.get_rng_state()
    rest = [ids(b) for b in it]
    rng_at_end = torch.get_rng_state()

    resumed = make()
    resumed.load_state_dict(state)
    torch.set_rng_state(rng_at_checkpoint)
    assert [ids(b) for b in resumed] == rest
    assert torch.equal(torch.get_rng_state(), rng_at_end)


def test_state_at_the_last_batch_points_to_the_next_epoch():
    dl = prepare_data_loader(DataLoader(tensor_data(6), batch_size=2))
    for _ in dl:
        state = dl.state_dict()
    assert state == {"epoch": 1, "batches_yielded": 0, "seed": 0, "samples": 0, "total_batch_size": 2, "num_processes": 1}


def test_break_does_not_advance_the_epoch_and_set_epoch_drops_a_foreign_resume():
    dl = prepare_data_loader(DataLoader(tensor_data(10), batch_size=2, shuffle=True))
    for _ in dl:
        break
    assert dl.epoch == 0 and dl.state_dict()["batches_yielded"] == 1
    dl.load_state_dict({"epoch": 4, "batches_yielded": 3, "seed": 0})
    dl.set_epoch(4)
    assert len(list(dl)) == 2  # the resume position of the same epoch is kept
    dl.load_state_dict({"epoch": 4, "batches_yielded": 3, "seed": 0})
    dl.set_epoch(5)
    assert len(list(dl)) == 5  # another epoch's is dropped


@pytest.mark.parametrize("stop", [1, 2], ids=["before-the-last-batch", "at-the-last-batch"])
def test_a_pass_left_early_leaves_the_generator_as_accelerates_loader_one_batch_ahead(stop):
    """16 samples in batches of 4 over 2 processes (drop_last, so the sampler's last, empty part is drawn only when the
    batch sampler is asked past its end). Accelerate's loader reads one batch ahead: left after batch 1 of 2, it has
    asked for batch 2, not past it, so only the permutation was drawn; left at the last batch, it has asked past it."""
    generator = torch.Generator().manual_seed(3)
    data = tensor_data(16)
    dl = prepare_data_loader(DataLoader(data, batch_size=4, shuffle=True, drop_last=True, generator=generator), num_processes=2,
                             seed=None)
    for i, _ in enumerate(dl, 1):
        if i == stop:
            break
    plain = torch.Generator().manual_seed(3)
    torch.empty((), dtype=torch.int64).random_(generator=plain)  # the DataLoader iterator's base seed
    torch.randperm(16, generator=plain)
    if stop == 2:
        torch.randperm(16, generator=plain)  # the empty last part
    assert torch.equal(generator.get_state(), plain.get_state())


@pytest.mark.parametrize("bad", [{"epoch": 0}, {"epoch": -1, "batches_yielded": 0, "seed": 0}, None,
                                 {"epoch": 1.5, "batches_yielded": 0, "seed": 0}])
def test_load_state_dict_rejects_bad_input(bad):
    dl = prepare_data_loader(DataLoader(tensor_data(4), batch_size=2))
    with pytest.raises(ValueError, match="state_dict"):
        dl.load_state_dict(bad)


def test_skip_first_batches_loads_nothing_skipped_and_only_once():
    data = Counting(20)
    dl = prepare_data_loader(DataLoader(data, batch_size=2), num_processes=2, process_index=1)
    skipped = skip_first_batches(dl, 3)
    assert len(skipped) == 2
    assert [ids(b) for b in skipped] == [[14, 15], [18, 19]]
    assert data.loads == 4
    assert dl.epoch == 1  # the view and the loader share their position
    assert [ids(b) for b in skipped] == [[2, 3], [6, 7], [10, 11], [14, 15], [18, 19]]


def test_skip_first_batches_on_a_plain_loader_and_bad_count():
    data = Counting(10)
    plain = DataLoader(data, batch_size=3)
    skipped = skip_first_batches(plain, 2)
    assert isinstance(skipped, DataLoaderShard)
    assert [ids(b) for b in skipped] == [[6, 7, 8], [9]]
    assert data.loads == 4
    with pytest.raises(ValueError, match="num_batches=-1"):
        skip_first_batches(plain, -1)


# --- batched fetch -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64, torch.bool, torch.bfloat16])
def test_batched_fetch_is_bitwise_identical(dtype, monkeypatch):
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(37, 4, 3, generator=gen) * 100).to(dtype)
    data = TensorDataset(x, torch.arange(37), torch.randn(37, generator=gen))
    sampler = SeedableRandomSampler(data, seed=4)
    plain = DataLoader(data, batch_size=5, sampler=sampler)
    torch.manual_seed(7)
    expected = [[t.clone() for t in b] for b in plain]
    rng_after_plain = torch.random.get_rng_state()
    prepared = prepare_data_loader(DataLoader(data, batch_size=5, shuffle=True), seed=4)
    monkeypatch.setattr(TensorDataset, "__getitem__", lambda self, i: pytest.fail("per-sample read"))
    torch.manual_seed(7)
    got = list(prepared)
    assert torch.equal(torch.random.get_rng_state(), rng_after_plain)  # the global RNG advanced the same way
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert type(a) is type(b) and len(a) == len(b)
        for ta, tb in zip(a, b):
            assert ta.dtype == tb.dtype and ta.shape == tb.shape and ta.is_contiguous()
            assert torch.equal(ta.view(torch.uint8) if ta.dtype != torch.bool else ta,
                               tb.view(torch.uint8) if tb.dtype != torch.bool else tb)


class WithGetitems(Dataset):
    def __init__(self, n):
        self.x = torch.randn(n, 2)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "i": i}

    def __getitems__(self, idx):
        return [{"x": self.x[i], "i": i} for i in idx]


@pytest.mark.parametrize("dataset", [WithGetitems(13), Counting(13)])
@pytest.mark.parametrize("collate_fn", [None, lambda items: items])
def test_other_datasets_match_the_default_path(dataset, collate_fn):
    plain = list(DataLoader(dataset, batch_size=4, collate_fn=collate_fn))
    prepared = list(prepare_data_loader(DataLoader(dataset, batch_size=4, collate_fn=collate_fn)))
    assert repr(prepared) == repr(plain)


def test_other_samplers_keep_their_order():
    data = tensor_data(20)

    def subset_sampler():
        return SubsetRandomSampler(list(range(3, 17)), generator=torch.Generator().manual_seed(5))

    expected = [ids(b) for b in DataLoader(data, batch_size=4, sampler=subset_sampler())]
    got = [ids(b) for b in prepare_data_loader(DataLoader(data, batch_size=4, sampler=subset_sampler()))]
    assert got == expected


def test_worker_path_matches_main_process_path():
    data = tensor_data(31)
    fast = [ids(b) for b in ranks(lambda: DataLoader(data, batch_size=4, shuffle=True), 2, seed=1)[1]]
    workers = ranks(lambda: DataLoader(data, batch_size=4, shuffle=True, num_workers=2), 2, seed=1)[1]
    assert workers.num_workers == 2
    assert [ids(b) for b in workers] == fast


def test_loader_settings_are_carried_over():
    gen = torch.Generator().manual_seed(1)

    def init(worker_id):
        return None

    def collate(items):
        return items

    original = DataLoader(tensor_data(8), batch_size=2, num_workers=1, collate_fn=collate, pin_memory=False,
                          worker_init_fn=init, generator=gen, persistent_workers=True, timeout=30, prefetch_factor=3)
    dl = prepare_data_loader(original)
    assert (dl.num_workers, dl.collate_fn, dl.worker_init_fn, dl.generator) == (1, collate, init, gen)
    assert (dl.persistent_workers, dl.timeout, dl.prefetch_factor) == (True, 30, 3)
    assert isinstance(dl, DataLoader)


def test_batch_sampler_as_sampler_and_custom_batch_sampler():
    data = tensor_data(9)
    as_sampler = DataLoader(data, sampler=BatchSampler(SequentialSampler(data), 2, False), batch_size=None)
    loaders = ranks(lambda: as_sampler, 2)
    assert [ids(b) for b in loaders[0]] == [[0, 1], [4, 5], [8, 0]]
    assert [ids(b) for b in loaders[1]] == [[2, 3], [6, 7], [1, 2]]
    custom = DataLoader(data, batch_sampler=[[0], [1, 2, 3], [4, 5], [6, 7, 8]])
    assert [ids(b) for b in ranks(lambda: custom, 2)[1]] == [[1, 2, 3], [6, 7, 8]]
    with pytest.raises(ValueError, match="batch_size=None"):
        prepare_data_loader(DataLoader(data, batch_size=None), num_processes=2)
    with pytest.raises(TypeError, match="DataLoader"):
        prepare_data_loader([1, 2, 3])
    with pytest.raises(ValueError, match="process_index=2"):
        prepare_data_loader(DataLoader(data), num_processes=2, process_index=2)


def test_remainder_matches_the_pure_function():
    for n in range(1, 15):
        dl = prepare_data_loader(DataLoader(tensor_data(n), batch_size=3, drop_last=n % 2 == 0), num_processes=2)
        assert dl.remainder == last_batch_real_count(n, 3, 2, drop_last=n % 2 == 0)


# --- device placement ------------------------------------------------------------------------------------------------

Pair = collections.namedtuple("Pair", "a b")


@dataclasses.dataclass(frozen=True)
class Frozen:
    x: torch.Tensor
    tag: str


def test_send_to_device_nested():
    marker = object()
    obj = {"t": torch.ones(2), "l": [torch.zeros(1), (Pair(torch.ones(1), "s"),)], "d": Frozen(torch.ones(3), "k"),
           "o": marker}
    moved = send_to_device(obj, "meta")
    assert moved["t"].device.type == "meta" and moved["l"][0].device.type == "meta"
    pair = moved["l"][1][0]
    assert type(pair) is Pair and pair.a.device.type == "meta" and pair.b == "s"
    assert isinstance(moved["d"], Frozen) and moved["d"].x.device.type == "meta" and moved["d"].tag == "k"
    assert moved["o"] is marker
    assert obj["t"].device.type == "cpu"


def test_batches_go_to_the_device_unless_opted_out():
    data = tensor_data(4)
    placed = prepare_data_loader(DataLoader(data, batch_size=2), device="meta")
    assert all(t.device.type == "meta" for b in placed for t in b)
    kept = prepare_data_loader(DataLoader(data, batch_size=2), device="meta", put_on_device=False)
    assert all(t.device.type == "cpu" for b in kept for t in b)


def test_find_batch_size():
    assert find_batch_size({"a": "text", "b": [torch.zeros(5, 2)]}) == 5
    assert find_batch_size(Frozen(torch.ones(7), "k")) == 7
    with pytest.raises(TypeError, match="no tensor"):
        find_batch_size(["a", 1])
    with pytest.raises(TypeError, match="0-d"):
        find_batch_size(torch.tensor(1.0))


def test_a_users_shuffle_generator_gives_the_plain_loaders_order() -> None:
    from trainer import Accelerator

    data = TensorDataset(torch.arange(23).float())

    def epochs(loader, n=3):
        return [[b[0].tolist() for b in loader] for _ in range(n)]

    plain = epochs(DataLoader(data, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(5)))
    acc = Accelerator(cpu=True)
    prepared = acc.prepare(DataLoader(data, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(5)))
    assert epochs(prepared) == plain
    assert plain[0] != plain[1]  # a new permutation each epoch
    # a sampler given its own generator (the loader's base seed then comes from the global RNG)
    sampler_only = epochs(DataLoader(data, batch_size=4, sampler=torch.utils.data.RandomSampler(data, generator=torch.Generator().manual_seed(9))))
    prepared = acc.prepare(DataLoader(data, batch_size=4, sampler=torch.utils.data.RandomSampler(data, generator=torch.Generator().manual_seed(9))))
    assert epochs(prepared) == sampler_only
