"""`trainer.data_loader.prepare_data_loader` with Accelerate's signature: the shard of any process of any layout,
in one process without a process group (as Accelerate's tests call it), and its dispatcher for map-style data sets."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from trainer.data_loader import DataLoaderShard, prepare_data_loader


def _batches(loader: DataLoader) -> list[list[int]]:
    return [batch.tolist() for batch in loader]


def test_each_process_gets_every_other_batch_of_an_explicit_layout() -> None:
    plain = _batches(DataLoader(range(22), batch_size=3))
    shards = [_batches(prepare_data_loader(DataLoader(range(22), batch_size=3), None, 2, index)) for index in (0, 1)]
    assert shards[0] == plain[0::2]
    assert shards[1][:-1] == plain[1::2][:-1]
    assert shards[1][-1] == plain[-1] + plain[0][: 3 - len(plain[-1])]  # even_batches: completed from the start
    short = prepare_data_loader(DataLoader(range(22), batch_size=3), None, 2, 1, even_batches=False)
    assert _batches(short) == plain[1::2]
    assert isinstance(short, DataLoaderShard)


def test_split_batches_and_device_placement() -> None:
    loader = prepare_data_loader(DataLoader(range(16), batch_size=8), "cpu", 2, 1, split_batches=True, put_on_device=True)
    assert _batches(loader) == [[4, 5, 6, 7], [12, 13, 14, 15]]
    with pytest.raises(ValueError, match="batch"):
        prepare_data_loader(DataLoader(range(16), batch_size=3), None, 2, 0, split_batches=True)


def test_the_defaults_are_this_processs_place() -> None:
    loader = prepare_data_loader(DataLoader(range(6), batch_size=2))
    assert _batches(loader) == _batches(DataLoader(range(6), batch_size=2))


def test_seedable_sampler_shuffles_alike_in_every_process() -> None:
    shards = []
    for index in (0, 1):
        torch.manual_seed(index)  # processes seeded differently still share the order of data_seed
        loader = DataLoader(range(32), batch_size=4, shuffle=True)
        shards.append(_batches(prepare_data_loader(loader, None, 2, index, use_seedable_sampler=True, data_seed=7)))
    seen = sorted(x for shard in shards for batch in shard for x in batch)
    assert seen == list(range(32)) and shards[0] != _batches(DataLoader(range(32), batch_size=4))


@pytest.mark.parametrize("split_batches", [False, True])
def test_dispatching_a_map_style_data_set_splits_each_step(split_batches: bool) -> None:
    plain = DataLoader(range(16), batch_size=4)
    shards = [_batches(prepare_data_loader(DataLoader(range(16), batch_size=4), "cpu", 2, index, put_on_device=True,
                                           split_batches=split_batches, dispatch_batches=True)) for index in (0, 1)]
    steps = list(zip(*shards))
    assert [x for step in steps for part in step for x in part] == list(range(16))
    assert len(steps) == len(plain) // (1 if split_batches else 2)


def test_dispatch_refusals_name_the_fix() -> None:
    with pytest.raises(ValueError, match="put_on_device=True"):
        prepare_data_loader(DataLoader(range(8), batch_size=2), None, 2, 0, dispatch_batches=True)
    with pytest.raises(NotImplementedError, match="slice_fn_for_dispatch"):
        prepare_data_loader(DataLoader(range(8), batch_size=2), "cpu", 2, 0, put_on_device=True, dispatch_batches=True,
                            slice_fn_for_dispatch=lambda data, *args: data)
    with pytest.raises(NotImplementedError, match="num_workers=2"):
        prepare_data_loader(DataLoader(range(8), batch_size=2, num_workers=2), "cpu", 2, 0, put_on_device=True, dispatch_batches=True)
    with pytest.raises(TypeError, match="data_seed"):
        prepare_data_loader(DataLoader(range(8), batch_size=2), data_seed="7")  # type: ignore[arg-type]
