"""`Accelerator.register_save_state_pre_hook` / `register_load_state_pre_hook`, with Accelerate 1.15's contract:
``hook(models, weights, output_dir)`` before the weights are written and ``hook(models, input_dir)`` before they load,
a hook that removes an entry takes over that model's saving/loading, and each returns a removable handle."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from trainer import Accelerator


def _prepared(acc: Accelerator, seed: int) -> tuple[nn.Module, nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    first, second = nn.Linear(3, 2), nn.Linear(2, 1)
    opt = torch.optim.SGD([*first.parameters(), *second.parameters()], lr=0.1)
    first, second, opt = acc.prepare(first, second, opt)
    return first, second, opt


def test_the_save_hook_sees_models_weights_and_the_directory_and_its_files_move_with_the_checkpoint(tmp_path: Path) -> None:
    acc = Accelerator(cpu=True)
    first, second, _ = _prepared(acc, 0)
    calls: list[tuple[list[Any], list[set[str]], str]] = []

    def hook(models: list[nn.Module], weights: list[dict[str, torch.Tensor]], output_dir: str) -> None:
        calls.append((list(models), [set(w) for w in weights], output_dir))
        (Path(output_dir) / "hook_config.json").write_text('{"written": "by the hook"}')

    acc.register_save_state_pre_hook(hook)
    acc.save_state(tmp_path / "ckpt")
    [(models, keys, output_dir)] = calls
    assert models == [first, second]
    assert keys == [{"weight", "bias"}, {"weight", "bias"}]
    assert (tmp_path / "ckpt" / "hook_config.json").read_text() == '{"written": "by the hook"}'
    assert not Path(output_dir).exists()  # it was the staging directory, renamed into place at the commit


def test_a_removed_state_dict_is_not_written_and_the_load_hook_loads_that_model_itself(tmp_path: Path) -> None:
    acc = Accelerator(cpu=True)
    first, second, _ = _prepared(acc, 0)
    saved_second = {k: v.clone() for k, v in second.state_dict().items()}

    def save_hook(models: list[nn.Module], weights: list[dict[str, torch.Tensor]], output_dir: str) -> None:
        save_file(weights.pop(), str(Path(output_dir) / "second.safetensors"))  # diffusers' pattern: save it its own way

    def load_hook(models: list[nn.Module], input_dir: str) -> None:
        models.pop().load_state_dict(load_file(str(Path(input_dir) / "second.safetensors")))

    acc.register_save_state_pre_hook(save_hook)
    acc.register_load_state_pre_hook(load_hook)
    acc.save_state(tmp_path / "ckpt")
    files = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert "model.safetensors" in files and "model_1.safetensors" not in files and "second.safetensors" in files
    saved_first = {k: v.clone() for k, v in first.state_dict().items()}

    acc2 = Accelerator(cpu=True)
    first2, second2, _ = _prepared(acc2, 1)  # other weights
    assert not torch.equal(first2.weight, saved_first["weight"])
    acc2.register_save_state_pre_hook(save_hook)
    acc2.register_load_state_pre_hook(load_hook)
    acc2.load_state(tmp_path / "ckpt")
    for model, saved in ((first2, saved_first), (second2, saved_second)):
        for key, value in model.state_dict().items():
            assert torch.equal(value, saved[key]), key

    acc3 = Accelerator(cpu=True)
    _prepared(acc3, 1)
    with pytest.raises(ValueError, match="holds 1 models but 2 were prepared"):  # without the load hook nothing pairs up
        acc3.load_state(tmp_path / "ckpt")


def test_a_replaced_tensor_is_what_is_saved(tmp_path: Path) -> None:
    acc = Accelerator(cpu=True)
    first, _, _ = _prepared(acc, 0)

    def hook(models: list[nn.Module], weights: list[dict[str, torch.Tensor]], output_dir: str) -> None:
        weights[0]["bias"] = torch.full_like(weights[0]["bias"], 7.0)

    acc.register_save_state_pre_hook(hook)
    acc.save_state(tmp_path / "ckpt")
    assert torch.equal(load_file(str(tmp_path / "ckpt" / "model.safetensors"))["bias"], torch.full((2,), 7.0))
    assert not torch.equal(first.bias, torch.full((2,), 7.0))  # the model itself is untouched


def test_handles_remove_hooks_and_hooks_run_in_registration_order(tmp_path: Path) -> None:
    acc = Accelerator(cpu=True)
    _prepared(acc, 0)
    seen: list[str] = []
    handles = [acc.register_save_state_pre_hook(lambda m, w, d, n=n: seen.append(n)) for n in ("a", "b", "c")]
    load_handle = acc.register_load_state_pre_hook(lambda m, d: seen.append("load"))
    handles[1].remove()
    acc.save_state(tmp_path / "one")
    assert seen == ["a", "c"]
    load_handle.remove()
    acc.load_state(tmp_path / "one")
    assert seen == ["a", "c"]


@pytest.mark.parametrize("method", ["register_save_state_pre_hook", "register_load_state_pre_hook"])
def test_a_hook_that_is_not_callable_is_refused(method: str) -> None:
    with pytest.raises(TypeError, match=rf"{method}\(hook='not a function'\) needs a callable"):
        getattr(Accelerator(cpu=True), method)("not a function")
