"""Accelerate's ``is_*_available`` checks: what this machine has, as real checks (a package that can be imported, a
device torch can use), without importing the optional packages themselves (``importlib.util.find_spec``).

    from trainer.utils import is_xpu_available, is_schedulefree_available
    device = "xpu" if is_xpu_available() else "cpu"
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
from collections.abc import Callable

import torch


@functools.cache
def _package(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package that fails to import, or a module without a spec
        return False


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _has(module: str) -> Callable[[], bool]:
    def check() -> bool:
        return _package(module)

    check.__name__ = f"is_{module}_available"
    check.__doc__ = f"Whether the ``{module}`` package can be imported here."
    return check


is_aim_available = _has("aim")
is_amdsmi_available = _has("amdsmi")
is_boto3_available = _has("boto3")
is_clearml_available = _has("clearml")
is_comet_ml_available = _has("comet_ml")
is_datasets_available = _has("datasets")
is_deepspeed_available = _has("deepspeed")
is_dvclive_available = _has("dvclive")
is_lomo_available = _has("lomo_optim")
is_matplotlib_available = _has("matplotlib")
is_mlflow_available = _has("mlflow")
is_msamp_available = _has("msamp")
is_pandas_available = _has("pandas")
is_peft_available = _has("peft")
is_pynvml_available = _has("pynvml")
is_pytest_available = _has("pytest")
is_rich_available = _has("rich")
is_sagemaker_available = _has("sagemaker")
is_schedulefree_available = _has("schedulefree")
is_swanlab_available = _has("swanlab")
is_tensorboard_available = _has("tensorboard")
is_timm_available = _has("timm")
is_torchao_available = _has("torchao")
is_torchdata_available = _has("torchdata")
is_torchvision_available = _has("torchvision")
is_trackio_available = _has("trackio")
is_transformer_engine_available = _has("transformer_engine")
is_transformers_available = _has("transformers")
is_triton_available = _has("triton")
is_wandb_available = _has("wandb")
is_import_timer_available = _has("import_timer")


def is_megatron_lm_available() -> bool:
    """Whether Megatron-LM's ``megatron.core`` can be imported (trainwright has no Megatron strategy either way)."""
    return _package("megatron") and _package("megatron.core")


def is_pippy_available() -> bool:
    """Whether torch's pipeline parallelism (``torch.distributed.pipelining``) is there."""
    return _package("torch.distributed.pipelining")


def is_bnb_available(min_version: str | None = None) -> bool:
    """Whether bitsandbytes can be imported (at least `min_version` when given)."""
    if not _package("bitsandbytes"):
        return False
    return min_version is None or _at_least(_version("bitsandbytes"), min_version)


def is_4bit_bnb_available() -> bool:
    return is_bnb_available("0.39.0")


def is_8bit_bnb_available() -> bool:
    return is_bnb_available("0.37.2")


def is_bitsandbytes_multi_backend_available() -> bool:
    """Whether bitsandbytes was built with several backends (it says so in ``bitsandbytes.features``)."""
    if not _package("bitsandbytes"):
        return False
    import bitsandbytes

    return "multi_backend" in getattr(bitsandbytes, "features", set())


def is_torchdata_stateful_dataloader_available() -> bool:
    return _package("torchdata") and _package("torchdata.stateful_dataloader")


def is_transformer_engine_mxfp8_available() -> bool:
    """Whether Transformer Engine and a GPU that runs its MXFP8 recipe (compute capability 10.0+) are here."""
    return is_transformer_engine_available() and torch.cuda.is_available() and torch.cuda.get_device_capability() >= (10, 0)


def _at_least(found: str | None, wanted: str) -> bool:
    if found is None:
        return False
    from packaging.version import Version

    return Version(found) >= Version(wanted)


def _device_module_available(name: str) -> bool:
    module = getattr(torch, name, None)
    try:
        return bool(module is not None and module.is_available())
    except (AttributeError, RuntimeError):
        return False


def is_cuda_available() -> bool:
    return torch.cuda.is_available()


def is_rocm_available() -> bool:
    return torch.cuda.is_available() and torch.version.hip is not None


def is_mps_available(min_version: str = "1.12") -> bool:
    return torch.backends.mps.is_available() and torch.backends.mps.is_built()


def is_xpu_available(check_device: bool = False) -> bool:
    """Whether torch can use an Intel XPU (``check_device``: and at least one is visible)."""
    available = _device_module_available("xpu")
    return available and (not check_device or torch.xpu.device_count() > 0)


def is_npu_available(check_device: bool = False) -> bool:
    """Whether an Ascend NPU is usable (``torch_npu`` installed and its device present)."""
    if not _package("torch_npu"):
        return False
    import torch_npu  # noqa: F401  (registers torch.npu)

    available = _device_module_available("npu")
    return available and (not check_device or torch.npu.device_count() > 0)  # type: ignore[attr-defined]


def _vendor_device(package: str, module: str) -> Callable[..., bool]:
    def check(check_device: bool = False) -> bool:
        if not _package(package):
            return False
        importlib.import_module(package)  # registers torch.<module>
        available = _device_module_available(module)
        return available and (not check_device or getattr(torch, module).device_count() > 0)

    check.__name__ = f"is_{module}_available"
    check.__doc__ = f"Whether ``{package}`` is installed and torch can use its ``{module}`` device."
    return check


is_mlu_available = _vendor_device("torch_mlu", "mlu")
is_musa_available = _vendor_device("torch_musa", "musa")
is_sdaa_available = _vendor_device("torch_sdaa", "sdaa")
is_neuron_available = _vendor_device("torch_neuronx", "neuron")


def is_hpu_available(init_hccl: bool = False) -> bool:
    """Whether Habana's ``habana_frameworks`` is installed and torch can use its HPU."""
    if not _package("habana_frameworks"):
        return False
    import habana_frameworks.torch  # noqa: F401

    return _device_module_available("hpu")


def is_habana_gaudi1() -> bool:
    if not is_hpu_available():
        return False
    import habana_frameworks.torch.utils.experimental as htexp

    return bool(htexp._get_device_type() == htexp.synDeviceType.synDeviceGaudi)


def is_torch_xla_available(check_is_tpu: bool = False, check_is_gpu: bool = False) -> bool:
    """Whether torch_xla is installed (``check_is_tpu``/``check_is_gpu``: and its PJRT device is that kind)."""
    if not _package("torch_xla"):
        return False
    if not (check_is_tpu or check_is_gpu):
        return True
    device = os.environ.get("PJRT_DEVICE", "").upper()
    return (check_is_tpu and device == "TPU") or (check_is_gpu and device in ("GPU", "CUDA"))


def is_xccl_available() -> bool:
    """Whether torch.distributed has Intel's XCCL backend."""
    import torch.distributed as dist

    return dist.is_available() and bool(getattr(dist, "is_xccl_available", lambda: False)())


def is_bf16_available(ignore_tpu: bool = False) -> bool:
    """Whether bfloat16 mixed precision runs here (CPU always; CUDA when the GPU supports it)."""
    if torch.cuda.is_available():
        return bool(torch.cuda.is_bf16_supported())
    if is_torch_xla_available(check_is_tpu=True):
        return not ignore_tpu
    return True


def is_fp16_available() -> bool:
    """Whether float16 mixed precision runs here (a GPU or accelerator; on CPU fp16 autocast works but slowly)."""
    return True


def is_fp8_available() -> bool:
    """Whether FP8 could run here: an NVIDIA GPU of compute capability 8.9+ and torchao or Transformer Engine (of the
    backends, the `Accelerator` runs torchao; see docs/precision.md)."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        return False
    return is_torchao_available() or is_transformer_engine_available() or is_msamp_available()


def is_weights_only_available() -> bool:
    """Whether ``torch.load(weights_only=...)`` exists (torch 1.13+: always here)."""
    return True


AVAILABILITY = sorted(name for name in globals() if name.startswith("is_") and name.endswith(("_available", "gaudi1")))

__all__ = AVAILABILITY
