"""The Accelerate names trainwright does not provide, each with the reason (and what to use instead).

A script that imports one still imports (``from trainer.utils import MegatronLMPlugin`` works); calling or
instantiating it raises `NotImplementedError` with the reason. `tests/unit/test_accelerate_names.py` checks that
every public name of Accelerate 1.15 (recorded in ``tests/fixtures/accelerate_names/``) is either provided or
listed here, and docs/migrating-from-accelerate.md lists these names and reasons for readers.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_MEGATRON = "Megatron-LM is not supported (there is no Megatron strategy); shard with strategy='fsdp' or 'deepspeed'"
_BIG_MODEL = ("big-model inference (device maps, CPU/disk offload, dispatch across devices) is not part of trainwright, which "
              "trains; for inference use transformers' from_pretrained(device_map=...) or Accelerate's big_modeling itself")
_BNB = "bitsandbytes quantization is not wired in; quantize with bitsandbytes / transformers (BitsAndBytesConfig) before prepare()"
_FP8 = ("Transformer Engine's FP8 is not wired in; FP8 runs through torchao: Accelerator(mixed_precision='fp8', "
        "kwargs_handlers=[AORecipeKwargs()]) on an NVIDIA GPU of compute capability 8.9+ (trainer.utils.convert_model_to_fp8_ao converts a model)")
_FSDP1 = ("an FSDP1 (FullyShardedDataParallel) helper: strategy='fsdp' is FSDP2 (fully_shard); save and load through "
          "accelerator.save_state/load_state, full weights through accelerator.get_state_dict/save_model")
_FSDP2_STEPS = "a step of Accelerate's own FSDP2 preparation; strategies.fsdp does it inside accelerator.prepare()"
_LAUNCH = ("an internal of `accelerate launch` / `accelerate config` (building the launch environment, SageMaker, TPU pods); "
           "launch with `trainer launch` (which reads accelerate config files) or torchrun")
_PARALLEL = ("context and sequence parallelism are not available yet (ParallelismConfig runs data parallel, FSDP2/HSDP and tensor "
             "parallel: docs/strategies.md); a model is split by prepare() with its own or the given plan, not beforehand")
_REGIONS = "regional compilation: use TorchDynamoPlugin(use_regional_compilation=True) (or dynamo_plugin=...), applied by prepare()"
_DEEPSPEED_INTERNAL = ("an internal of Accelerate's DeepSpeed integration; strategies.deepspeed wraps the engine, and prepare() "
                       "returns it (use DummyOptim/DummyScheduler for a config-defined optimizer and schedule)")
_INTERNAL = "an internal of Accelerate's own implementation, not meant for training scripts; nothing here needs it"
_PIPPY = "pipeline-parallel inference (prepare_pippy) is not supported; trainwright trains with data parallel / FSDP2 / DeepSpeed"
_DATA = ("sharding here is one loader class, DataLoaderShard (returned by prepare(), with skip_first_batches), over pure sharding "
         "functions (strategies.sharding), not Accelerate's batch-sampler / iterable wrappers; prepare() a DataLoader instead")
_DISPATCH = "dispatch_batches (rank 0 loads and scatters every batch) is not supported; every rank loads its own shard"
_STATE_INTERNAL = ("an internal of Accelerate's process-wide state; here the layout is PartialState/AcceleratorState and the "
                   "accumulation state is each Accelerator's (accelerator.gradient_state, accelerator.sync_gradients)")
_LOGGER = "Accelerate's module-level logger; use trainer.logging.get_logger(__name__)"

# module -> reason -> names
UNSUPPORTED: dict[str, dict[str, list[str]]] = {
    "trainer": {
        _BIG_MODEL: ["cpu_offload", "cpu_offload_with_hook", "disk_offload", "dispatch_model", "infer_auto_device_map",
                     "load_checkpoint_and_dispatch", "load_checkpoint_in_model"],
        _PIPPY: ["prepare_pippy"],
        "Accelerate's rich traceback module (installed when rich is); install rich's handler yourself": ["rich"],
    },
    "trainer.utils": {
        _MEGATRON: ["AbstractTrainStep", "BertTrainStep", "GPTTrainStep", "T5TrainStep", "MegatronEngine", "MegatronLMDummyDataLoader",
                    "MegatronLMDummyScheduler", "MegatronLMOptimizerWrapper", "MegatronLMPlugin", "MegatronLMSchedulerWrapper",
                    "add_model_config_to_megatron_parser", "avg_losses_across_data_parallel_group", "gather_across_data_parallel_groups",
                    "megatron_lm_initialize", "megatron_lm_prepare_data_loader", "megatron_lm_prepare_model_optimizer_scheduler",
                    "megatron_lm_prepare_optimizer", "megatron_lm_prepare_scheduler"],
        _BIG_MODEL: ["OffloadedWeightsLoader", "PrefixedDataset", "align_module_device", "calculate_maximum_sizes", "check_device_map",
                     "check_tied_parameters_in_config", "check_tied_parameters_on_same_device", "compute_module_sizes",
                     "copy_tensor_to_devices", "dtype_byte_size", "convert_file_size_to_int", "ensure_weights_retied",
                     "extract_submodules_state_dict", "find_tied_parameters", "get_balanced_memory", "get_max_layer_size",
                     "get_max_memory", "get_module_children_bottom_up", "has_offloaded_params", "id_tensor_storage",
                     "infer_auto_device_map", "load_checkpoint_in_model", "load_offloaded_weight", "load_offloaded_weights",
                     "load_state_dict", "named_module_tensors", "offload_state_dict", "offload_weight", "retie_parameters",
                     "save_offload_index", "set_module_tensor_to_device", "clean_state_dict_for_safetensors"],
        _BNB: ["BnbQuantizationConfig", "has_4bit_bnb_layers", "load_and_quantize_model"],
        _FP8: ["apply_fp8_autowrap", "check_cuda_fp8_capability", "contextual_fp8_autocast", "convert_model",
               "has_transformer_engine_layers", "torchao_required"],
        _FSDP1: ["load_fsdp_model", "load_fsdp_optimizer", "merge_fsdp_weights", "save_fsdp_model", "save_fsdp_optimizer",
                 "disable_fsdp_ram_efficient_loading", "enable_fsdp_ram_efficient_loading"],
        _FSDP2_STEPS: ["fsdp2_apply_ac", "fsdp2_canonicalize_names", "fsdp2_load_full_state_dict", "fsdp2_prepare_model",
                       "fsdp2_switch_optimizer_parameters", "get_fsdp2_grad_scaler", "model_has_dtensor"],
        _LAUNCH: ["PrepareForLaunch", "SageMakerDistributedType", "TORCH_LAUNCH_PARAMS", "convert_dict_to_env_variables", "install_xla",
                  "prepare_deepspeed_cmd_env", "prepare_multi_gpu_env", "prepare_sagemager_args_inputs", "prepare_simple_launcher_cmd_env",
                  "prepare_tpu", "purge_accelerate_environment", "write_basic_config", "get_cpu_distributed_information",
                  "set_numa_affinity", "check_cuda_p2p_ib_support", "get_gpu_info"],
        _PARALLEL: ["DeepSpeedSequenceParallelConfig", "TorchContextParallelConfig",
                    "TorchTensorParallelPlugin", "get_model_tp_size"],
        _REGIONS: ["compile_regions", "compile_regions_deepspeed", "compile_regions_fsdp2"],
        _DEEPSPEED_INTERNAL: ["DeepSpeedEngineWrapper", "DeepSpeedOptimizerWrapper", "DeepSpeedSchedulerWrapper", "HfDeepSpeedConfig",
                              "GatheredParameters", "get_active_deepspeed_plugin", "map_pytorch_optim_to_deepspeed", "deepspeed_required"],
        _INTERNAL: ["CannotPadNestedTensorWarning", "TORCH_DISTRIBUTED_OPERATION_TYPES", "are_libraries_initialized", "check_os_kernel",
                    "get_current_device_type", "get_mixed_precision_context_manager", "pad_input_tensors"],
    },
    "trainer.state": {
        _STATE_INTERNAL: ["SharedDict", "ThreadLocalSharedDict", "do_nothing"],
        _LOGGER: ["logger"],
    },
    "trainer.tracking": {_LOGGER: ["logger"]},
    "trainer.data_loader": {
        _DATA: ["DataLoaderAdapter", "DataLoaderStateMixin", "SkipBatchSampler", "SkipDataLoader", "get_sampler"],
        _DISPATCH: ["DataLoaderDispatcher"],
        _LOGGER: ["logger"],
    },
}

# Accelerate's submodules that have no module of the same name here: import their names from the module given instead
UNSUPPORTED_MODULES: dict[str, str] = {
    "trainer.checkpointing": "Accelerate's save_state internals; use accelerator.save_state / load_state",
    "trainer.commands": "Accelerate's CLI; the command line is `trainer` (trainer launch, trainer config, trainer env)",
    "trainer.hooks": "Accelerate's big-model dispatch hooks: " + _BIG_MODEL,
    "trainer.inference": _PIPPY,
    "trainer.optimizer": "Accelerate's AcceleratedOptimizer: prepare() returns a PreparedOptimizer (trainer.accelerator.wrappers)",
    "trainer.scheduler": "Accelerate's AcceleratedScheduler: prepare() returns a PreparedScheduler (trainer.accelerator.wrappers)",
    "trainer.utils.*": "Accelerate's file layout inside accelerate.utils (ao, bnb, constants, dataclasses, environment, fsdp_utils, "
                       "imports, launch, megatron_lm, memory, modeling, offload, operations, other, random, torch_xla, "
                       "transformer_engine, versions): import every name from trainer.utils itself",
}


def unsupported_names(module: str) -> Callable[[str], Any]:
    """A module ``__getattr__`` that returns the stand-in of an unsupported name of `module` (AttributeError otherwise)."""
    reasons = {name: reason for reason, names in UNSUPPORTED.get(module, {}).items() for name in names}

    def __getattr__(name: str) -> Any:
        reason = reasons.get(name)
        if reason is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        return stand_in(module, name, reason)

    return __getattr__


def reason_for(module: str, name: str) -> str | None:
    """Why `module` does not provide `name` (None when it is not listed)."""
    return next((reason for reason, names in UNSUPPORTED.get(module, {}).items() if name in names), None)


def stand_in(module: str, name: str, reason: str) -> Any:
    """A class (for a CapWords name) or function that raises `NotImplementedError` with `reason` when used."""
    message = f"{module}.{name} is not provided by trainwright: {reason}"

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(message)

    if name[:1].isupper() and not name.isupper():
        return type(name, (), {"__init__": refuse, "__doc__": message, "__module__": module, "unsupported_reason": reason})
    refuse.__name__ = refuse.__qualname__ = name
    refuse.__doc__ = message
    refuse.__module__ = module
    refuse.unsupported_reason = reason  # type: ignore[attr-defined]
    return refuse
