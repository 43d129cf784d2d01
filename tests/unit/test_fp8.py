"""FP8 training: backend choice, the GPU rule, and torchao's Float8Linear conversion (run for real on CPU, where
torch's ``_scaled_mm`` runs float8 matmuls)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from strategies import fp8
from trainer import Accelerator
from trainer.state import AcceleratorState
from trainer.utils import AORecipeKwargs, FP8RecipeKwargs, MSAMPRecipeKwargs, TERecipeKwargs


def _float8() -> tuple[type, type]:
    """torchao's ``Float8Linear`` and ``Float8LinearConfig`` (torchao is in the test extra; imported when a test needs
    it, not to collect: it takes seconds)."""
    from torchao.float8 import Float8LinearConfig
    from torchao.float8.float8_linear import Float8Linear

    return Float8Linear, Float8LinearConfig


def _mlp() -> nn.Sequential:
    # first (32->64) and last (64->8) linears stay high precision; 64->48 and 48->64 convert; 64->20 does not (20 % 16)
    return nn.Sequential(
        nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 64), nn.ReLU(),
        nn.Linear(64, 20), nn.ReLU(), nn.Linear(20, 8),
    )


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)


def test_convert_swaps_the_linears_the_default_filter_allows_and_trains() -> None:
    Float8Linear, _ = _float8()
    torch.manual_seed(0)
    model = _mlp()
    reference = copy.deepcopy(model)
    fp8.convert_to_float8(model, AORecipeKwargs())
    kinds = {name: type(m) for name, m in model.named_children() if isinstance(m, nn.Linear)}
    assert kinds == {"0": nn.Linear, "2": Float8Linear, "4": Float8Linear, "6": nn.Linear, "8": nn.Linear}

    x, y = _batch()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    ref_loss = nn.functional.mse_loss(reference(x), y)
    ref_loss.backward()
    assert torch.isfinite(loss)
    assert loss.item() != ref_loss.item()  # the float8 matmuls really ran (rounding differs) ...
    assert abs(loss.item() - ref_loss.item()) < 0.05 * abs(ref_loss.item())  # ... and stay close
    for (name, p), (_, p_ref) in zip(model.named_parameters(), reference.named_parameters()):
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        cosine = nn.functional.cosine_similarity(p.grad.flatten(), p_ref.grad.flatten(), dim=0)
        assert cosine > 0.95, (name, cosine)

    # training through the float8 layers follows the full-precision run: same start, both fit the batch
    runs = []
    for net in (model, reference):
        optimizer = torch.optim.Adam(net.parameters(), lr=1e-2)
        losses = []
        for _ in range(30):
            optimizer.zero_grad()
            step_loss = nn.functional.mse_loss(net(x), y)
            losses.append(step_loss.item())
            step_loss.backward()
            optimizer.step()
        runs.append(losses)
    (fp8_losses, ref_losses) = runs
    assert fp8_losses[-1] < 0.2 * fp8_losses[0] and ref_losses[-1] < 0.2 * ref_losses[0]
    assert abs(fp8_losses[-1] - ref_losses[-1]) < 0.1 * ref_losses[0]


def test_recipe_flags_config_and_filter_are_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    Float8Linear, Float8LinearConfig = _float8()
    config = fp8.float8_config(AORecipeKwargs())
    assert config.pad_inner_dim is True and config.enable_fsdp_float8_all_gather is True  # Accelerate's defaults
    config = fp8.float8_config(AORecipeKwargs(pad_inner_dim=False, enable_fsdp_float8_all_gather=False))
    assert config.pad_inner_dim is False and config.enable_fsdp_float8_all_gather is False
    monkeypatch.setenv("ACCELERATE_FP8_PAD_INNER_DIM", "false")
    assert fp8.float8_config(AORecipeKwargs()).pad_inner_dim is False
    given = Float8LinearConfig(pad_inner_dim=False)
    assert fp8.float8_config(AORecipeKwargs(config=given)) is given
    with pytest.raises(ValueError, match="pad_inner_dim=True"):
        fp8.float8_config(AORecipeKwargs(config=given, pad_inner_dim=True))
    with pytest.raises(TypeError, match="Float8LinearConfig"):
        fp8.float8_config(AORecipeKwargs(config={"pad_inner_dim": True}))

    seen: list[str] = []

    def only_layer_4(module: nn.Module, fqn: str) -> bool:
        seen.append(fqn)
        return fqn == "4"

    model = fp8.convert_to_float8(_mlp(), AORecipeKwargs(module_filter_func=only_layer_4))
    assert [name for name, m in model.named_children() if isinstance(m, Float8Linear)] == ["4"]
    assert "0" in seen and "8" in seen
    with pytest.raises(TypeError, match="module_filter_func"):
        fp8.convert_to_float8(_mlp(), AORecipeKwargs(module_filter_func="4"))


def test_default_filter_matches_accelerates() -> None:
    model = _mlp()
    assert fp8.find_first_last_linear_layers(model) == ("0", "8")
    keep = fp8.default_module_filter(model)
    assert [keep(m, n) for n, m in model.named_children() if isinstance(m, nn.Linear)] == [False, True, True, False, False]


def test_backend_choice_and_the_unwired_backends_name_their_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ACCELERATE_FP8_BACKEND", raising=False)
    assert fp8.resolve_backend([AORecipeKwargs()]) == "AO"
    assert fp8.resolve_backend([TERecipeKwargs()]) == "TE"
    assert fp8.resolve_backend([MSAMPRecipeKwargs()]) == "MSAMP"
    assert fp8.resolve_backend([FP8RecipeKwargs(backend="msamp")]) == "MSAMP"
    assert fp8.resolve_backend([FP8RecipeKwargs()]) == "TE"  # Accelerate's default without MS-AMP installed
    assert fp8.resolve_backend([]) == "AO"  # torchao is the installed backend here
    with pytest.raises(ValueError, match="AORecipeKwargs"):
        fp8.resolve_backend([FP8RecipeKwargs(backend="AO")])
    with pytest.raises(ValueError, match="'XLA' is not an FP8 backend"):
        fp8.resolve_backend([FP8RecipeKwargs(backend="XLA")])
    with pytest.raises(ValueError, match="2 FP8 recipes"):
        fp8.resolve_backend([AORecipeKwargs(), TERecipeKwargs()])
    monkeypatch.setenv("ACCELERATE_FP8_BACKEND", "te")
    assert fp8.resolve_backend([]) == "TE"

    fp8.require_backend("AO")
    with pytest.raises(ImportError, match=r"transformer-engine.*compute capability 8\.9"):
        fp8.require_backend("TE")
    with pytest.raises(ImportError, match=r"msamp.*compute capability 8\.9"):
        fp8.require_backend("MSAMP")


def test_accelerator_refuses_fp8_without_a_capable_gpu() -> None:
    with pytest.raises(ValueError, match=r"AORecipeKwargs\(\.\.\.\)\] \(an FP8 recipe\): FP8 training needs an NVIDIA GPU"):
        Accelerator(cpu=True, mixed_precision="fp8", kwargs_handlers=[AORecipeKwargs()])
    with pytest.raises(ValueError, match="this machine has no GPU"):
        Accelerator(cpu=True, mixed_precision="fp8")
    with pytest.raises(ValueError, match=r"compute capability \(8, 0\)"):
        fp8.check_fp8_device("cuda", (8, 0), "mixed_precision='fp8'")
    fp8.check_fp8_device("cuda", (9, 0), "mixed_precision='fp8'")


def test_the_state_reports_fp8_as_accelerate_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under mixed_precision='fp8' (bf16 autocast and Float8 linears) `Accelerator.mixed_precision`,
    `accelerator.state.mixed_precision` and `AcceleratorState().mixed_precision` all say "fp8", as in Accelerate.
    (The GPU check is lifted: what is tested is the report, which is the same on any device.)"""
    from trainer.accelerator import accelerator as accelerator_module

    monkeypatch.setattr(accelerator_module, "check_fp8", lambda *args: None)
    accelerator = Accelerator(cpu=True, mixed_precision="fp8")
    assert accelerator.strategy.precision.mode == "bf16"
    assert accelerator.mixed_precision == accelerator.state.mixed_precision == AcceleratorState().mixed_precision == "fp8"
    assert "Mixed precision type: fp8" in str(accelerator.state)
    AcceleratorState._reset_state(True)
    assert Accelerator(cpu=True, mixed_precision="bf16").state.mixed_precision == "bf16"


_FP8_GPU = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


@pytest.mark.skipif(not _FP8_GPU, reason="needs an NVIDIA GPU of compute capability 8.9+")
def test_accelerator_prepare_converts_before_wrapping_and_trains_on_gpu() -> None:
    Float8Linear, _ = _float8()
    torch.manual_seed(0)
    accelerator = Accelerator(mixed_precision="fp8", kwargs_handlers=[AORecipeKwargs()])
    assert accelerator.fp8_enabled and accelerator.fp8_backend == "AO" and accelerator.mixed_precision == "fp8"
    assert accelerator.state.mixed_precision == AcceleratorState().mixed_precision == "fp8"
    model = _mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = accelerator.prepare(model, optimizer)
    inner = accelerator.unwrap_model(model)
    assert [n for n, m in inner.named_children() if isinstance(m, Float8Linear)] == ["2", "4"]
    x, y = (t.to(accelerator.device) for t in _batch())
    losses = []
    for _ in range(20):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x).float(), y)
        accelerator.backward(loss)
        optimizer.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < 0.9 * losses[0]
    with pytest.raises(ValueError, match="needs mixed_precision='fp8'"):
        Accelerator(kwargs_handlers=[AORecipeKwargs()])
    with pytest.raises(ImportError, match="transformer-engine"):
        Accelerator(mixed_precision="fp8", kwargs_handlers=[TERecipeKwargs()])


def test_accelerates_ao_helpers_from_trainer_utils() -> None:
    Float8Linear, _ = _float8()
    from trainer.utils import convert_model_to_fp8_ao, filter_first_and_last_linear_layers, has_ao_layers

    model = _mlp()
    assert not has_ao_layers(model)
    # Accelerate's helper looks at the module it is given: a lone 48->64 linear passes, a 64->20 one does not
    assert filter_first_and_last_linear_layers(nn.Linear(48, 64), "4") is True
    assert filter_first_and_last_linear_layers(nn.Linear(64, 20), "6") is False
    convert_model_to_fp8_ao(model)
    assert has_ao_layers(model)
    assert [n for n, m in model.named_children() if isinstance(m, Float8Linear)] == ["2", "4"]
