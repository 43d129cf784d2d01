"""ZeRO-3 partitioned construction (`DeepSpeedStrategy.module_init_context`, ``Accelerator.init_module()``) on 2 real
processes (gloo, CPU, ``DS_ACCELERATOR=cpu``): each process holds only its slice of every parameter from the moment
the model is built, and training from there equals single-process full-batch training of the same seeded model.

The first DeepSpeed run on a machine compiles its CPU communication op (about a minute; cached in
``~/.cache/torch_extensions`` or ``TORCH_EXTENSIONS_DIR``). Torch optimizers are passed, so no Adam op is built.
"""

from __future__ import annotations

import ctypes
import importlib.util
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tests.distributed.test_fsdp import GLOBAL_BATCH, STEPS, _data, _max_diff, _net
from tests.helpers.multiprocess import run_distributed

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(420),  # (not imported to collect: importing deepspeed takes seconds)
              pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                 reason="the deepspeed extra is not installed: pip install -e '.[deepspeed]'")]

SEQ = 8


def _llama_builder() -> Callable[[], nn.Module]:
    from transformers import LlamaConfig, LlamaForCausalLM

    def build() -> nn.Module:
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2)
        return LlamaForCausalLM(config)

    return build


def _tokens() -> torch.Tensor:
    return torch.randint(0, 128, (STEPS * GLOBAL_BATCH, SEQ), generator=torch.Generator().manual_seed(7))


def _builder(kind: str) -> Callable[[], nn.Module]:
    """The model's constructor, its classes imported (before an init block, as a script's imports)."""
    return _llama_builder() if kind == "llama" else _net


def _loss(kind: str, model: nn.Module, batch: list[torch.Tensor]) -> torch.Tensor:
    if kind == "llama":
        return model(input_ids=batch[0], labels=batch[0]).loss
    return nn.functional.mse_loss(model(batch[0]), batch[1])


def _dataset(kind: str) -> TensorDataset:
    return TensorDataset(_tokens()) if kind == "llama" else TensorDataset(*_data())


def _reference(kind: str) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """One process, a plain construction with the same seed, full global batches: (initial, final) weights."""
    model = _builder(kind)()
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    for batch in DataLoader(_dataset(kind), batch_size=GLOBAL_BATCH):
        _loss(kind, model, batch).backward()
        opt.step()
        opt.zero_grad()
    return initial, {k: v.detach().clone() for k, v in model.state_dict().items()}


def _partitioned_run(kind: str, face: str, directory: str):
    from strategies import DeepSpeedStrategy
    from trainer import Accelerator
    from trainer.utils import DeepSpeedPlugin

    if face == "plugin":  # Accelerate's spelling
        acc = Accelerator(cpu=True, deepspeed_plugin=DeepSpeedPlugin(zero_stage=3, zero3_init_flag=True))
    else:
        acc = Accelerator(strategy=DeepSpeedStrategy(cpu=True, zero_stage=3))
    build = _builder(kind)
    with acc.init_module():
        model = build()
    params = list(model.parameters())
    built = {
        "all_partitioned": all(hasattr(p, "ds_id") for p in params),
        "full_elements_held": sum(p.data.numel() for p in params),  # 0: no parameter holds its full tensor
        "numel": sum(p.ds_numel for p in params),
        "local": sum(p.ds_tensor.numel() for p in params),
        "expected_local": sum(math.ceil(p.ds_numel / acc.num_processes) for p in params),
        "dtypes": sorted({str(p.dtype) for p in params}),
    }
    initial = _gathered_state(model)
    pretrained = _from_pretrained(acc, directory) if kind == "llama" else None
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)  # on the partitioned parameters, before prepare
    loader = DataLoader(_dataset(kind), batch_size=GLOBAL_BATCH // acc.num_processes)
    model, opt, loader = acc.prepare(model, opt, loader)
    for batch in loader:
        acc.backward(_loss(kind, model, batch))
        opt.step()
        opt.zero_grad()
    state = {k: v.clone() for k, v in acc.get_state_dict(model).items()}
    extra = {"loaded": _load_weights(acc, model, directory), "rss": _rss_growth(acc), "bf16": _bf16_build()} if kind == "mlp" else {}
    acc.end_training()
    return {"built": built, "initial": initial, "state": state, "pretrained": pretrained, **extra}


def _gathered_state(model: nn.Module) -> dict[str, torch.Tensor]:
    import deepspeed

    with deepspeed.zero.GatheredParameters(list(model.parameters())):
        return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _from_pretrained(acc: Any, directory: str) -> dict[str, Any]:
    """transformers' ``from_pretrained`` in the block loads the checkpoint straight into the partitions."""
    from transformers import LlamaForCausalLM

    with acc.init_module():
        model = LlamaForCausalLM.from_pretrained(directory)
    params = list(model.parameters())
    return {"partitioned": all(hasattr(p, "ds_id") and p.data.numel() == 0 for p in params), "state": _gathered_state(model)}


def _load_weights(acc: Any, model: nn.Module, directory: str) -> float:
    """Weights alone (another strategy's ``model.safetensors``) into the ZeRO-3 engine: the partitioned module and its
    float32 master copies (every parameter's, also those whose size the processes do not divide evenly)."""
    from safetensors.torch import save_file

    target = {k: torch.full_like(v, 0.25 + i) for i, (k, v) in enumerate(_net().state_dict().items())}
    if acc.is_main_process:
        save_file(target, str(Path(directory, "model.safetensors")))
    acc.wait_for_everyone()
    acc.strategy.load_checkpoint(Path(directory), [model], [])
    return _max_diff(acc.get_state_dict(model), target)


def _rss_growth(acc: Any) -> tuple[float, float] | None:
    """(resident memory the process grew by, full size), in MiB, when a wide model is built in ``init_module()``."""
    if sys.platform != "linux":
        return None
    ctypes.CDLL(None).mallopt(-3, 1 << 17)  # M_MMAP_THRESHOLD: freed temporaries above 128 KiB go back to the system
    page = os.sysconf("SC_PAGE_SIZE") / 2**20
    before = int(Path("/proc/self/statm").read_text().split()[1]) * page
    with acc.init_module():
        wide = nn.Sequential(*[nn.Linear(1024, 1024) for _ in range(16)])
    grown = int(Path("/proc/self/statm").read_text().split()[1]) * page - before
    return grown, sum(p.ds_numel for p in wide.parameters()) * 4 / 2**20


def _bf16_build() -> dict[str, object]:
    """precision="bf16": the partitioned parameters are made in bfloat16, as the engine trains them; one engine step."""
    from strategies import DeepSpeedStrategy

    strategy = DeepSpeedStrategy(cpu=True, zero_stage=3, precision="bf16")
    strategy.setup_environment()  # the group the Accelerator joined
    with strategy.module_init_context():
        model = _net()
    dtypes = sorted({str(p.ds_tensor.dtype) for p in model.parameters()})
    engine, [opt] = strategy.setup_module_and_optimizers(model, [torch.optim.AdamW(model.parameters(), lr=0.01)], batch_size=8)
    strategy.precision.convert_module(strategy.unwrap_module(engine))  # float32 inputs cast, as the faces do
    x, y = _data()
    strategy.backward(nn.functional.mse_loss(engine(x[:8]), y[:8]))
    return {"dtypes": dtypes, "stepped": strategy.optimizer_step(opt), "weights": str(next(iter(strategy.module_state_dict(engine).values())).dtype)}


@pytest.mark.parametrize(("kind", "face"), [("mlp", "plugin"), ("llama", "strategy")])
def test_zero3_init_partitions_at_construction_and_trains_like_one_process(kind: str, face: str, tmp_path: Path) -> None:
    ref_initial, reference = _reference(kind)
    if kind == "llama":
        _builder(kind)().save_pretrained(tmp_path)  # the same seeded weights, for from_pretrained
    out = run_distributed(_partitioned_run, kind, face, str(tmp_path))
    for rank in (0, 1):
        built = out[rank]["built"]
        assert built["all_partitioned"] and built["full_elements_held"] == 0  # no process ever held the full model
        assert built["local"] == built["expected_local"] and built["local"] <= built["numel"] // 2 + len(ref_initial)
        assert built["dtypes"] == ["torch.float32"]
        # zero.Init keeps process 0's draws, which are a plain construction's with the same seed
        # (a Hugging Face model's _init_weights included)
        assert _max_diff(out[rank]["initial"], ref_initial) == 0.0
        assert _max_diff(out[rank]["state"], reference) <= 1e-4
        if kind == "llama":
            assert out[rank]["pretrained"]["partitioned"] and _max_diff(out[rank]["pretrained"]["state"], ref_initial) == 0.0
    if kind == "mlp":
        assert out[0]["bf16"] == {"dtypes": ["torch.bfloat16"], "stepped": True, "weights": "torch.float32"}
        assert out[0]["loaded"] == out[1]["loaded"] == 0.0
        for rank in (0, 1):  # about half the model (its slices) plus one layer's temporaries; a full copy would be all of it
            if out[rank]["rss"] is not None:
                grown, full = out[rank]["rss"]
                assert grown < 0.75 * full, (grown, full)


def _empty_below_stage3_run():
    from strategies import DeepSpeedStrategy
    from trainer import Accelerator

    acc = Accelerator(strategy=DeepSpeedStrategy(cpu=True, zero_stage=2))
    with acc.init_module(empty_init=True):
        model = _net()
    on_meta = all(p.is_meta for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)  # on the meta parameters: re-pointed when they are allocated
    loader = DataLoader(_dataset("mlp"), batch_size=GLOBAL_BATCH // acc.num_processes)
    model, opt, loader = acc.prepare(model, opt, loader)
    for batch in loader:
        acc.backward(_loss("mlp", model, batch))
        opt.step()
        opt.zero_grad()
    state = {k: v.clone() for k, v in acc.get_state_dict(model).items()}
    acc.end_training()
    return {"on_meta": on_meta, "state": state}


def test_empty_init_below_stage3_is_materialized_at_prepare() -> None:
    _, reference = _reference("mlp")
    out = run_distributed(_empty_below_stage3_run)
    assert out[0]["on_meta"]
    assert _max_diff(out[0]["state"], reference) <= 1e-4


def test_zero_init_settings_and_errors() -> None:
    from strategies import DeepSpeedStrategy
    from trainer.utils import DeepSpeedPlugin

    assert DeepSpeedPlugin(zero_stage=3, zero3_init_flag=True).strategy_kwargs()["zero_init"] is True  # no longer refused
    with pytest.raises(ValueError, match="transformer_moe_cls_names"):
        DeepSpeedPlugin(transformer_moe_cls_names="MoE")
    with pytest.raises(ValueError, match=r"zero_init=True .* needs ZeRO stage 3, but the stage is 2"):
        DeepSpeedStrategy(cpu=True, zero_stage=2, zero_init=True)
    strategy = DeepSpeedStrategy(cpu=True, zero_stage=2)
    with strategy.module_init_context():  # below stage 3: a full copy on the device, no process group needed
        full = nn.Linear(2, 2)
    with strategy.module_init_context(empty_init=True):
        empty = nn.Linear(2, 2)
    assert full.weight.device.type == "cpu" and empty.weight.is_meta
    assert not DeepSpeedStrategy(cpu=True, zero_stage=3, zero_init=False).zero_init
    config = DeepSpeedStrategy(cpu=True, zero_stage=3, config={"train_batch_size": 64, "train_micro_batch_size_per_gpu": "auto"}).init_config()
    assert "train_batch_size" not in config and config["train_micro_batch_size_per_gpu"] == 1


def test_model_summary_counts_partitioned_parameters_in_full() -> None:
    from callbacks.summary import summarize

    model = nn.Linear(4, 3)
    model.weight.data = torch.empty(0)  # as zero.Init leaves it, with the full count in ds_numel
    model.weight.ds_numel = 12  # type: ignore[attr-defined]
    assert summarize(model).total_params == 15
