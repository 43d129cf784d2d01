"""The sharding policy, as pure functions: exact examples and properties over random sizes and flags."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import BatchSampler, SequentialSampler

from strategies.sharding import (
    BatchSamplerShard,
    IterableDatasetShard,
    last_batch_real_count,
    shard_batches,
    shard_indices,
    shard_num_batches,
    shard_spans,
    shard_stream,
)

FLAGS = {"split_batches": st.booleans(), "even_batches": st.booleans(), "drop_last": st.booleans()}


def all_ranks(length, batch_size, num_processes, **flags):
    return [shard_indices(length, batch_size, num_processes, r, **flags) for r in range(num_processes)]


def gather_in_order(per_rank, real_last):
    """What a gather over all ranks sees, step by step, with the last step trimmed to its real samples."""
    steps = max(map(len, per_rank), default=0)
    out = []
    for k in range(steps):
        step = [i for batches in per_rank if k < len(batches) for i in batches[k]]
        out.extend(step[:real_last] if k == steps - 1 else step)
    return out


def sampler_batches(length, batch_size, drop_last=False):
    return BatchSampler(SequentialSampler(range(length)), batch_size, drop_last)


# --- the documented two-process examples ---------------------------------------------------------------


def test_even_batches_wraps_to_the_start():
    assert all_ranks(22, 3, 2) == [
        [[0, 1, 2], [6, 7, 8], [12, 13, 14], [18, 19, 20]],
        [[3, 4, 5], [9, 10, 11], [15, 16, 17], [21, 0, 1]],
    ]


def test_uneven_and_drop_last_tails():
    assert all_ranks(22, 3, 2, even_batches=False)[1] == [[3, 4, 5], [9, 10, 11], [15, 16, 17], [21]]
    assert all_ranks(22, 3, 2, even_batches=False)[0][-1] == [18, 19, 20]
    assert all_ranks(22, 3, 2, drop_last=True) == [
        [[0, 1, 2], [6, 7, 8], [12, 13, 14]],
        [[3, 4, 5], [9, 10, 11], [15, 16, 17]],
    ]


def test_split_batches_example():
    rank0, rank1 = all_ranks(22, 4, 2, split_batches=True)
    assert rank0 == [[0, 1], [4, 5], [8, 9], [12, 13], [16, 17], [20, 21]]
    assert rank1 == [[2, 3], [6, 7], [10, 11], [14, 15], [18, 19], [0, 1]]


def test_gather_for_metrics_example():
    per_rank = all_ranks(7, 2, 2)
    assert per_rank == [[[0, 1], [4, 5]], [[2, 3], [6, 0]]]
    assert last_batch_real_count(7, 2, 2) == 3
    assert gather_in_order(per_rank, 3) == [0, 1, 2, 3, 4, 5, 6]


def test_iterable_examples():
    assert list(shard_stream(range(8), 2, 2, 0)) == [0, 1, 4, 5]
    assert list(shard_stream(range(8), 2, 2, 1)) == [2, 3, 6, 7]
    assert list(shard_stream(range(8), 4, 2, 0, split_batches=True)) == [0, 1, 4, 5]
    assert list(shard_stream(range(7), 2, 2, 1)) == [2, 3, 6, 0]
    assert list(shard_stream(range(7), 2, 2, 1, drop_last=True)) == [2, 3]
    assert list(shard_stream(range(7), 2, 2, 1, even_batches=False)) == [2, 3, 6]


def test_one_process_pads_nothing():
    assert shard_indices(5, 2, 1, 0) == [[0, 1], [2, 3], [4]]
    assert list(shard_stream(range(5), 2, 1, 0)) == [0, 1, 2, 3, 4]
    assert last_batch_real_count(5, 2, 1) == 1


def test_tiny_dataset_wraps_repeatedly():
    assert all_ranks(2, 3, 2) == [[[0, 1, 0]], [[1, 0, 1]]]
    assert last_batch_real_count(2, 3, 2) == 2


def test_seek_is_the_same_as_skipping():
    full = shard_indices(100, 7, 3, 2)
    assert shard_indices(100, 7, 3, 2, start=3) == full[3:]


# --- errors -----------------------------------------------------------------------------------------------


def test_split_batches_needs_a_divisible_batch_size():
    with pytest.raises(ValueError, match=r"batch_size=5.*num_processes=2.*batch_size=6"):
        shard_indices(10, 5, 2, 0, split_batches=True)
    with pytest.raises(ValueError, match="batch_size=5"):
        BatchSamplerShard(sampler_batches(10, 5), 2, 0, split_batches=True)


@pytest.mark.parametrize("num_processes, process_index", [(0, 0), (2, 2), (2, -1), (2.0, 0)])
def test_bad_process_arguments(num_processes, process_index):
    with pytest.raises(ValueError, match=r"num_processes|process_index"):
        shard_indices(10, 2, num_processes, process_index)


def test_split_needs_a_fixed_batch_size():
    with pytest.raises(ValueError, match="fixed `batch_size`"):
        list(shard_batches([[0, 1], [2]], num_processes=2, process_index=0, split_batches=True))


# --- properties ---------------------------------------------------------------------------------------------

sizes = dict(
    length=st.integers(0, 80), batch_size=st.integers(1, 9), num_processes=st.integers(1, 4), **FLAGS
)


def fix_split(batch_size, num_processes, split_batches):
    return batch_size * num_processes if split_batches else batch_size


@settings(max_examples=300, deadline=None, database=None)
@given(**sizes)
def test_coverage_counts_and_trimmed_gather(length, batch_size, num_processes, split_batches, even_batches, drop_last):
    batch_size = fix_split(batch_size, num_processes, split_batches)
    flags = {"split_batches": split_batches, "even_batches": even_batches, "drop_last": drop_last}
    per_rank = all_ranks(length, batch_size, num_processes, **flags)
    total = batch_size if split_batches else batch_size * num_processes
    kept = (length // total) * total if drop_last else length

    seen = {i for batches in per_rank for b in batches for i in b}
    assert seen == set(range(kept))
    for r, batches in enumerate(per_rank):
        assert len(batches) == shard_num_batches(length, batch_size, num_processes, r, **flags)
    if (even_batches and num_processes > 1) or drop_last:
        assert len({len(b) for b in per_rank}) == 1
        assert all(len(b) == total // num_processes for batches in per_rank for b in batches)
    real = last_batch_real_count(length, batch_size, num_processes, split_batches=split_batches, drop_last=drop_last)
    assert gather_in_order(per_rank, real) == list(range(kept))


@settings(max_examples=300, deadline=None, database=None)
@given(**sizes)
def test_spans_follow_the_dealing_formula(length, batch_size, num_processes, split_batches, even_batches, drop_last):
    """Step k of rank r is positions [k * total + r * per, ... + per), the last one clipped to the pass when
    nothing is padded; every start seeks to the same spans."""
    batch_size = fix_split(batch_size, num_processes, split_batches)
    flags = {"split_batches": split_batches, "even_batches": even_batches, "drop_last": drop_last}
    total = batch_size if split_batches else batch_size * num_processes
    per = total // num_processes
    pads = (even_batches and num_processes > 1) or drop_last
    for r in range(num_processes):
        n = shard_num_batches(length, batch_size, num_processes, r, **flags)
        expected = [(k * total + r * per, k * total + r * per + per) for k in range(n)]
        if expected and not pads:
            expected[-1] = (expected[-1][0], min(expected[-1][1], length))
        for start in range(-1, n + 2):
            assert list(shard_spans(length, batch_size, num_processes, r, start=start, **flags)) == expected[max(start, 0):]


@settings(max_examples=200, deadline=None, database=None)
@given(**sizes)
def test_streaming_matches_arithmetic(length, batch_size, num_processes, split_batches, even_batches, drop_last):
    """Any batch sampler goes through the stream path; for a fixed batch size it agrees with the arithmetic one."""
    batch_size = fix_split(batch_size, num_processes, split_batches)
    flags = {"split_batches": split_batches, "even_batches": even_batches}
    for r in range(num_processes):
        expected = shard_indices(length, batch_size, num_processes, r, drop_last=drop_last, **flags)
        real = []
        stream = shard_batches(
            sampler_batches(length, batch_size, drop_last), num_processes=num_processes, process_index=r,
            batch_size=batch_size, drop_last=drop_last, on_end=real.append, **flags,
        )
        assert list(stream) == expected
        want = last_batch_real_count(length, batch_size, num_processes, split_batches=split_batches, drop_last=drop_last)
        assert real == [want]


class ListBatches:
    """A custom batch sampler: any list of index lists, with a fixed ``batch_size`` or none."""

    def __init__(self, batches, batch_size=None, drop_last=False):
        self.batches, self.batch_size, self.drop_last = batches, batch_size, drop_last

    def __iter__(self):
        return iter([list(b) for b in self.batches])

    def __len__(self):
        return len(self.batches)


@settings(max_examples=200, deadline=None, database=None)
@given(
    cuts=st.lists(st.integers(1, 6), max_size=15),
    num_processes=st.integers(1, 4),
    even_batches=st.booleans(),
    drop_last=st.booleans(),
)
def test_variable_size_batch_sampler(cuts, num_processes, even_batches, drop_last):
    bounds = list(itertools.accumulate(cuts, initial=0))
    batches = [list(range(a, b)) for a, b in itertools.pairwise(bounds)]
    sampler = ListBatches(batches, drop_last=drop_last)
    shards = [BatchSamplerShard(sampler, num_processes, r, even_batches=even_batches) for r in range(num_processes)]
    per_rank = [list(shard) for shard in shards]
    rounds = len(batches) // num_processes if drop_last else -(-len(batches) // num_processes)
    kept = rounds * num_processes if drop_last else len(batches)
    for r, got in enumerate(per_rank):
        own = batches[:kept][r::num_processes]
        assert got[: len(own)] == own
        assert len(got) == len(shards[r])
        lent = got[len(own):]  # whole batches lent from the start of the pass
        assert len(lent) <= 1
        assert not lent or (even_batches and lent[0] in batches[:num_processes])
    if (even_batches and num_processes > 1) or drop_last:
        assert len({len(b) for b in per_rank}) == 1
    real = bounds[kept] - bounds[(rounds - 1) * num_processes] if rounds else 0
    assert [shard.real_last_step for shard in shards] == [real] * num_processes
    assert gather_in_order(per_rank, real) == list(range(bounds[kept]))


@settings(max_examples=200, deadline=None, database=None)
@given(**sizes, data=st.data())
def test_iterable_shard_is_the_flattened_batches(length, batch_size, num_processes, split_batches, even_batches,
                                                 drop_last, data):
    batch_size = fix_split(batch_size, num_processes, split_batches)
    flags = {"split_batches": split_batches, "even_batches": even_batches, "drop_last": drop_last}
    for r in range(num_processes):
        flat = [i for b in shard_indices(length, batch_size, num_processes, r, **flags) for i in b]
        shard = IterableDatasetShard(range(length), batch_size, drop_last, num_processes, r, split_batches, even_batches)
        assert list(shard) == flat
        assert len(shard) == len(flat)
        start = data.draw(st.integers(0, 12))
        steps = shard_indices(length, batch_size, num_processes, r, start=start, **flags)
        assert list(shard_stream(range(length), batch_size, num_processes, r, start_step=start, **flags)) == [
            i for b in steps for i in b
        ]


@settings(max_examples=100, deadline=None, database=None)
@given(**sizes)
def test_batch_sampler_shard_len_and_skip(length, batch_size, num_processes, split_batches, even_batches, drop_last):
    batch_size = fix_split(batch_size, num_processes, split_batches)
    for r in range(num_processes):
        for sampler in (sampler_batches(length, batch_size, drop_last),
                        ListBatches(list(sampler_batches(length, batch_size, drop_last)), batch_size, drop_last)):
            shard = BatchSamplerShard(sampler, num_processes, r, split_batches, even_batches)
            full = list(shard)
            if split_batches and not even_batches and not shard.arithmetic:
                # A custom sampler's last batch may be too short to reach this process; len() cannot know.
                assert len(shard) - len(full) in (0, 1)
            else:
                assert len(full) == len(shard)
            shard.first_batch = 2
            assert list(shard) == full[2:]
            assert list(shard) == full[2:]
            shard.first_batch = 0
            assert list(shard) == full
