"""Small helpers and constants Accelerate scripts import from ``accelerate.utils``, with Accelerate's behaviour.

Tensor-structure helpers (`recursively_apply`, `concatenate`, `slice_tensors`, `find_batch_size`, ...), environment
parsing (`parse_flag_from_env`, `patch_environment`, ...), model helpers (`extract_model_from_parallel`,
`is_compiled_module`, `release_memory`), version checks and the checkpoint file names.
"""

from __future__ import annotations

import contextlib
import enum
import gc
import operator
import os
import socket
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from strategies.checkpoint_io import save_safetensors, torch_save
from strategies.collectives import all_gather_object, is_distributed
from strategies.compile import plain_view
from strategies.data import find_batch_size
from trainer.accelerator.layout import PartialState

# Accelerate's checkpoint file names (its save_state layout; ours is in docs/checkpoints.md)
SCALER_NAME = "scaler.pt"
MODEL_NAME = "pytorch_model"
SAFE_MODEL_NAME = "model"
RNG_STATE_NAME = "random_states"
OPTIMIZER_NAME = "optimizer"
SCHEDULER_NAME = "scheduler"
SAMPLER_NAME = "sampler"
PROFILE_PATTERN_NAME = "profile_{suffix}.json"
WEIGHTS_NAME = f"{MODEL_NAME}.bin"
WEIGHTS_PATTERN_NAME = "pytorch_model{suffix}.bin"
WEIGHTS_INDEX_NAME = f"{WEIGHTS_NAME}.index.json"
SAFE_WEIGHTS_NAME = f"{SAFE_MODEL_NAME}.safetensors"
SAFE_WEIGHTS_PATTERN_NAME = "model{suffix}.safetensors"
SAFE_WEIGHTS_INDEX_NAME = f"{SAFE_WEIGHTS_NAME}.index.json"
XPU_PROFILING_AVAILABLE_PYTORCH_VERSION = "2.4.0"
MITA_PROFILING_AVAILABLE_PYTORCH_VERSION = "2.1.0"


class _ValueEnum(str, enum.Enum):
    def __str__(self) -> str:
        return str(self.value)

    @classmethod
    def list(cls) -> list[str]:
        return [str(item) for item in cls]


class PrecisionType(_ValueEnum):
    """Accelerate's mixed-precision names (``"fp8"``: torchao float8 on a GPU of compute capability 8.9+, see docs/precision.md)."""

    NO = "no"
    FP8 = "fp8"
    FP16 = "fp16"
    BF16 = "bf16"


class RNGType(_ValueEnum):
    TORCH = "torch"
    CUDA = "cuda"
    MLU = "mlu"
    SDAA = "sdaa"
    MUSA = "musa"
    NPU = "npu"
    XLA = "xla"
    XPU = "xpu"
    HPU = "hpu"
    NEURON = "neuron"
    GENERATOR = "generator"


class DynamoBackend(_ValueEnum):
    """``torch.compile`` backends by Accelerate's names (``TorchDynamoPlugin(backend=...)`` takes them)."""

    NO = "NO"
    EAGER = "EAGER"
    AOT_EAGER = "AOT_EAGER"
    INDUCTOR = "INDUCTOR"
    AOT_TS_NVFUSER = "AOT_TS_NVFUSER"
    NVPRIMS_NVFUSER = "NVPRIMS_NVFUSER"
    CUDAGRAPHS = "CUDAGRAPHS"
    OFI = "OFI"
    FX2TRT = "FX2TRT"
    ONNXRT = "ONNXRT"
    TENSORRT = "TENSORRT"
    AOT_TORCHXLA_TRACE_ONCE = "AOT_TORCHXLA_TRACE_ONCE"
    TORCHXLA_TRACE_ONCE = "TORCHXLA_TRACE_ONCE"
    IPEX = "IPEX"
    TVM = "TVM"
    HPU_BACKEND = "HPU_BACKEND"


class ComputeEnvironment(_ValueEnum):
    LOCAL_MACHINE = "LOCAL_MACHINE"
    AMAZON_SAGEMAKER = "AMAZON_SAGEMAKER"


class CustomDtype(enum.Enum):
    """Accelerate's non-torch dtypes (for its big-model size estimates)."""

    FP8 = "fp8"
    INT4 = "int4"
    INT2 = "int2"


# environment --------------------------------------------------------------------------------------------
def str_to_bool(value: str, to_bool: bool = False) -> int | bool:
    """``"yes"``/``"true"``/``"1"``/... -> 1, ``"no"``/``"false"``/``"0"``/... -> 0 (bools with `to_bool`)."""
    value = value.lower()
    if value in ("y", "yes", "t", "true", "on", "1"):
        return True if to_bool else 1
    if value in ("n", "no", "f", "false", "off", "0"):
        return False if to_bool else 0
    raise ValueError(f"invalid truth value {value!r}; use one of yes/no, true/false, on/off, 1/0")


def get_int_from_env(env_keys: list[str], default: int) -> int:
    """The first of `env_keys` set to a non-negative int, else `default`."""
    for key in env_keys:
        value = int(os.environ.get(key, -1))
        if value >= 0:
            return value
    return default


def parse_flag_from_env(key: str, default: bool = False) -> bool:
    return bool(str_to_bool(os.environ.get(key, str(default)), to_bool=True))


def parse_choice_from_env(key: str, default: str = "no") -> str:
    return os.environ.get(key, str(default))


@contextlib.contextmanager
def patch_environment(**kwargs: Any) -> Iterator[None]:
    """Set environment variables (names upper-cased) inside the block; restore them after."""
    saved: dict[str, str | None] = {}
    for key, value in kwargs.items():
        key = key.upper()
        saved[key] = os.environ.get(key)
        os.environ[key] = str(value)
    try:
        yield
    finally:
        for key, old in saved.items():
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old


@contextlib.contextmanager
def clear_environment() -> Iterator[None]:
    """Run the block with an empty environment; the old one is back after it."""
    saved = dict(os.environ)
    os.environ.clear()
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def is_port_in_use(port: int | None = None) -> bool:
    """Whether something listens on localhost:`port` (default 29500, torch's rendezvous port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        return sock.connect_ex(("localhost", port or 29500)) == 0


# versions -------------------------------------------------------------------------------------------------
_OPERATIONS = {">": operator.gt, ">=": operator.ge, "==": operator.eq, "!=": operator.ne, "<=": operator.le, "<": operator.lt}


def compare_versions(library_or_version: Any, operation: str, requirement_version: str) -> bool:
    """Compare a library's installed version (or a version string) with `requirement_version` (``">="``, ...)."""
    import importlib.metadata

    from packaging.version import Version, parse

    if operation not in _OPERATIONS:
        raise ValueError(f"operation={operation!r} must be one of {list(_OPERATIONS)}")
    version = library_or_version
    if isinstance(version, str):
        try:
            version = parse(importlib.metadata.version(version))
        except importlib.metadata.PackageNotFoundError:
            version = parse(version)
    if not isinstance(version, Version):
        version = parse(str(version))
    return bool(_OPERATIONS[operation](version, parse(requirement_version)))


def is_torch_version(operation: str, version: str) -> bool:
    from packaging.version import parse

    return bool(_OPERATIONS[operation](parse(parse(torch.__version__).base_version), parse(version)))


# tensor structures ---------------------------------------------------------------------------------------
def is_torch_tensor(tensor: Any) -> bool:
    return isinstance(tensor, torch.Tensor)


def is_namedtuple(data: Any) -> bool:
    return isinstance(data, tuple) and hasattr(data, "_asdict") and hasattr(data, "_fields")


def honor_type(obj: Any, generator: Any) -> Any:
    """A list, tuple or namedtuple of `obj`'s type from `generator`."""
    if is_namedtuple(obj):
        return type(obj)(*list(generator))
    return type(obj)(generator)


def recursively_apply(func: Callable[..., Any], data: Any, *args: Any, test_type: Callable[[Any], bool] = is_torch_tensor,
                      error_on_other_type: bool = False, **kwargs: Any) -> Any:
    """`func` applied to every object of `data` (nested lists, tuples, namedtuples, mappings) that passes `test_type`."""
    if isinstance(data, (tuple, list)):
        return honor_type(data, (recursively_apply(func, o, *args, test_type=test_type, error_on_other_type=error_on_other_type, **kwargs)
                                 for o in data))
    if isinstance(data, Mapping):
        return type(data)({k: recursively_apply(func, v, *args, test_type=test_type, error_on_other_type=error_on_other_type, **kwargs)  # type: ignore[call-arg]
                           for k, v in data.items()})
    if test_type(data):
        return func(data, *args, **kwargs)
    if error_on_other_type:
        raise TypeError(f"unsupported type {type(data).__name__} passed to {func.__name__}; only nested lists/tuples/dicts of "
                        f"objects that pass {test_type.__name__} are")
    return data


class TensorInformation:
    """A tensor's shape and dtype (what `get_data_structure` gives for each tensor)."""

    def __init__(self, shape: torch.Size, dtype: torch.dtype) -> None:
        self.shape = shape
        self.dtype = dtype

    def __repr__(self) -> str:
        return f"TensorInformation(shape={self.shape}, dtype={self.dtype})"


def is_tensor_information(tensor_info: Any) -> bool:
    return isinstance(tensor_info, TensorInformation)


def get_data_structure(data: Any) -> Any:
    return recursively_apply(lambda t: TensorInformation(shape=t.shape, dtype=t.dtype), data)


def initialize_tensors(data_structure: Any) -> Any:
    return recursively_apply(lambda info: torch.empty(*info.shape, dtype=info.dtype), data_structure, test_type=is_tensor_information)


def ignorant_find_batch_size(data: Any) -> int | None:
    """`find_batch_size`, or None where it finds no tensor."""
    try:
        return find_batch_size(data)
    except (ValueError, TypeError):
        return None


def slice_tensors(data: Any, tensor_slice: Any, process_index: int | None = None, num_processes: int | None = None) -> Any:
    return recursively_apply(lambda t: t[tensor_slice], data)


def concatenate(data: list[Any], dim: int = 0) -> Any:
    """Concatenate a list of equally nested structures of tensors along `dim`."""
    if isinstance(data[0], (tuple, list)):
        return honor_type(data[0], (concatenate([d[i] for d in data], dim=dim) for i in range(len(data[0]))))
    if isinstance(data[0], Mapping):
        return type(data[0])({k: concatenate([d[k] for d in data], dim=dim) for k in data[0]})  # type: ignore[call-arg]
    if not isinstance(data[0], torch.Tensor):
        raise TypeError(f"can only concatenate tensors (or nested lists/dicts of them), got {type(data[0]).__name__}")
    return torch.cat(data, dim=dim)


def convert_to_fp32(tensor: Any) -> Any:
    """Every float16/bfloat16 tensor of `tensor` (nested too) as float32."""
    return recursively_apply(lambda t: t.float(), tensor, test_type=lambda t: isinstance(t, torch.Tensor) and t.dtype in (torch.float16, torch.bfloat16))


def convert_outputs_to_fp32(model_forward: Callable[..., Any]) -> Callable[..., Any]:
    """`model_forward` with its half-precision outputs converted to float32."""
    import functools

    @functools.wraps(model_forward)
    def forward(*args: Any, **kwargs: Any) -> Any:
        return convert_to_fp32(model_forward(*args, **kwargs))

    return forward


def listify(data: Any) -> Any:
    """Tensors in `data` as Python numbers/lists."""
    return recursively_apply(lambda t: t.tolist() if t.numel() > 1 else t.item(), data)


def find_device(data: Any) -> torch.device | None:
    """The device of the first tensor in `data`."""
    if isinstance(data, Mapping):
        data = list(data.values())
    if isinstance(data, (list, tuple)):
        for obj in data:
            device = find_device(obj)
            if device is not None:
                return device
        return None
    return data.device if isinstance(data, torch.Tensor) else None


# debug mode ----------------------------------------------------------------------------------------------
class DistributedOperationException(ValueError):
    """A collective was called with tensors that do not match across processes (Accelerate's, raised in debug mode:
    `PartialState.debug`). A `ValueError`, as the checks our collectives always make raise."""


def get_shape(data: Any) -> Any:
    """The shapes of the tensors in `data` (lists of ints), in its structure."""
    return recursively_apply(lambda t: list(t.shape), data)


def verify_operation(operation: str, data: Any, shapes: Any = None) -> None:
    """In debug mode (`PartialState.debug`) with several processes: raise `DistributedOperationException` on every process
    unless every process passes tensors on the layout's device type with the same `shapes` (default: `data`'s).

    Costs one small gather of the shapes; call it only while `trainer.accelerator.layout.debug_mode()` is on.
    """
    if not is_distributed():
        return
    device_type = PartialState().device.type
    found = find_device(data)
    wrong_device = found is not None and found.type != device_type
    output = all_gather_object((get_shape(data) if shapes is None else shapes, wrong_device))
    if any(bad for _, bad in output):
        raise DistributedOperationException(
            f"the tensors passed to {operation} are not all on {device_type}, the device type of this run (processes "
            f"{[i for i, (_, bad) in enumerate(output) if bad]} are not); move them with .to({device_type!r}) first"
        )
    if any(shape != output[0][0] for shape, _ in output):
        per_process = "\n  - ".join(f"Process {i}: {shape}" for i, (shape, _) in enumerate(output))
        raise DistributedOperationException(
            f"cannot apply {operation}: the tensors' shapes differ across processes. All shapes across devices must be "
            f"valid.\n\nOperation: `{operation}`\nInput shapes:\n  - {per_process}"
        )


# models --------------------------------------------------------------------------------------------------
def is_compiled_module(module: object) -> bool:
    """Whether `module` is a ``torch.compile`` wrapper (``OptimizedModule``)."""
    return isinstance(module, torch._dynamo.eval_frame.OptimizedModule) if hasattr(torch, "_dynamo") else False


def has_compiled_regions(module: object) -> bool:
    """Whether a submodule of `module` is a ``torch.compile`` wrapper (Accelerate's regional compilation)."""
    return isinstance(module, nn.Module) and any(is_compiled_module(m) for m in module.modules() if m is not module)


def extract_model_from_parallel(model: nn.Module, keep_fp32_wrapper: bool = True, keep_torch_compile: bool = True,
                                recursive: bool = False) -> nn.Module:
    """`model` without DDP/DataParallel/DeepSpeed/FSDP1 wrappers (``accelerator.unwrap_model`` needs no accelerator here)."""
    compiled = model if is_compiled_module(model) else None
    if compiled is not None:
        model = model._orig_mod  # type: ignore[assignment]
    while isinstance(model, nn.Module) and type(model).__name__ in ("DistributedDataParallel", "DataParallel", "DeepSpeedEngine",
                                                                     "FullyShardedDataParallel") and isinstance(getattr(model, "module", None), nn.Module):
        model = model.module  # type: ignore[assignment]
    if not keep_fp32_wrapper:
        model = plain_view(model)
    if keep_torch_compile and compiled is not None:
        compiled._orig_mod = model
        return compiled
    return model


def is_peft_model(model: object) -> bool:
    if not _importable("peft"):
        return False
    from peft import PeftModel

    return isinstance(model, PeftModel)


def _importable(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def get_pretty_name(obj: Any) -> str:
    """The name of `obj` (a class, function or object) for messages."""
    if not hasattr(obj, "__qualname__") and not hasattr(obj, "__name__"):
        obj = getattr(obj, "__class__", obj)
    if hasattr(obj, "__qualname__"):
        return str(obj.__qualname__)
    if hasattr(obj, "__name__"):
        return str(obj.__name__)
    return str(obj)


def merge_dicts(source: dict[str, Any], destination: dict[str, Any]) -> dict[str, Any]:
    """Merge `source` into `destination` recursively (in place); returns `destination`."""
    for key, value in source.items():
        if isinstance(value, dict):
            merge_dicts(value, destination.setdefault(key, {}))
        else:
            destination[key] = value
    return destination


def recursive_getattr(obj: Any, attr: str) -> Any:
    """``recursive_getattr(model, "encoder.layer.0")``: a dotted attribute path."""
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def convert_bytes(size: float) -> str:
    """A byte count for people: ``convert_bytes(2**20)`` is ``"1.0 MB"``."""
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if size < 1024.0:
            return f"{round(size, 2)} {unit}"
        size /= 1024.0
    return f"{round(size, 2)} PB"


def release_memory(*objects: Any) -> list[None]:
    """Drop references: returns a list of None to assign back (``a, b = release_memory(a, b)``); collects garbage and
    empties the device caches (CUDA, XPU, MPS), as Accelerate's."""
    result: list[None] = [None for _ in objects]
    del objects
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        torch.xpu.empty_cache()
    if torch.backends.mps.is_available():
        torch.mps.empty_cache()
    return result


def save(obj: Any, f: str | os.PathLike[str], save_on_each_node: bool = False, safe_serialization: bool = False) -> None:
    """``torch.save`` (or safetensors for a state dict with `safe_serialization`) on the main process, or on each
    machine's main process with `save_on_each_node` (Accelerate's ``accelerate.utils.save``)."""
    rank = int(os.environ.get("LOCAL_RANK" if save_on_each_node else "RANK", "0"))
    if rank == 0:
        (save_safetensors if safe_serialization else torch_save)(obj, Path(f))


def load(f: Any, map_location: Any = None, **kwargs: Any) -> Any:
    """``torch.load`` (``weights_only`` as torch defaults, unless given)."""
    return torch.load(f, map_location=map_location, **kwargs)


def wait_for_everyone() -> None:
    """Wait until every process reaches this point (a barrier; nothing with one process)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def synchronize_rng_state(rng_type: RNGType | str | None = None, generator: torch.Generator | None = None) -> None:
    """Give every process rank 0's random state of `rng_type` (``"torch"``, ``"cuda"``, ``"generator"``: `generator`'s)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return
    kind = str(RNGType(str(rng_type or "torch").lower()))
    if kind == "torch":
        state = [torch.get_rng_state()]
        dist.broadcast_object_list(state, 0)
        torch.set_rng_state(state[0])
    elif kind == "cuda":
        state = [torch.cuda.get_rng_state()]
        dist.broadcast_object_list(state, 0)
        torch.cuda.set_rng_state(state[0])
    elif kind == "generator":
        if generator is None:
            raise ValueError("synchronize_rng_state('generator') needs the generator: synchronize_rng_state('generator', generator=g)")
        state = [generator.get_state()]
        dist.broadcast_object_list(state, 0)
        generator.set_state(state[0])
    else:
        raise ValueError(f"synchronize_rng_state: rng_type={kind!r} is not available here; use 'torch', 'cuda' or 'generator'")


def synchronize_rng_states(rng_types: list[RNGType | str], generator: torch.Generator | None = None) -> None:
    for rng_type in rng_types:
        synchronize_rng_state(rng_type, generator=generator)


def get_grad_scaler(distributed_type: Any = None, **kwargs: Any) -> torch.amp.GradScaler:
    """A ``torch.amp.GradScaler`` for this machine's device with `kwargs` (``GradScalerKwargs``' fields)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.amp.GradScaler(device, **kwargs)


def tqdm(*args: Any, main_process_only: bool = True, **kwargs: Any) -> Any:
    """``tqdm.auto.tqdm`` that shows on each machine's main process only (``main_process_only=False``: on every one)."""
    try:
        from tqdm.auto import tqdm as bar
    except ImportError:
        raise ImportError("trainer.utils.tqdm needs the tqdm package: pip install tqdm") from None
    disable = kwargs.pop("disable", False)
    if main_process_only and not disable:
        disable = int(os.environ.get("LOCAL_RANK", "0")) != 0
    return bar(*args, **kwargs, disable=disable)
