"""`estimate_memory` against one measured training iteration (single process), its extrapolation, CLI and errors.

The full grid (DDP, FSDP2, DeepSpeed, both optimizers, every precision) is `benchmarks/memory_estimate.py`; this keeps a
representative handful. The 2-process FSDP2/DDP check is tests/distributed/test_memory_estimate_distributed.py.
"""

from __future__ import annotations

import functools
import json

import pytest
import torch

from benchmarks.memory_estimate import MLP, tiny_llama
from strategies.blocks import find_blocks
from trainer.cli import main
from trainer.planning.budget import plan_memory
from trainer.planning.layouts import Setup, trace
from trainer.planning.measure import measure_iteration
from trainer.planning.memory import estimate_setup, read_size
from trainer.planning.models import meta_copy
from trainer.utils import estimate_memory

SINGLE = [  # (model, precision, activation checkpointing, optimizer)
    ("llama", "32-true", False, "adamw"),
    ("llama", "bf16-mixed", True, "sgd"),  # torch's SGD: no momentum, no state
    ("llama", "32-true", False, functools.partial(torch.optim.SGD, momentum=0.9)),  # a momentum buffer per parameter
    ("mlp", "bf16-true", False, "adamw"),
]


def _setup(model: str, precision: str, ac: bool, optimizer: object, strategy: str = "single", processes: int = 1) -> Setup:
    shape = (32,) if model == "llama" else (8, 512)
    return Setup(strategy=strategy, num_processes=processes, precision=precision, optimizer=optimizer,
                 activation_checkpointing=ac, batch_size=2, shape=shape, device="cpu")


def _model(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return tiny_llama() if name == "llama" else MLP()


@pytest.fixture
def one_thread():
    """Tiny real iterations on a busy machine: one torch thread (two wait on each other), restored after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_estimate_is_within_10_percent_of_the_measured_peak_and_breakdown(one_thread):
    for name, precision, ac, optimizer in SINGLE:
        setup = _setup(name, precision, ac, optimizer)
        model = _model(name)
        estimate = estimate_setup(meta_copy(model), setup)
        measured = measure_iteration(model, setup)
        label = f"{name} {precision} ac={ac} {setup.optimizer.name}"
        assert estimate.peak == pytest.approx(measured.peak, rel=0.10), label
        assert estimate.parameters == pytest.approx(measured.parameters, rel=0.10), label
        assert estimate.optimizer == pytest.approx(measured.optimizer, rel=0.10), label
        assert estimate.weights_only < 0.5 * measured.peak, label  # activations and temporaries dominate these runs


def test_sgd_means_torchs_default_no_momentum_and_momentum_is_asked_for(one_thread):
    """The short names are torch's classes with torch's defaults: ``sgd`` holds no state (torch.optim.SGD's momentum is
    0); momentum, asked for as a class path and its keyword arguments, holds one float32 buffer per parameter."""
    model = _model("llama")
    params = sum(p.numel() for p in model.parameters())
    plain = estimate_memory(model, optimizer="sgd", seq_len=32, batch_size=2, device="cpu")
    momentum = estimate_memory(model, optimizer="torch.optim.SGD", optimizer_kwargs={"momentum": 0.9}, seq_len=32, batch_size=2, device="cpu")
    partial = estimate_memory(model, optimizer=functools.partial(torch.optim.SGD, momentum=0.9), seq_len=32, batch_size=2, device="cpu")
    assert plain.optimizer == 0 and plain.optimizer_name == "sgd"
    assert momentum.optimizer == partial.optimizer == 4 * params
    assert momentum.optimizer_name == "torch.optim.SGD(momentum=0.9)"
    assert momentum.peak == partial.peak > plain.peak


def _muon_on_matrices(params):
    return torch.optim.Muon([p for p in params if p.ndim == 2])  # torch's Muon takes 2-D parameters only


def test_every_torch_optimizer_is_estimated_within_10_percent_of_a_measured_iteration(one_thread):
    """Each torch.optim class (by its short name, torch's defaults) on the tiny Llama: the real ``step()`` on fake
    tensors against one measured iteration. Adafactor and ASGD read their step count out of a tensor (a fake one has
    none); LBFGS and SparseAdam cannot step as a training loop does and are refused (below)."""
    from trainer.planning.optimizers import short_names

    names = sorted(set(short_names()) - {"lbfgs", "sparseadam", "muon"})
    assert {"adafactor", "asgd", "sgd", "adamw", "rprop"} <= set(names)
    for optimizer in [*names, _muon_on_matrices]:
        setup = Setup(strategy="single", num_processes=1, precision="32-true", optimizer=optimizer,
                      activation_checkpointing=False, batch_size=1, shape=(16,), device="cpu")
        model = _model("llama")
        estimate = estimate_setup(meta_copy(model), setup)
        measured = measure_iteration(model, setup)
        assert estimate.peak == pytest.approx(measured.peak, rel=0.10), setup.optimizer.name
        assert estimate.optimizer == pytest.approx(measured.optimizer, rel=0.10), setup.optimizer.name


@pytest.mark.parametrize(("optimizer", "kwargs", "error", "words"), [
    ("nesterov", None, ValueError, "not a torch.optim short name"),
    ("torch.optim.Nope", None, ValueError, "could not be imported"),
    ("adamw", {"momentum": 0.9}, TypeError, "unexpected keyword argument 'momentum'"),
    ("sgd", {"lr": -1}, ValueError, "Invalid learning rate"),
    ("lbfgs", None, ValueError, "closure"),
    ("sparseadam", None, ValueError, "sparse gradients"),
    ("muon", None, ValueError, "p.ndim == 2"),
    (3, None, TypeError, "callable params -> Optimizer"),
    ("sgd", [("momentum", 0.9)], TypeError, "must be a dict"),
])
def test_a_bad_optimizer_is_named_with_the_fix(optimizer, kwargs, error, words):
    with pytest.raises(error, match=words):
        estimate_memory(_model("llama"), optimizer=optimizer, optimizer_kwargs=kwargs, seq_len=16)


def test_a_deep_model_is_traced_with_a_few_blocks_and_extrapolated_exactly():
    model = meta_copy(MLP(blocks=7))  # (a Llama under FSDP: checked on an 8B Llama, docs/memory.md)
    setup = _setup("mlp", "bf16-mixed", True, "adamw")
    estimate = estimate_setup(model, setup)
    assert estimate.traced_blocks == (4, 5) and estimate.blocks == 7
    assert estimate.peak == pytest.approx(trace(meta_copy(model), find_blocks(model), setup).peak, rel=0.01)


def test_cli_prints_json_and_a_table(tmp_path, capsys):
    tiny_llama().config.save_pretrained(tmp_path)
    args = [str(tmp_path), "--precision", "bf16-mixed", "--batch_size", "2", "--seq_len", "32"]
    assert main(["estimate-memory", *args, "--strategy", "fsdp", "--num_processes", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["per_process"]) >= {"parameters", "gradients", "optimizer", "activations", "peak"}
    assert out["per_process"]["peak"] >= out["per_process"]["parameters"] + out["per_process"]["optimizer"] > 0
    assert out["config"]["num_processes"] == 2 and out["model"]["blocks"] == 2
    assert main(["estimate-memory", *args]) == 0
    assert "peak" in capsys.readouterr().out
    assert main(["estimate-memory", *args, "--strategy", "single", "--num_processes", "2"]) == 2
    assert "use strategy='ddp'" in capsys.readouterr().err
    params = sum(p.numel() for p in tiny_llama().parameters())
    sgd = [*args, "--json", "--optimizer", "torch.optim.SGD"]
    assert main(["estimate-memory", *sgd]) == 0
    assert json.loads(capsys.readouterr().out)["per_process"]["optimizer"] == 0
    assert main(["estimate-memory", *sgd, "--optimizer_kwargs", "momentum=0.9", "nesterov=True"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["per_process"]["optimizer"] == 4 * params
    assert out["config"]["optimizer"] == "torch.optim.SGD(momentum=0.9, nesterov=True)"
    assert main(["estimate-memory", *sgd, "--optimizer_kwargs", "momentum"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["estimate-memory", "--help"])
    assert "sgd = SGD without momentum" in " ".join(capsys.readouterr().out.split())


def test_budget_lists_what_fits_first_and_says_why_the_rest_does_not():
    model = meta_copy(_model("llama"))
    budget = estimate_setup(model, _setup("llama", "bf16-true", True, "adamw")).peak  # micro-batch 2 fits there
    plans = plan_memory(model, budget=budget, max_processes=1, global_batch_size=4, shape=(32,), strategies=("single",),
                        precisions=("bf16-true",), device="cpu")
    assert len(plans) == 2
    fitting = [p for p in plans if p.fits]
    assert fitting and all(p.peak <= budget for p in fitting)
    assert plans[: len(fitting)] == fitting
    assert all(p.micro_batch_size * p.accumulation_steps == 4 for p in fitting)
    assert any(p.precision == "bf16-true" and p.activation_checkpointing and p.micro_batch_size >= 2 for p in fitting)
    assert all("> budget" in p.reason and p.peak > budget for p in plans if not p.fits)


@pytest.mark.parametrize(("kwargs", "error", "words"), [
    ({"strategy": "zero9"}, ValueError, "strategy='zero9'"),
    ({"precision": "fp8"}, ValueError, "choose one of"),
    ({"batch_size": 0}, ValueError, "batch_size=0"),
    ({"strategy": "single", "num_processes": 4}, ValueError, "use strategy='ddp'"),
    ({"strategy": "deepspeed_stage_2", "num_processes": 2, "precision": "bf16-true"}, ValueError, "bf16-mixed"),
    ({"seq_len": None}, ValueError, "exactly one"),
    ({"seq_len": None, "input_shape": "64,512"}, TypeError, "tuple of positive ints"),
])
def test_bad_input_names_the_value_and_the_fix(kwargs, error, words):
    args = {"seq_len": 16, **kwargs}
    with pytest.raises(error, match=words):
        estimate_memory(MLP, **args)


def test_bad_model_and_budget():
    with pytest.raises(FileNotFoundError, match=r"config\.json"):
        estimate_memory("/nonexistent/model", seq_len=16)
    with pytest.raises(ValueError, match="language model"):
        estimate_memory(tiny_llama, input_shape=(16, 64))
    with pytest.raises(ValueError, match="'80 parsecs'"):
        read_size("80 parsecs")
    assert read_size("80GiB") == 80 * 2**30


def test_deepspeed_gradient_bucket_is_the_models_size_unless_configured_and_the_estimate_follows() -> None:
    """ZeRO allocates its gradient bucket whole (``reduce_bucket_size``; DeepSpeed's default 5e8 elements, 2 GB in
    float32, a hand check with MemTracker saw it on a 3.6M-parameter Llama). `DeepSpeedStrategy` caps the default at
    the model's trainable elements, keeps a configured size, and the estimate counts the bucket the strategy passes."""
    from strategies.deepspeed import REDUCE_BUCKET_ELEMENTS, DeepSpeedStrategy

    model = meta_copy(_model("llama"))
    elements = sum(p.numel() for p in model.parameters())
    zero = DeepSpeedStrategy(cpu=True).engine_config(2, model)["zero_optimization"]
    assert zero["reduce_bucket_size"] == elements
    auto = DeepSpeedStrategy(cpu=True, config={"zero_optimization": {"reduce_bucket_size": "auto"}})
    assert auto.engine_config(2, model)["zero_optimization"]["reduce_bucket_size"] == elements
    mine = DeepSpeedStrategy(cpu=True, config={"zero_optimization": {"reduce_bucket_size": 1000}})
    assert mine.engine_config(2, model)["zero_optimization"]["reduce_bucket_size"] == 1000
    with torch.device("meta"):
        huge = torch.nn.Linear(40_000, 20_000)  # 8e8 elements
    assert DeepSpeedStrategy(cpu=True).engine_config(2, huge)["zero_optimization"]["reduce_bucket_size"] == REDUCE_BUCKET_ELEMENTS
    setup = _setup("llama", "32-true", False, "adamw", "deepspeed_stage_2", 2)
    small = estimate_setup(model, setup)
    assert small.temporaries < 3 * elements * 4  # the bucket and its flattened copy: the model's size each, not 2 GB


def test_zero_defaults_are_deepspeeds() -> None:
    """The ZeRO-3 settings the estimate takes from DeepSpeed's defaults (our strategy passes none) are DeepSpeed's."""
    pytest.importorskip("deepspeed", reason="the deepspeed extra is not installed")
    from strategies.deepspeed import import_deepspeed

    import_deepspeed(torch.device("cpu"))  # (DeepSpeed picks its accelerator at import)
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    from trainer.planning.zero import ZERO_DEFAULTS

    config = DeepSpeedZeroConfig(stage=3)
    for key, value in ZERO_DEFAULTS.items():
        assert getattr(config, key.removeprefix("stage3_")) == value, key
