"""Empty (meta-device) init made real, activation checkpointing, compile and the FSDP plugin, in one process."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from strategies.activation_checkpointing import apply_activation_checkpointing
from strategies.materialize import materialize
from trainer import Accelerator, FullyShardedDataParallelPlugin, TorchDynamoPlugin, Trainer, TrainModule, init_empty_weights


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.ReLU(), nn.Linear(16, 4), nn.Embedding(5, 3))


def built_both_ways(build: Any, seed: int) -> tuple[nn.Module, nn.Module, torch.Tensor]:
    """`build()` eagerly and on the meta device then materialized, each after ``manual_seed(seed)``; also the draw that
    followed the eager build."""
    torch.manual_seed(seed)
    eager = build()
    after_eager = torch.rand(3)
    torch.manual_seed(seed)
    with torch.device("meta"):
        empty = build()
    materialize(empty, torch.device("cpu"))
    return eager, empty, after_eager


def assert_same_state(expected: nn.Module, ours: nn.Module) -> None:
    for (name, a), b in zip(expected.state_dict().items(), ours.state_dict().values()):
        assert torch.equal(a, b), name


def tiny_llama(**kwargs: Any) -> nn.Module:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                                      **kwargs)
    return transformers.LlamaForCausalLM(config)


def test_materialize_equals_the_eager_constructor_and_leaves_the_generator_where_it_would() -> None:
    eager, empty, after_eager = built_both_ways(mlp, 0)
    assert torch.equal(torch.rand(3), after_eager)
    assert_same_state(eager, empty)


def test_materialize_equals_a_seeded_hugging_face_model() -> None:
    eager, empty, _ = built_both_ways(lambda: tiny_llama(num_hidden_layers=2), 1)
    ours = dict(empty.named_buffers()) | empty.state_dict()
    for name, value in (dict(eager.named_buffers()) | eager.state_dict()).items():  # the rotary buffers too
        assert torch.equal(ours[name], value), name


def test_materialize_keeps_tied_weights_tied() -> None:
    eager, empty, _ = built_both_ways(lambda: tiny_llama(num_hidden_layers=1, tie_word_embeddings=True), 2)
    assert empty.lm_head.weight is empty.model.embed_tokens.weight
    assert_same_state(eager, empty)


def test_materialize_names_tensors_nothing_initializes() -> None:
    class NoReset(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(3))
            self.register_buffer("table", torch.arange(4.0))

    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(2, 2), NoReset())
    with pytest.raises(ValueError, match=r"initialized by nothing: 1\.table, 1\.w.*reset_parameters"):
        materialize(model, torch.device("cpu"))


def test_materialize_keeps_tensors_built_for_real() -> None:
    real = nn.Linear(3, 3)
    with torch.device("meta"):
        empty = nn.Linear(3, 3)
    model = nn.Sequential(real, empty)
    before = real.weight.detach().clone()
    materialize(model, torch.device("cpu"))
    assert torch.equal(model[0].weight, before) and not model[1].weight.is_meta


def test_init_empty_weights_keeps_buffers_real_unless_asked() -> None:
    with init_empty_weights():
        bn = nn.BatchNorm1d(4)
    assert bn.weight.is_meta and not bn.running_mean.is_meta
    with init_empty_weights(include_buffers=True):
        bn = nn.BatchNorm1d(4)
    assert bn.running_mean.is_meta


def test_accelerator_prepares_an_empty_model_and_repoints_its_optimizer() -> None:
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    eager = mlp()
    torch.manual_seed(0)
    with accelerator.init_module(empty_init=True):
        model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # built on the meta parameters
    model, opt = accelerator.prepare(model, opt)
    assert torch.equal(model[0].weight, eager[0].weight)
    prepared = {id(p) for g in opt.param_groups for p in g["params"]}
    assert prepared == {id(p) for p in model.parameters()}
    model[0](torch.ones(1, 8)).sum().backward()
    before = model[0].weight.detach().clone()
    opt.step()
    assert not torch.equal(model[0].weight, before)


def test_a_parameter_replaced_twice_in_setup_repoints_the_optimizer_at_the_last_one() -> None:
    """Materialized, then moved to a device that makes new parameters (XLA): the optimizer follows to the newest."""
    accelerator = Accelerator(cpu=True)
    strategy = accelerator.strategy
    with torch.device("meta"):
        model = nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    built = list(model.named_parameters())
    model.weight, model.bias = nn.Parameter(torch.zeros(2, 2)), nn.Parameter(torch.zeros(2))  # materialized
    strategy.remember_replaced(built, model)
    materialized = list(model.named_parameters())
    model.weight, model.bias = nn.Parameter(torch.ones(2, 2)), nn.Parameter(torch.ones(2))  # moved as new parameters
    strategy.remember_replaced(materialized, model)
    strategy.setup_optimizer(opt)
    assert [id(p) for p in opt.param_groups[0]["params"]] == [id(model.weight), id(model.bias)]


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.runs = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.runs += 1
        return torch.tanh(self.lin(x))


def test_activation_checkpointing_recomputes_blocks_and_keeps_plain_keys_and_gradients() -> None:
    torch.manual_seed(0)
    plain = nn.Sequential(Block(), Block())
    torch.manual_seed(0)
    checked = nn.Sequential(Block(), Block())
    assert apply_activation_checkpointing(checked, {Block}) == list(checked)
    x = torch.randn(4, 6)
    plain(x).sum().backward()
    checked(x).sum().backward()
    assert [b.runs for b in checked] == [2, 2] and [b.runs for b in plain] == [1, 1]
    assert list(checked.state_dict()) == list(plain.state_dict())
    for a, b in zip(plain.parameters(), checked.parameters()):
        assert torch.equal(a.grad, b.grad)
    with pytest.raises(ValueError, match="selects no submodule"):
        apply_activation_checkpointing(nn.Sequential(nn.Linear(2, 2)), {Block})
    with pytest.raises(TypeError, match="module classes"):
        apply_activation_checkpointing(checked, "Block")


class Regressor(TrainModule):
    def __init__(self) -> None:
        super().__init__()
        self.net: nn.Module | None = None
        self.calls: list[str] = []

    def setup(self, stage: str) -> None:
        self.calls.append("setup")

    def configure_model(self) -> None:
        self.calls.append("configure_model")
        if self.net is None:
            self.net = nn.Sequential(Block(), nn.Linear(6, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(self(x), y)

    def configure_optimizers(self) -> Any:
        self.calls.append("configure_optimizers")
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _loader() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    return DataLoader(TensorDataset(torch.randn(16, 6, generator=g), torch.randn(16, 1, generator=g)), batch_size=4)


def _trainer(tmp_path: Any, **kwargs: Any) -> Trainer:
    return Trainer(max_epochs=1, project_dir=tmp_path, log_with=None, enable_checkpointing=False, enable_progress_bar=False,
                   enable_model_summary=False, accelerator="cpu", **kwargs)


def test_configure_model_runs_after_setup_before_configure_optimizers_once_per_run(tmp_path: Any) -> None:
    module = Regressor()
    trainer = _trainer(tmp_path)
    trainer.fit(module, _loader())
    assert module.calls == ["setup", "configure_model", "configure_optimizers"]
    trainer.predict(module, DataLoader(torch.randn(4, 6), batch_size=2))  # again, and idempotent: the layers stay
    assert module.calls[3:] == ["setup", "configure_model"]
    with trainer.init_module():
        layer = nn.Linear(2, 2)
    assert layer.weight.device.type == "cpu" and not layer.weight.is_meta


def test_fit_takes_a_compiled_module_and_trains_like_eager(tmp_path: Any) -> None:
    torch.manual_seed(0)
    eager = Regressor()
    _trainer(tmp_path).fit(eager, _loader())
    torch.manual_seed(0)
    module = Regressor()
    compiled = torch.compile(module, backend="aot_eager")
    _trainer(tmp_path).fit(compiled, _loader())
    assert getattr(module.forward, "_trainwright_compiled", False)
    assert list(module.state_dict()) == list(eager.state_dict())
    for a, b in zip(eager.parameters(), module.parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_accelerator_dynamo_backend_compiles_after_prepare_and_regional_compiles_blocks() -> None:
    accelerator = Accelerator(cpu=True, dynamo_backend="aot_eager")
    model = accelerator.prepare(nn.Sequential(Block(), nn.Linear(6, 1)))
    assert getattr(model.forward, "_trainwright_compiled", False)
    regional = Accelerator(cpu=True, dynamo_plugin=TorchDynamoPlugin(backend="aot_eager", use_regional_compilation=True))
    blocks = nn.ModuleList([Block(), Block()])
    holder = nn.Module()
    holder.blocks = blocks
    regional.prepare(holder)
    assert all(getattr(b.forward, "_trainwright_compiled", False) for b in blocks)
    assert not Accelerator(cpu=True).dynamo_plugin.enabled
    with pytest.raises(ValueError, match=r"not a torch\.compile mode"):
        TorchDynamoPlugin(backend="inductor", mode="fastest")


def test_fsdp_plugin_maps_accelerates_fields_and_refuses_fsdp1_ones() -> None:
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                            transformer_cls_names_to_wrap="Block, Other", activation_checkpointing=True,
                                            reshard_after_forward="SHARD_GRAD_OP", cpu_ram_efficient_loading=True,
                                            mixed_precision_policy={"param_dtype": "bfloat16", "reduce_dtype": "float32"})
    kwargs = plugin.strategy_kwargs()
    assert kwargs["wrap_classes"] == ("Block", "Other") == kwargs["activation_checkpointing_policy"]
    assert kwargs["reshard_after_forward"] is False and kwargs["cpu_ram_efficient_loading"] is True
    assert kwargs["mixed_precision_policy"].param_dtype == torch.bfloat16
    assert FullyShardedDataParallelPlugin(auto_wrap_policy="size_based_wrap", min_num_params=10).strategy_kwargs()["min_num_params"] == 10
    with pytest.raises(ValueError, match="only FSDP2"):
        FullyShardedDataParallelPlugin(fsdp_version=1)
    with pytest.raises(ValueError, match="FSDP1 setting"):
        FullyShardedDataParallelPlugin(backward_prefetch="BACKWARD_PRE")
    with pytest.raises(ValueError, match="SHARDED_STATE_DICT"):
        FullyShardedDataParallelPlugin(state_dict_type="FULL_STATE_DICT")
    with pytest.raises(ValueError, match="HYBRID_SHARD needs a 2-D mesh"):
        FullyShardedDataParallelPlugin(sharding_strategy="HYBRID_SHARD").strategy_kwargs()
    with pytest.raises(ValueError, match="transformer_based_wrap"):
        FullyShardedDataParallelPlugin(activation_checkpointing=True)


def test_accelerate_config_fsdp_section_reaches_the_plugin() -> None:
    from trainer.cli.accelerate_config import settings_from_accelerate

    settings = settings_from_accelerate({
        "distributed_type": "FSDP", "num_processes": 2,
        "fsdp_config": {"fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "fsdp_transformer_layer_cls_to_wrap": "LlamaDecoderLayer",
                        "fsdp_activation_checkpointing": True, "fsdp_offload_params": False, "fsdp_cpu_ram_efficient_loading": True,
                        "fsdp_reshard_after_forward": True, "fsdp_state_dict_type": "SHARDED_STATE_DICT"},
    })
    kwargs = FullyShardedDataParallelPlugin(**settings.fsdp_plugin).strategy_kwargs()
    assert kwargs["wrap_classes"] == ("LlamaDecoderLayer",) and kwargs["cpu_ram_efficient_loading"]
    with pytest.raises(ValueError, match="fsdp_bogus"):
        settings_from_accelerate({"distributed_type": "FSDP", "fsdp_config": {"fsdp_bogus": 1}})
    with pytest.raises(ValueError, match="only FSDP2"):
        settings_from_accelerate({"distributed_type": "FSDP", "fsdp_config": {"fsdp_version": 1}})


def test_trainer_compile_option_compiles_the_blocks_after_setup(tmp_path: Any) -> None:
    class Blocks(Regressor):
        def configure_model(self) -> None:
            if self.net is None:
                self.blocks = nn.ModuleList([Block(), Block()])
                self.net = nn.Linear(6, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for block in self.blocks:
                x = block(x)
            return self.net(x)

    module = Blocks()
    _trainer(tmp_path, compile={"backend": "aot_eager", "use_regional_compilation": True}).fit(module, _loader())
    assert all(getattr(b.forward, "_trainwright_compiled", False) for b in module.blocks)
    assert not getattr(module.forward, "_trainwright_compiled", False)
    with pytest.raises(TypeError, match="compile="):
        _trainer(tmp_path, compile="yes")
    with pytest.raises(ValueError, match="pick one"):
        _trainer(tmp_path, compile=True).fit(torch.compile(Blocks()), _loader())


def test_accelerate_config_dynamo_section_reaches_the_accelerator(monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from trainer.cli.accelerate_config import settings_from_accelerate

    settings = settings_from_accelerate({"distributed_type": "NO", "dynamo_config": {
        "dynamo_backend": "AOT_EAGER", "dynamo_mode": "default", "dynamo_use_fullgraph": False, "dynamo_use_regional_compilation": True}})
    monkeypatch.setenv("TRAINWRIGHT_DYNAMO_PLUGIN", json.dumps(settings.dynamo_plugin))  # what `trainer launch` sets
    accelerator = Accelerator(cpu=True)
    assert accelerator.dynamo_plugin.backend == "aot_eager" and accelerator.dynamo_plugin.use_regional_compilation
    with pytest.raises(ValueError, match="dynamo_bogus"):
        settings_from_accelerate({"distributed_type": "NO", "dynamo_config": {"dynamo_bogus": 1}})
