"""Accelerate's public API beyond prepare/backward, on one process: `state`, the process decorators,
`split_between_processes`, `find_executable_batch_size`, `save_iteration`, join and sync triggers."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from strategies.sharding import split_for_process
from trainer import Accelerator, ProjectConfiguration
from trainer.state import AcceleratorState, PartialState
from trainer.utils import DistributedType, find_executable_batch_size


def test_state_is_a_read_only_view_of_the_layout_and_precision() -> None:
    acc = Accelerator(cpu=True, mixed_precision="bf16")
    state = acc.state
    assert isinstance(state, AcceleratorState)
    assert (state.num_processes, state.process_index, state.local_process_index) == (1, 0, 0)
    assert state.device == torch.device("cpu")
    assert state.distributed_type == DistributedType.NO
    assert state.mixed_precision == "bf16"
    assert state.is_main_process and state.is_last_process and not state.use_distributed
    with pytest.raises(AttributeError):
        state.num_processes = 2  # type: ignore[misc]
    with pytest.raises(AttributeError):
        state.extra = 1  # type: ignore[attr-defined]
    assert "num_processes=1" in repr(state)


def test_partial_state_reports_the_newest_accelerators_layout() -> None:
    acc = Accelerator(cpu=True)
    assert PartialState().device == acc.device
    assert AcceleratorState().mixed_precision == "no"
    with pytest.raises(TypeError, match="only cpu="):
        PartialState(backend="gloo")


def test_process_decorators_run_everything_on_a_single_process() -> None:
    # as Accelerate: without distribution the index does not matter
    acc = Accelerator(cpu=True)
    calls: list[str] = []
    acc.on_main_process(lambda: calls.append("main"))()
    acc.on_local_main_process(lambda: calls.append("local main"))()
    acc.on_last_process(lambda: calls.append("last"))()
    acc.on_process(lambda: calls.append("p1"), process_index=1)()
    acc.on_process(process_index=3)(lambda: calls.append("p3"))()
    acc.on_local_process(local_process_index=1)(lambda: calls.append("l1"))()
    assert calls == ["main", "local main", "last", "p1", "p3", "l1"]
    with pytest.raises(ValueError, match="process_index=-1"):
        acc.on_process(lambda: None, process_index=-1)
    with pytest.raises(ValueError, match="process_index=None"):
        acc.on_process(lambda: None)
    with pytest.raises(TypeError, match="a function to decorate"):
        acc.on_main_process("not callable")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("n", "expected"),
    [(2, [["A", "B"], ["C"]]), (3, [["A"], ["B"], ["C"]]), (4, [["A"], ["B"], ["C"], []])],
)
def test_split_gives_contiguous_shares_each_item_once(n: int, expected: list[list[str]]) -> None:
    assert [split_for_process(["A", "B", "C"], n, r) for r in range(n)] == expected


def test_split_with_padding_repeats_the_last_item() -> None:
    assert [split_for_process(["A", "B", "C"], 2, r, apply_padding=True) for r in range(2)] == [["A", "B"], ["C", "C"]]
    assert [split_for_process(("A",), 3, r, apply_padding=True) for r in range(3)] == [("A",), ("A",), ("A",)]
    t = torch.arange(10).reshape(5, 2)
    shares = [split_for_process(t, 2, r, apply_padding=True) for r in range(2)]
    assert torch.equal(shares[0], t[:3])
    assert torch.equal(shares[1], torch.stack([t[3], t[4], t[4]]))
    assert split_for_process([], 2, 1, apply_padding=True) == []


def test_split_dicts_tensors_and_errors() -> None:
    batch = {"ids": torch.arange(5), "text": ["a", "b", "c", "d", "e"]}
    second = split_for_process(batch, 2, 1)
    assert second["ids"].tolist() == [3, 4] and second["text"] == ["d", "e"]
    assert batch["text"] == ["a", "b", "c", "d", "e"]  # the input is not changed
    with pytest.raises(ValueError, match=r"one length.*'ids': 5.*'text': 2"):
        split_for_process({"ids": torch.arange(5), "text": ["a", "b"]}, 2, 0)
    with pytest.raises(TypeError, match="is a str"):
        split_for_process("prompts", 2, 0)
    with pytest.raises(TypeError, match=r"inputs\['n'\] is a int"):
        split_for_process({"n": 3}, 2, 0)
    with pytest.raises(ValueError, match="0-d tensor"):
        split_for_process(torch.tensor(1.0), 2, 0)
    one = ["A", "B"]
    assert split_for_process(one, 1, 0) is one


def test_split_between_processes_on_one_process_yields_the_input() -> None:
    acc = Accelerator(cpu=True)
    prompts = ["a", "b", "c"]
    with acc.split_between_processes(prompts) as mine:
        assert mine is prompts
    with PartialState().split_between_processes(prompts, apply_padding=True) as mine:
        assert mine is prompts


def _allocate(batch_size: int, limit: int, tried: list[int]) -> int:
    tried.append(batch_size)
    if batch_size > limit:
        torch.empty(2**50, dtype=torch.uint8)  # a real allocator failure: DefaultCPUAllocator can't allocate 1 PiB
    return batch_size


def test_find_executable_batch_size_shrinks_on_out_of_memory_and_keeps_the_size() -> None:
    tried: list[int] = []
    run = find_executable_batch_size(_allocate, starting_batch_size=128)
    assert run(100, tried) == 92  # 128, 115 and 103 fail; sizes shrink by 0.9 as in Accelerate
    assert tried == [128, 115, 103, 92]
    assert run(100, tried) == 92 and tried[-1] == 92  # the next call starts at the size that worked


def test_find_executable_batch_size_as_a_decorator_with_a_custom_reduction() -> None:
    tried: list[int] = []

    @find_executable_batch_size(starting_batch_size=64, reduce_batch_size_fn=lambda: tried[-1] // 2)
    def train(batch_size: int, limit: int) -> int:
        return _allocate(batch_size, limit, tried)

    assert train(10) == 8 and tried == [64, 32, 16, 8]
    with pytest.raises(TypeError, match="got its batch size as an argument"):
        train(8, 10)


def test_find_executable_batch_size_stops_at_zero_and_passes_other_errors() -> None:
    tried: list[int] = []
    with pytest.raises(RuntimeError, match="no executable batch size found"):
        find_executable_batch_size(_allocate, starting_batch_size=4)(0, tried)
    assert tried == [4, 3, 2, 1]

    def broken(batch_size: int) -> None:
        raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        find_executable_batch_size(broken, starting_batch_size=4)()
    with pytest.raises(ValueError, match="starting_batch_size=0"):
        find_executable_batch_size(broken, starting_batch_size=0)


def test_save_iteration_is_the_next_automatic_checkpoint_number(tmp_path) -> None:
    acc = Accelerator(cpu=True, project_config=ProjectConfiguration(project_dir=str(tmp_path), automatic_checkpoint_naming=True))
    acc.prepare(torch.nn.Linear(2, 2))
    assert acc.save_iteration == 0
    assert acc.save_state().endswith("checkpoint_0")
    assert acc.save_iteration == 1


def test_join_and_trigger_sync_do_nothing_on_one_process() -> None:
    acc = Accelerator(cpu=True)
    model = acc.prepare(torch.nn.Linear(2, 1))
    loader = acc.prepare(DataLoader(list(range(5)), batch_size=2))
    with acc.join_uneven_inputs([model], even_batches=False):
        assert len(list(loader)) == 3
    with acc.trigger_sync_in_backward(model):
        model(torch.ones(1, 2)).sum().backward()
    assert model.weight.grad is not None
    with pytest.raises(TypeError, match="even_batches='no'"), acc.join_uneven_inputs([model], even_batches="no"):  # type: ignore[arg-type]
        pass


def test_use_stateful_dataloader_recipe_resumes_at_the_next_batch() -> None:
    # Accelerate's recipe for StatefulDataLoader-backed loaders: state_dict() mid-epoch, load_state_dict() later
    from trainer.utils import DataLoaderConfiguration

    def loader() -> DataLoader:
        acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True))
        return acc.prepare(DataLoader(list(range(10)), batch_size=2, shuffle=True, generator=torch.Generator().manual_seed(3)))

    first = loader()
    seen, state = [], None
    for i, batch in enumerate(first):
        seen.append(batch.tolist())
        if i == 1:
            state = first.state_dict()
    resumed = loader()
    resumed.load_state_dict(state)
    assert [b.tolist() for b in resumed] == seen[2:]
    with pytest.raises(TypeError, match="use_stateful_dataloader='yes'"):
        DataLoaderConfiguration(use_stateful_dataloader="yes")  # type: ignore[arg-type]


def test_collectives_take_mappings_dataclasses_and_numpy_numbers() -> None:
    # what Accelerate's recursively_apply accepts: any Mapping (e.g. transformers' BatchEncoding), dataclasses
    import collections
    import dataclasses

    import numpy as np

    @dataclasses.dataclass
    class Out:
        logits: torch.Tensor

    class Encoding(collections.UserDict):
        pass

    acc = Accelerator(cpu=True)
    gathered = acc.gather(Encoding({"ids": torch.arange(3)}))
    assert isinstance(gathered, Encoding) and gathered["ids"].tolist() == [0, 1, 2]
    assert acc.pad_across_processes(Out(torch.ones(2))).logits.tolist() == [1.0, 1.0]
    model = acc.prepare(torch.nn.Linear(2, 1))
    model(torch.ones(1, 2)).sum().backward()
    acc.clip_grad_norm_(model.parameters(), np.float32(1.0))
    acc.clip_grad_norm_(model.parameters(), torch.tensor(1.0))
