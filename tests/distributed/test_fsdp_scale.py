"""A model that does not fit on one process: empty (meta) init, sharded materialization, activation checkpointing,
compile, and process 0's weights scattered slice by slice, on 2 real processes (FSDP2, gloo), in both faces,
against single-process training of the eagerly built model with the same seed."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tests.helpers.multiprocess import run_distributed

pytestmark = [pytest.mark.distributed, pytest.mark.timeout(400)]
transformers = pytest.importorskip("transformers")

STEPS, VOCAB, SEQ, GLOBAL_BATCH = 3, 128, 12, 4


def llama(tied: bool = False) -> nn.Module:
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied)
    return transformers.LlamaForCausalLM(config)


def block_class() -> type[nn.Module]:
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    return LlamaDecoderLayer


def tokens() -> torch.Tensor:
    return torch.randint(0, VOCAB, (STEPS, GLOBAL_BATCH, SEQ), generator=torch.Generator().manual_seed(3))


def reference() -> tuple[list[float], dict[str, torch.Tensor]]:
    """One process, the model built eagerly (no meta device), full global batches."""
    torch.manual_seed(0)
    model = llama()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for batch in tokens():
        loss = sum(model(input_ids=h, labels=h).loss for h in batch.chunk(2)) / 2
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    return losses, {k: v.detach().clone() for k, v in model.state_dict().items()}


class Counting:
    """Counts runs of the blocks' forward code: with activation checkpointing each runs again in backward (this process only)."""

    def __init__(self) -> None:
        self.calls = 0
        cls = block_class()
        original = cls.forward

        def forward(block: nn.Module, *args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            return original(block, *args, **kwargs)

        cls.forward = forward  # type: ignore[method-assign]


def accelerator_run(compile_backend: str | None) -> dict[str, Any]:
    from strategies import FSDPStrategy
    from trainer import Accelerator, TorchDynamoPlugin

    dynamo = TorchDynamoPlugin(backend=compile_backend, use_regional_compilation=True) if compile_backend else None
    accelerator = Accelerator(strategy=FSDPStrategy(cpu=True, wrap_classes=[block_class()], activation_checkpointing_policy={block_class()}),
                              dynamo_plugin=dynamo)
    counter = Counting()
    torch.manual_seed(0)
    with accelerator.init_module():
        model = llama()
    built_empty = all(p.is_meta for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)  # built on the meta parameters: prepare points it at the shards
    model, opt = accelerator.prepare(model, opt)
    shard_rows = model.model.embed_tokens.weight.to_local().shape[0]
    losses = []
    for batch in tokens():
        part = batch.chunk(2)[accelerator.process_index]
        loss = model(input_ids=part, labels=part).loss
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(float(accelerator.reduce(loss.detach(), "mean")))
    state = accelerator.get_state_dict(model)
    accelerator.end_training()
    from torch._dynamo.utils import counters

    return {"losses": losses, "state": state, "empty": built_empty, "block_calls": counter.calls, "shard_rows": shard_rows,
            "graphs": counters["stats"]["unique_graphs"]}


def trainer_run(tmp: str) -> dict[str, Any]:
    from torch.utils.data import DataLoader

    from strategies import FSDPStrategy
    from trainer import Trainer, TrainModule

    class LM(TrainModule):
        def __init__(self) -> None:
            super().__init__()
            self.model: nn.Module | None = None
            self.configured = 0

        def configure_model(self) -> None:
            self.configured += 1
            if self.model is not None:
                return
            torch.manual_seed(0)
            self.model = llama()
            self.built_empty = all(p.is_meta for p in self.model.parameters())

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            loss = self.model(input_ids=batch, labels=batch).loss
            self.log("loss", loss, sync_dist=True)
            return loss

        def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
            self.log("val_loss", self.model(input_ids=batch, labels=batch).loss, sync_dist=True)

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-2)

    module = LM()
    val = DataLoader(list(tokens()[0]), batch_size=1)  # sharded evaluation: the sanity check runs 2 batches per process
    loader = DataLoader(list(tokens().reshape(-1, SEQ)), batch_size=GLOBAL_BATCH // 2, shuffle=False)  # per process
    strategy = FSDPStrategy(cpu=True, wrap_classes=[block_class()], activation_checkpointing_policy={block_class()})
    trainer = Trainer(strategy=strategy, max_steps=STEPS, project_dir=tmp, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, log_with=None)
    trainer.fit(module, loader, val)
    state = trainer.strategy.module_state_dict(module)
    return {"state": {k.removeprefix("model."): v for k, v in state.items()}, "empty": module.built_empty, "configured": module.configured}


def test_llama_meta_init_with_activation_checkpointing_equals_one_process_in_the_accelerator_face() -> None:
    losses, state = reference()
    ranks = run_distributed(accelerator_run, None)
    ours = ranks[0]
    assert all(r["empty"] for r in ranks)  # built on the meta device: no full copy on any process
    assert [r["shard_rows"] for r in ranks] == [VOCAB // 2, VOCAB // 2]
    assert ours["losses"] == pytest.approx(losses, abs=1e-5)
    assert set(ours["state"]) == set(state)  # plain keys: no _checkpoint_wrapped_module, no _fsdp_wrapped_module
    assert max(float((ours["state"][k] - state[k]).abs().max()) for k in state) < 1e-5
    # 2 blocks x 3 steps forward, and again for the recomputation in backward
    assert ours["block_calls"] == 2 * STEPS * 2


def test_llama_configure_model_under_fsdp_equals_one_process_in_the_trainer_face(tmp_path: Path) -> None:
    _, state = reference()
    ranks = run_distributed(trainer_run, str(tmp_path))
    ours = ranks[0]
    assert all(r["empty"] for r in ranks)
    assert ours["configured"] == 1
    assert set(ours["state"]) == set(state)
    assert max(float((ours["state"][k] - state[k]).abs().max()) for k in state) < 1e-5


def test_regional_compile_after_sharding_and_checkpointing_follows_eager_losses() -> None:
    eager = run_distributed(accelerator_run, None)[0]
    compiled = run_distributed(accelerator_run, "inductor", timeout=380)[0]
    assert eager["graphs"] == 0 and compiled["graphs"] >= 1  # the blocks really ran compiled
    assert compiled["losses"] == pytest.approx(eager["losses"], abs=1e-4)


# cpu_ram_efficient_loading -----------------------------------------------------------------------------------
class Recorded(nn.Linear):
    """A Linear that records whether it was ever initialized in full (``reset_parameters``) in this process."""

    resets = 0

    def reset_parameters(self) -> None:
        if not self.weight.is_meta:  # on the meta device it allocates nothing
            type(self).resets += 1
        super().reset_parameters()


class Wide(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Recorded(256, 256) for _ in range(4)])
        self.register_buffer("scale", torch.full((256,), 0.5))
        self.register_buffer("shift", torch.full((256,), 0.125), persistent=False)  # in no state dict, still needed

    def reset_parameters(self) -> None:  # its own buffer (the layers reset theirs): what materializing a meta build runs
        with torch.no_grad():
            self.scale.fill_(0.5)
            self.shift.fill_(0.125)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x)) * self.scale + self.shift
        return x


def rank0_loading_run() -> dict[str, Any]:
    from strategies import FSDPStrategy
    from trainer import Accelerator, init_empty_weights

    accelerator = Accelerator(strategy=FSDPStrategy(cpu=True, wrap_classes=[Recorded], cpu_ram_efficient_loading=True))
    Recorded.resets = 0
    if accelerator.is_main_process:
        torch.manual_seed(5)
        model = Wide()  # process 0: the real (pretrained) weights
        with torch.no_grad():
            model.scale.fill_(0.25)  # buffers changed after construction: they must reach the others too
            model.shift.fill_(-1.0)
    else:
        with init_empty_weights(include_buffers=True):
            model = Wide()
    resets_before_prepare = Recorded.resets
    model = accelerator.prepare(model)
    state = accelerator.get_state_dict(model)
    out = model(torch.ones(2, 256))
    return {"resets": Recorded.resets, "resets_before": resets_before_prepare, "state": state,
            "out": out.detach(), "rows": model.layers[0].weight.to_local().shape[0]}


def test_cpu_ram_efficient_loading_gives_each_process_only_its_slices_of_process_0s_weights() -> None:
    torch.manual_seed(5)
    expected = Wide()
    with torch.no_grad():
        expected.scale.fill_(0.25)
        expected.shift.fill_(-1.0)
    ranks = run_distributed(rank0_loading_run)
    zero, one = ranks
    assert zero["resets_before"] == 4 and one["resets"] == 0  # process 1 never initialized a full layer
    assert one["rows"] == 128
    assert set(zero["state"]) == set(expected.state_dict())
    for name, value in expected.state_dict().items():
        assert torch.equal(zero["state"][name], value), name
    torch.testing.assert_close(zero["out"], expected(torch.ones(2, 256)).detach())
    torch.testing.assert_close(one["out"], zero["out"])


def sliced_load_run(path: str) -> dict[str, Any]:
    from strategies import FSDPStrategy
    from strategies.checkpoint_io import load_weights
    from trainer import Accelerator

    accelerator = Accelerator(strategy=FSDPStrategy(cpu=True, wrap_classes=[Recorded]))
    with accelerator.init_module():
        model = Wide()
    model = accelerator.prepare(model)
    load_weights(Path(path), model)
    return {"state": accelerator.get_state_dict(model)}


def test_full_safetensors_weights_load_into_a_sharded_model_slice_by_slice(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    torch.manual_seed(9)
    source = Wide()
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, str(tmp_path / "model.safetensors"))
    state = run_distributed(sliced_load_run, str(tmp_path))[0]["state"]
    for name, value in source.state_dict().items():
        assert torch.equal(state[name], value), name


def resume_run(tmp: str, steps: int, ckpt: bool) -> dict[str, Any]:
    """The Trainer face, the model built in configure_model (meta, sharded): fit to `steps`, optionally resuming from "last"."""
    from torch.utils.data import DataLoader

    from callbacks.checkpoint import ModelCheckpoint
    from strategies import FSDPStrategy
    from trainer import Trainer, TrainModule

    class LM(TrainModule):
        def __init__(self) -> None:
            super().__init__()
            self.model: nn.Module | None = None

        def configure_model(self) -> None:
            if self.model is None:
                torch.manual_seed(0)
                self.model = llama()

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            return self.model(input_ids=batch, labels=batch).loss

        def configure_optimizers(self) -> Any:
            return torch.optim.AdamW(self.parameters(), lr=1e-2)

    module = LM()
    data = torch.randint(0, VOCAB, (16, SEQ), generator=torch.Generator().manual_seed(4))
    loader = DataLoader(list(data), batch_size=2, shuffle=True, generator=torch.Generator().manual_seed(1))
    trainer = Trainer(strategy=FSDPStrategy(cpu=True, wrap_classes=[block_class()]), max_steps=steps, project_dir=tmp,
                      callbacks=[ModelCheckpoint(dirpath=os.path.join(tmp, "ckpt"), save_last=True, every_n_train_steps=1)],
                      enable_progress_bar=False, enable_model_summary=False, log_with=None, seed=1)
    trainer.fit(module, loader, ckpt_path="last" if ckpt else None)
    return {"state": trainer.strategy.module_state_dict(module), "step": trainer.global_step}


def test_resume_of_a_model_built_empty_under_fsdp_is_exact(tmp_path: Path) -> None:
    whole = run_distributed(resume_run, str(tmp_path / "whole"), 5, False)[0]
    run_distributed(resume_run, str(tmp_path / "parts"), 2, False)
    resumed = run_distributed(resume_run, str(tmp_path / "parts"), 5, True)[0]
    assert resumed["step"] == whole["step"] == 5
    for name, value in whole["state"].items():
        assert torch.equal(resumed["state"][name], value), name


def bf16_units_run() -> list[float]:
    from strategies import FSDPStrategy
    from tests.distributed.test_fsdp import Block, _data, _net
    from trainer import Accelerator

    accelerator = Accelerator(strategy=FSDPStrategy(cpu=True, wrap_classes=[Block], precision="bf16"))
    model = _net()  # a root layer before and after the blocks: each sees what the units around it return
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    model, opt = accelerator.prepare(model, opt)
    x, y = _data()
    losses = []
    for i in range(0, 32, 16):
        part = slice(i + 8 * accelerator.process_index, i + 8 * accelerator.process_index + 8)
        out = model(x[part])
        assert out.dtype == torch.float32  # the model's output: float32, as the policy says
        loss = nn.functional.mse_loss(out, y[part])
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    return losses


def test_bf16_policy_with_block_units_runs_the_root_layers_after_them() -> None:
    losses = run_distributed(bf16_units_run)[0]
    assert all(torch.isfinite(torch.tensor(losses)))


def tied_run(from_rank0: bool) -> dict[str, Any]:
    """Accelerate's ordinary order: the optimizer is built on the parameters as built, before prepare; with process 0's
    weights through Accelerate's FSDP2 plugin (decoder-layer units, activation checkpointing), then one step."""
    from strategies import FSDPStrategy
    from trainer import Accelerator, FullyShardedDataParallelPlugin, init_empty_weights

    if from_rank0:
        plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                                transformer_cls_names_to_wrap=["LlamaDecoderLayer"], activation_checkpointing=True,
                                                cpu_ram_efficient_loading=True)
        accelerator = Accelerator(cpu=True, fsdp_plugin=plugin)
    else:
        accelerator = Accelerator(strategy=FSDPStrategy(cpu=True, wrap_classes=[block_class()]))
    torch.manual_seed(0)
    if from_rank0 and accelerator.is_main_process:
        model = llama(tied=True)  # process 0: real weights, sliced out to the others
    else:
        with init_empty_weights(include_buffers=True) if from_rank0 else accelerator.init_module():
            model = llama(tied=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = accelerator.prepare(model, opt)
    state = accelerator.get_state_dict(model)
    part = tokens()[0].chunk(2)[accelerator.process_index]
    loss = model(input_ids=part, labels=part).loss
    accelerator.backward(loss)
    opt.step()
    return {"tied": model.lm_head.weight is model.model.embed_tokens.weight, "state": state,
            "loss": float(accelerator.reduce(loss.detach(), "mean")), "stepped": accelerator.get_state_dict(model)}


@pytest.mark.parametrize("from_rank0", [False, True], ids=["meta-init", "cpu-ram-efficient-loading"])
def test_tied_embeddings_stay_tied_and_equal_the_eager_build_under_fsdp(from_rank0: bool) -> None:
    torch.manual_seed(0)
    model = llama(tied=True)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loss = sum(model(input_ids=h, labels=h).loss for h in tokens()[0].chunk(2)) / 2
    loss.backward()
    opt.step()
    ranks = run_distributed(tied_run, from_rank0)
    assert all(r["tied"] for r in ranks)
    for name, value in expected.items():
        assert torch.equal(ranks[0]["state"][name], value), name
    # the optimizer built before prepare steps the shards (process 0's real parameters were replaced by them too)
    assert ranks[0]["loss"] == pytest.approx(float(loss.detach()), abs=1e-5)
    for name, value in model.state_dict().items():
        torch.testing.assert_close(ranks[0]["stepped"][name], value, atol=1e-5, rtol=0, msg=name)


def _units(_: Any) -> dict[str, list[str]]:
    """The modules each way of asking for FSDP makes a unit of (fully_shard applied), named by class."""
    from torch.distributed.fsdp import FSDPModule

    from strategies.fsdp import FSDPStrategy
    from trainer import Accelerator
    from trainer.accelerator.config import FullyShardedDataParallelPlugin

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.lin(x))

    class Stack(nn.Module):  # a hand-written model: its blocks are the longest list of same-class modules
        def __init__(self) -> None:
            super().__init__()
            self.embed, self.layers, self.head = nn.Linear(4, 8), nn.ModuleList(Layer() for _ in range(3)), nn.Linear(8, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.embed(x)
            for layer in self.layers:
                x = layer(x)
            return self.head(x)

    cases = {
        "llama, default": (llama, lambda: Accelerator(cpu=True, strategy=FSDPStrategy(cpu=True))),
        "llama, wrap_classes=()": (llama, lambda: Accelerator(cpu=True, strategy=FSDPStrategy(cpu=True, wrap_classes=()))),
        "llama, Accelerate's default plugin": (llama, lambda: Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))),
        "stack, default": (Stack, lambda: Accelerator(cpu=True, strategy="fsdp")),
        "mlp, default": (lambda: nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)), lambda: Accelerator(cpu=True, strategy="fsdp")),
    }
    found = {}
    for name, (build, accelerator) in cases.items():
        acc = accelerator()
        model = acc.prepare(build())
        found[name] = sorted(type(m).__name__.removeprefix("FSDP") for m in model.modules() if isinstance(m, FSDPModule))
        acc.end_training()
    return found


def test_fsdp_shards_each_repeated_block_then_the_root_by_default() -> None:
    # before, the default was the root alone: every parameter gathered at once in forward (no memory saved while computing)
    units = run_distributed(_units, None, nprocs=2)[0]
    assert units == {
        "llama, default": ["LlamaDecoderLayer", "LlamaDecoderLayer", "LlamaForCausalLM"],
        "llama, wrap_classes=()": ["LlamaForCausalLM"],
        "llama, Accelerate's default plugin": ["LlamaForCausalLM"],  # Accelerate's auto_wrap_policy default is NO_WRAP
        "stack, default": ["Layer", "Layer", "Layer", "Stack"],
        "mlp, default": ["Sequential"],
    }
