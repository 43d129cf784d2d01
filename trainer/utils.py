"""Helpers Accelerate users import from ``accelerate.utils``, under the same names."""

from __future__ import annotations

import functools
import gc
import inspect
import os
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from callbacks.trackers.registry import LoggerType
from strategies import collectives as _collectives
from strategies.collectives import broadcast_object, gather_object
from strategies.data import find_batch_size
from strategies.data import send_to_device as _send_to_device
from strategies.fp8 import convert_model_to_fp8_ao, filter_first_and_last_linear_layers, has_ao_layers
from strategies.xla import seed_xla
from trainer.accelerator.availability import (
    is_4bit_bnb_available,
    is_8bit_bnb_available,
    is_aim_available,
    is_amdsmi_available,
    is_bf16_available,
    is_bitsandbytes_multi_backend_available,
    is_bnb_available,
    is_boto3_available,
    is_clearml_available,
    is_comet_ml_available,
    is_cuda_available,
    is_datasets_available,
    is_deepspeed_available,
    is_dvclive_available,
    is_fp8_available,
    is_fp16_available,
    is_habana_gaudi1,
    is_hpu_available,
    is_import_timer_available,
    is_lomo_available,
    is_matplotlib_available,
    is_megatron_lm_available,
    is_mlflow_available,
    is_mlu_available,
    is_mps_available,
    is_msamp_available,
    is_musa_available,
    is_neuron_available,
    is_npu_available,
    is_pandas_available,
    is_peft_available,
    is_pippy_available,
    is_pynvml_available,
    is_pytest_available,
    is_rich_available,
    is_rocm_available,
    is_sagemaker_available,
    is_schedulefree_available,
    is_sdaa_available,
    is_swanlab_available,
    is_tensorboard_available,
    is_timm_available,
    is_torch_xla_available,
    is_torchao_available,
    is_torchdata_available,
    is_torchdata_stateful_dataloader_available,
    is_torchvision_available,
    is_trackio_available,
    is_transformer_engine_available,
    is_transformer_engine_mxfp8_available,
    is_transformers_available,
    is_triton_available,
    is_wandb_available,
    is_weights_only_available,
    is_xccl_available,
    is_xpu_available,
)
from trainer.accelerator.config import (
    DataLoaderConfiguration,
    DDPKwargs,
    DeepSpeedPlugin,
    DistributedDataParallelKwargs,
    DistributedType,
    FullyShardedDataParallelPlugin,
    GradientAccumulationPlugin,
    ProjectConfiguration,
    TorchDynamoPlugin,
)
from trainer.accelerator.dummies import DummyOptim, DummyScheduler
from trainer.accelerator.kwargs import (
    AORecipeKwargs,
    AutocastKwargs,
    DDPCommunicationHookType,
    FP8RecipeKwargs,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
    MSAMPRecipeKwargs,
    ProfileKwargs,
    TERecipeKwargs,
)
from trainer.accelerator.layout import debug_mode
from trainer.accelerator.operations import (
    MITA_PROFILING_AVAILABLE_PYTORCH_VERSION,
    MODEL_NAME,
    OPTIMIZER_NAME,
    PROFILE_PATTERN_NAME,
    RNG_STATE_NAME,
    SAFE_MODEL_NAME,
    SAFE_WEIGHTS_INDEX_NAME,
    SAFE_WEIGHTS_NAME,
    SAFE_WEIGHTS_PATTERN_NAME,
    SAMPLER_NAME,
    SCALER_NAME,
    SCHEDULER_NAME,
    WEIGHTS_INDEX_NAME,
    WEIGHTS_NAME,
    WEIGHTS_PATTERN_NAME,
    XPU_PROFILING_AVAILABLE_PYTORCH_VERSION,
    ComputeEnvironment,
    CustomDtype,
    DistributedOperationException,
    DynamoBackend,
    PrecisionType,
    RNGType,
    TensorInformation,
    clear_environment,
    compare_versions,
    concatenate,
    convert_bytes,
    convert_outputs_to_fp32,
    convert_to_fp32,
    extract_model_from_parallel,
    find_device,
    get_data_structure,
    get_grad_scaler,
    get_int_from_env,
    get_pretty_name,
    has_compiled_regions,
    honor_type,
    ignorant_find_batch_size,
    initialize_tensors,
    is_compiled_module,
    is_namedtuple,
    is_peft_model,
    is_port_in_use,
    is_tensor_information,
    is_torch_tensor,
    is_torch_version,
    listify,
    load,
    merge_dicts,
    parse_choice_from_env,
    parse_flag_from_env,
    patch_environment,
    recursive_getattr,
    recursively_apply,
    release_memory,
    save,
    slice_tensors,
    str_to_bool,
    synchronize_rng_state,
    synchronize_rng_states,
    tqdm,
    verify_operation,
    wait_for_everyone,
)
from trainer.accelerator.parallelism import ParallelismConfig, TorchTensorParallelConfig
from trainer.big_modeling import init_empty_weights, init_on_device
from trainer.planning import MemoryEstimate, estimate_memory
from trainer.unsupported import unsupported_names


def set_seed(seed: int, device_specific: bool = False, deterministic: bool = False) -> None:
    """Seed python, numpy and torch (all devices, an XLA device's too). ``device_specific`` adds the process rank."""
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed={seed!r} must be an int")
    if device_specific:
        seed += int(os.environ.get("RANK", "0"))
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    seed_xla(seed)  # (torch.manual_seed does not reach XLA's generator; this imports and starts nothing)
    if deterministic:
        torch.use_deterministic_algorithms(True)


def seed_everything(seed: int | None = None, workers: bool = False, verbose: bool = True) -> int:
    """Lightning's ``seed_everything``: seed python, numpy and torch; returns the seed.

    Without `seed`, ``PL_GLOBAL_SEED`` (as Lightning) or ``TRAINWRIGHT_SEED``, else 0. `workers` is accepted for
    compatibility: prepared loaders already seed their workers from the shared data seed.
    """
    if seed is None:
        raw = os.environ.get("PL_GLOBAL_SEED") or os.environ.get("TRAINWRIGHT_SEED") or "0"
        try:
            seed = int(raw)
        except ValueError:
            raise ValueError(f"the seed environment variable holds {raw!r}, not an int; set it to e.g. 42") from None
    set_seed(seed)
    os.environ["PL_GLOBAL_SEED"] = str(seed)
    if verbose:
        print(f"Seed set to {seed}")
    return seed


_OUT_OF_MEMORY = (
    " out of memory.",  # CUDA, ROCm, XPU
    "MPS backend out of memory",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",
    "DefaultCPUAllocator: can't allocate memory",
)


def should_reduce_batch_size(exception: BaseException) -> bool:
    """True for the out-of-memory errors (CUDA, MPS, CPU allocator, cuDNN) a smaller batch may avoid."""
    if isinstance(exception, torch.OutOfMemoryError):
        return True
    return isinstance(exception, RuntimeError) and len(exception.args) == 1 and any(
        text in str(exception.args[0]) for text in _OUT_OF_MEMORY)


def find_executable_batch_size(
    function: Callable[..., Any] | None = None,
    starting_batch_size: int = 128,
    reduce_batch_size_fn: Callable[[], int] | None = None,
) -> Any:
    """Decorator (Accelerate's): call ``function(batch_size, *args)``, retrying with a smaller batch size after each
    out-of-memory error (``int(batch_size * 0.9)``, or what `reduce_batch_size_fn` returns).

    The size that worked is kept for the next call. Other errors propagate. Under several processes every one
    must fail alike: a process that runs out of memory alone leaves the others waiting in their collective.
    """
    if function is None:
        return functools.partial(find_executable_batch_size, starting_batch_size=starting_batch_size,
                                 reduce_batch_size_fn=reduce_batch_size_fn)
    if isinstance(starting_batch_size, bool) or not isinstance(starting_batch_size, int) or starting_batch_size < 1:
        raise ValueError(f"starting_batch_size={starting_batch_size!r} must be an int >= 1")
    batch_size = starting_batch_size

    def smaller() -> int:
        return int(batch_size * 0.9)

    reduce = reduce_batch_size_fn or smaller
    params = list(inspect.signature(function).parameters)

    @functools.wraps(function)
    def run(*args: Any, **kwargs: Any) -> Any:
        nonlocal batch_size
        if len(params) < len(args) + 1:
            raise TypeError(
                f"{function.__name__}() got its batch size as an argument; the decorator passes it: call "
                f"{function.__name__}({', '.join(params[1:len(args)])}) without it"
            )
        while True:
            if batch_size < 1:
                raise RuntimeError(f"no executable batch size found for {function.__name__}(): reached {batch_size}")
            try:
                return function(batch_size, *args, **kwargs)
            except Exception as error:
                if not should_reduce_batch_size(error):
                    raise
            gc.collect()  # out of the except block: the failed call's frames (and their tensors) are gone now
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            batch_size = reduce()

    return run


def gather(data: Any, group: Any = None) -> Any:
    """All-gather every tensor of a nested structure, concatenated along dim 0 (shapes may differ in dim 0 only).

    In debug mode (`PartialState.debug`) the shapes must match across processes, as Accelerate's (else
    `DistributedOperationException`)."""
    if debug_mode():
        verify_operation("trainer.utils.gather", data)
    return _collectives.gather(data, group)


def broadcast(data: Any, from_process: int = 0) -> Any:
    """Broadcast every tensor of a nested structure from process `from_process` (shapes must agree across processes;
    checked first in debug mode, `PartialState.debug`)."""
    if debug_mode():
        verify_operation("trainer.utils.broadcast", data)
    return _collectives.broadcast(data, from_process)


def reduce(data: Any, reduction: str = "mean", scale: float = 1.0, group: Any = None) -> Any:
    """All-reduce every tensor of a nested structure (``"mean"``, the default as in ``accelerate.utils.reduce``;
    ``"sum"``, ``"max"``, ``"min"``), times `scale` (shapes must agree across processes; checked first in debug mode,
    `PartialState.debug`). `Accelerator.reduce` defaults to ``"sum"``, as Accelerate's."""
    if debug_mode():
        verify_operation("trainer.utils.reduce", data)
    return _collectives.reduce(data, reduction, scale, group)


def pad_across_processes(data: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False, group: Any = None) -> Any:
    """Pad every tensor along `dim` to the largest size over the processes (with `pad_index`, at the end or first).

    In debug mode (`PartialState.debug`) the tensors' numbers of dimensions must match across processes (else
    `DistributedOperationException`, as Accelerate's)."""
    if debug_mode():
        try:
            verify_operation("trainer.utils.pad_across_processes", data, recursively_apply(lambda t: [t.ndim], data))
        except DistributedOperationException as err:  # Accelerate's chained error
            raise DistributedOperationException(
                "Error found while calling `trainer.utils.pad_across_processes`. Please see the earlier error for more details."
            ) from err
    return _collectives.pad_across_processes(data, dim, pad_index, pad_first, group)


def send_to_device(data: Any, device: torch.device | str, non_blocking: bool = False) -> Any:
    return _send_to_device(data, device, non_blocking=non_blocking)


def broadcast_object_list(objects: list[Any], from_process: int = 0) -> list[Any]:
    """Broadcast a list of picklable objects in place (Accelerate's signature)."""
    result = broadcast_object(list(objects), from_process)
    objects[:] = result
    return objects


__all__ = [
    "MITA_PROFILING_AVAILABLE_PYTORCH_VERSION",
    "MODEL_NAME",
    "OPTIMIZER_NAME",
    "PROFILE_PATTERN_NAME",
    "RNG_STATE_NAME",
    "SAFE_MODEL_NAME",
    "SAFE_WEIGHTS_INDEX_NAME",
    "SAFE_WEIGHTS_NAME",
    "SAFE_WEIGHTS_PATTERN_NAME",
    "SAMPLER_NAME",
    "SCALER_NAME",
    "SCHEDULER_NAME",
    "WEIGHTS_INDEX_NAME",
    "WEIGHTS_NAME",
    "WEIGHTS_PATTERN_NAME",
    "XPU_PROFILING_AVAILABLE_PYTORCH_VERSION",
    "AORecipeKwargs",
    "AutocastKwargs",
    "ComputeEnvironment",
    "CustomDtype",
    "DDPCommunicationHookType",
    "DDPKwargs",
    "DataLoaderConfiguration",
    "DeepSpeedPlugin",
    "DistributedDataParallelKwargs",
    "DistributedOperationException",
    "DistributedType",
    "DummyOptim",
    "DummyScheduler",
    "DynamoBackend",
    "FP8RecipeKwargs",
    "FullyShardedDataParallelPlugin",
    "GradScalerKwargs",
    "GradientAccumulationPlugin",
    "InitProcessGroupKwargs",
    "KwargsHandler",
    "LoggerType",
    "MSAMPRecipeKwargs",
    "MemoryEstimate",
    "ParallelismConfig",
    "PrecisionType",
    "ProfileKwargs",
    "ProjectConfiguration",
    "RNGType",
    "TERecipeKwargs",
    "TensorInformation",
    "TorchDynamoPlugin",
    "TorchTensorParallelConfig",
    "broadcast",
    "broadcast_object",
    "broadcast_object_list",
    "clear_environment",
    "compare_versions",
    "concatenate",
    "convert_bytes",
    "convert_model_to_fp8_ao",
    "convert_outputs_to_fp32",
    "convert_to_fp32",
    "estimate_memory",
    "extract_model_from_parallel",
    "filter_first_and_last_linear_layers",
    "find_batch_size",
    "find_device",
    "find_executable_batch_size",
    "gather",
    "gather_object",
    "get_data_structure",
    "get_grad_scaler",
    "get_int_from_env",
    "get_pretty_name",
    "has_ao_layers",
    "has_compiled_regions",
    "honor_type",
    "ignorant_find_batch_size",
    "init_empty_weights",
    "init_on_device",
    "initialize_tensors",
    "is_4bit_bnb_available",
    "is_8bit_bnb_available",
    "is_aim_available",
    "is_amdsmi_available",
    "is_bf16_available",
    "is_bitsandbytes_multi_backend_available",
    "is_bnb_available",
    "is_boto3_available",
    "is_clearml_available",
    "is_comet_ml_available",
    "is_compiled_module",
    "is_cuda_available",
    "is_datasets_available",
    "is_deepspeed_available",
    "is_dvclive_available",
    "is_fp8_available",
    "is_fp16_available",
    "is_habana_gaudi1",
    "is_hpu_available",
    "is_import_timer_available",
    "is_lomo_available",
    "is_matplotlib_available",
    "is_megatron_lm_available",
    "is_mlflow_available",
    "is_mlu_available",
    "is_mps_available",
    "is_msamp_available",
    "is_musa_available",
    "is_namedtuple",
    "is_neuron_available",
    "is_npu_available",
    "is_pandas_available",
    "is_peft_available",
    "is_peft_model",
    "is_pippy_available",
    "is_port_in_use",
    "is_pynvml_available",
    "is_pytest_available",
    "is_rich_available",
    "is_rocm_available",
    "is_sagemaker_available",
    "is_schedulefree_available",
    "is_sdaa_available",
    "is_swanlab_available",
    "is_tensor_information",
    "is_tensorboard_available",
    "is_timm_available",
    "is_torch_tensor",
    "is_torch_version",
    "is_torch_xla_available",
    "is_torchao_available",
    "is_torchdata_available",
    "is_torchdata_stateful_dataloader_available",
    "is_torchvision_available",
    "is_trackio_available",
    "is_transformer_engine_available",
    "is_transformer_engine_mxfp8_available",
    "is_transformers_available",
    "is_triton_available",
    "is_wandb_available",
    "is_weights_only_available",
    "is_xccl_available",
    "is_xpu_available",
    "listify",
    "load",
    "merge_dicts",
    "pad_across_processes",
    "parse_choice_from_env",
    "parse_flag_from_env",
    "patch_environment",
    "recursive_getattr",
    "recursively_apply",
    "reduce",
    "release_memory",
    "save",
    "seed_everything",
    "send_to_device",
    "set_seed",
    "should_reduce_batch_size",
    "slice_tensors",
    "str_to_bool",
    "synchronize_rng_state",
    "synchronize_rng_states",
    "tqdm",
    "wait_for_everyone",
]

# Accelerate names deliberately not provided: importing one works, using it raises NotImplementedError with the reason
# (trainer.unsupported lists them, and docs/migrating-from-accelerate.md)
__getattr__ = unsupported_names(__name__)
