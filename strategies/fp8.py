"""FP8 training, Accelerate's way: pick the backend, check the machine, convert the model before it is wrapped.

    accelerator = Accelerator(mixed_precision="fp8", kwargs_handlers=[AORecipeKwargs()])
    model, optimizer = accelerator.prepare(model, optimizer)   # nn.Linear -> torchao Float8Linear, then DDP / FSDP

The backend is torchao's float8 training (``convert_to_float8``): every ``nn.Linear`` whose in/out features divide by 16,
except the model's first and last linear layers (Accelerate's default filter, for stability), becomes a ``Float8Linear``;
the rest of the model runs under bf16 autocast. Transformer Engine and MS-AMP are recognised but not wired: asking for
them is an error naming the package and the GPU they need. torchao is imported only when FP8 is used.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

FP8_REQUIREMENT = "FP8 training needs an NVIDIA GPU of compute capability 8.9 or newer (Ada, Hopper, Blackwell) with torchao or Transformer Engine"
BACKENDS = ("AO", "TE", "MSAMP")
_PACKAGES = {"AO": ("torchao", "torchao"), "TE": ("transformer_engine", "transformer-engine"), "MSAMP": ("msamp", "msamp")}


def check_fp8_device(device_type: str, capability: tuple[int, int] | None, what: str) -> None:
    """Refuse FP8 (`what` names the request) on a machine without an NVIDIA GPU of compute capability 8.9+."""
    if device_type != "cuda" or capability is None or tuple(capability) < (8, 9):
        where = "this machine has no GPU" if device_type != "cuda" else f"this GPU has compute capability {capability}"
        raise ValueError(f"{what}: {FP8_REQUIREMENT}, and {where}. Use mixed_precision='bf16' (or 'fp16') instead")


def normalize_backend(value: Any, what: str) -> str:
    """Accelerate's backend names (``"AO"``, ``"TE"``, ``"MSAMP"``; any case, an `FP8BackendType`) to one of `BACKENDS`."""
    key = str(getattr(value, "value", value)).strip().upper()
    if key not in BACKENDS:
        raise ValueError(f"{what}={value!r} is not an FP8 backend; choose one of {BACKENDS} (torchao, Transformer Engine, MS-AMP)")
    return key


def resolve_backend(recipes: list[Any]) -> str:
    """The backend for the FP8 recipe records given (at most one, as in Accelerate), else ``ACCELERATE_FP8_BACKEND``,
    else the first installed of torchao, Transformer Engine, MS-AMP (Accelerate's order)."""
    if len(recipes) > 1:
        raise ValueError(f"kwargs_handlers has {len(recipes)} FP8 recipes ({', '.join(type(r).__name__ for r in recipes)}); pass one")
    if recipes:
        recipe = recipes[0]
        name = type(recipe).__name__
        if name == "AORecipeKwargs":
            return "AO"
        if name == "TERecipeKwargs":
            return "TE"
        if name == "MSAMPRecipeKwargs":
            return "MSAMP"
        backend = getattr(recipe, "backend", None) or os.environ.get("ACCELERATE_FP8_BACKEND")
        if backend is None:  # Accelerate's default: MS-AMP where installed, else TE
            import importlib.util

            return "MSAMP" if importlib.util.find_spec("msamp") is not None else "TE"
        key = normalize_backend(backend, "FP8RecipeKwargs(backend)")
        if key == "AO":  # as in Accelerate, whose FP8RecipeKwargs takes only MSAMP or TE
            raise ValueError("FP8RecipeKwargs(backend='AO') is not accepted (as in Accelerate); pass AORecipeKwargs() for torchao")
        return key
    env = os.environ.get("ACCELERATE_FP8_BACKEND") or os.environ.get("TRAINER_FP8_BACKEND")
    if env and env.strip().upper() != "NO":
        return normalize_backend(env, "ACCELERATE_FP8_BACKEND")
    import importlib.util

    for backend in BACKENDS:
        if importlib.util.find_spec(_PACKAGES[backend][0]) is not None:
            return backend
    raise ImportError(
        "mixed_precision='fp8' needs an FP8 backend, and none is installed: pip install torchao (or Transformer Engine); "
        f"{FP8_REQUIREMENT}"
    )


def require_backend(backend: str) -> None:
    """Import the backend's package now: torchao is wired; Transformer Engine and MS-AMP are not (a clear error either way)."""
    module, pip_name = _PACKAGES[backend]
    try:
        __import__(module)
    except ImportError as err:
        raise ImportError(
            f"FP8 backend {backend!r} needs the {pip_name} package, which is not installed: pip install {pip_name}. "
            f"{FP8_REQUIREMENT}"
        ) from err
    if backend != "AO":
        raise NotImplementedError(
            f"FP8 backend {backend!r} ({pip_name}) is installed but not wired into trainwright; use AORecipeKwargs() "
            "(torchao), or mixed_precision='bf16'"
        )


def find_first_last_linear_layers(model: nn.Module) -> tuple[str | None, str | None]:
    """The qualified names of the model's first and last ``nn.Linear`` (Accelerate keeps both in high precision)."""
    first = last = None
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear):
            first = name if first is None else first
            last = name
    return first, last


def filter_linear_layers(module: nn.Module, fqn: str, layers_to_filter: list[str | None]) -> bool:
    """Accelerate's filter: convert a linear layer unless a dimension does not divide by 16 or it is one of `layers_to_filter`."""
    if isinstance(module, nn.Linear) and (module.in_features % 16 != 0 or module.out_features % 16 != 0):
        return False
    return fqn not in layers_to_filter


def default_module_filter(model: nn.Module) -> Callable[[nn.Module, str], bool]:
    """The filter `convert_to_float8` uses when the recipe has no ``module_filter_func``: `filter_linear_layers`
    skipping the model's first and last linear layers."""
    skip = list(find_first_last_linear_layers(model))
    return lambda module, fqn: filter_linear_layers(module, fqn, skip)


def filter_first_and_last_linear_layers(module: nn.Module, fqn: str) -> bool:
    """Accelerate's helper of that name: `filter_linear_layers` with the first and last linear layers *of `module`* skipped."""
    return filter_linear_layers(module, fqn, list(find_first_last_linear_layers(module)))


def has_ao_layers(model: nn.Module) -> bool:
    """Whether `model` holds a torchao ``Float8Linear`` (it was converted)."""
    from torchao.float8.float8_linear import Float8Linear

    return any(isinstance(module, Float8Linear) for module in model.modules())


def convert_model_to_fp8_ao(model: nn.Module, config: Any = None, module_filter_func: Callable[..., bool] | None = None) -> None:
    """Accelerate's ``convert_model_to_fp8_ao``: `convert_to_float8` with a ``Float8LinearConfig`` (None: torchao's
    default) and a filter (None: the default one), in place."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    convert_to_float8_training(model, config=config if config is not None else Float8LinearConfig(),
                               module_filter_fn=module_filter_func or default_module_filter(model))


def float8_config(recipe: Any) -> Any:
    """torchao's ``Float8LinearConfig`` for an `AORecipeKwargs`: its ``config``, else one built from ``pad_inner_dim`` and
    ``enable_fsdp_float8_all_gather`` (each defaulting, as in Accelerate, to ``ACCELERATE_FP8_PAD_INNER_DIM`` /
    ``ACCELERATE_FP8_ENABLE_FSDP_FLOAT8_ALL_GATHER``, else True)."""
    from torchao.float8 import Float8LinearConfig

    config = getattr(recipe, "config", None)
    if config is not None:
        if not isinstance(config, Float8LinearConfig):
            raise TypeError(f"AORecipeKwargs(config={config!r:.80}) must be a torchao.float8.Float8LinearConfig")
        for field in ("pad_inner_dim", "enable_fsdp_float8_all_gather"):
            value = getattr(recipe, field, None)
            if value is not None and value != getattr(config, field):
                raise ValueError(
                    f"AORecipeKwargs({field}={value!r}) disagrees with its config's {field}={getattr(config, field)!r}; "
                    "set it in one place"
                )
        return config

    def flag(field: str) -> bool:
        value = getattr(recipe, field, None)
        if value is not None:
            return bool(value)
        env = os.environ.get(f"ACCELERATE_FP8_{field.upper()}")
        return True if env is None else env.strip().lower() in ("1", "true", "yes", "y", "on")

    return Float8LinearConfig(pad_inner_dim=flag("pad_inner_dim"), enable_fsdp_float8_all_gather=flag("enable_fsdp_float8_all_gather"))


def convert_to_float8(model: nn.Module, recipe: Any = None) -> nn.Module:
    """Swap `model`'s eligible ``nn.Linear`` layers for torchao ``Float8Linear`` in place (before any DDP/FSDP wrapping),
    under the `AORecipeKwargs` `recipe` (None: the defaults); returns `model`."""
    try:
        from torchao.float8 import convert_to_float8_training
    except ImportError as err:
        raise ImportError(f"FP8 with torchao needs the torchao package: pip install torchao. {FP8_REQUIREMENT}") from err
    if not isinstance(model, nn.Module):
        raise TypeError(f"convert_to_float8 takes an nn.Module, got {type(model).__name__}")
    config = float8_config(recipe)
    filter_fn = getattr(recipe, "module_filter_func", None)
    if filter_fn is not None and not callable(filter_fn):
        raise TypeError(f"AORecipeKwargs(module_filter_func={filter_fn!r:.60}) must be a callable (module, fqn) -> bool")
    convert_to_float8_training(model, config=config, module_filter_fn=filter_fn or default_module_filter(model))
    return model


def uses_fsdp_float8_all_gather(recipe: Any) -> bool:
    return bool(float8_config(recipe).enable_fsdp_float8_all_gather)


def precompute_scales_after_step(optimizer: torch.optim.Optimizer, model: nn.Module) -> None:
    """With FSDP2 and float8 all-gather: refresh the float8 weight scales after each optimizer step (Accelerate, torchao)."""
    from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

    optimizer.register_step_post_hook(lambda *args, **kwargs: precompute_float8_dynamic_scale_for_fsdp(model))


__all__ = [
    "BACKENDS", "FP8_REQUIREMENT", "check_fp8_device", "convert_model_to_fp8_ao", "convert_to_float8", "default_module_filter",
    "filter_first_and_last_linear_layers", "filter_linear_layers", "find_first_last_linear_layers", "float8_config", "has_ao_layers",
    "normalize_backend", "precompute_scales_after_step", "require_backend",
    "resolve_backend", "uses_fsdp_float8_all_gather",
]
