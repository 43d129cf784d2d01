"""DeepSpeed ZeRO stages 1-3, on the `deepspeed` package (``pip install 'trainwright[deepspeed]'``).

DeepSpeed's engine owns the model, the optimizer step, gradient accumulation, clipping and its mixed
precision. So this strategy sets the module and its optimizer up together (one ``deepspeed.initialize``),
and `backward` on an accumulation boundary is the engine's backward *and* step; the face's
``optimizer.step()`` then only reports whether the engine stepped.

    accelerator = Accelerator(strategy=DeepSpeedStrategy(zero_stage=3, offload_optimizer=True))
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)   # one call, as Accelerate

    trainer = Trainer(strategy="deepspeed", devices=2, accumulate_grad_batches=4, gradient_clip_val=1.0)

The face's accumulation steps, clipping and precision are written into the DeepSpeed config (a user's
config dict or JSON file may set them too; ``"auto"`` values are filled from ours, and two different values
are an error naming both). At stage 3, a model built in `DeepSpeedStrategy.module_init_context`
(``Trainer.init_module()``, ``Accelerator.init_module()``) is partitioned as it is built (`deepspeed.zero.Init`,
`strategies.zero_init`): no process ever holds the full model. Checkpoints hold the engine's own files (``deepspeed/``) plus the consolidated
float32 weights (``model.safetensors``, unless ``export_weights=False``), loadable by any strategy and by plain PyTorch.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import pickle
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from strategies import checkpoint_io
from strategies import checkpoint_store as store
from strategies.abilities import Engine
from strategies.base import Strategy, best_device, materialize_if_empty, repoint_optimizer
from strategies.checkpoint_hash import MemoryFile
from strategies.checkpoint_staging import Staging
from strategies.checkpoint_store import Write
from strategies.environment import ClusterEnvironment, detect_environment, process_group_timeout
from strategies.precision import DeepSpeedPrecision, normalize_precision
from strategies.process_group import give_timeout, groups_now, join_process_group, leave_process_group
from strategies.zero_init import is_partitioned, partitioned_init

INSTALL_HINT = "pip install 'trainwright[deepspeed]' (or pip install deepspeed)"
_TAG = "state"  # the engine's checkpoint tag inside our directory: one engine checkpoint per directory
_AUTO = "auto"
_UNSET: Any = object()
REDUCE_BUCKET_ELEMENTS = 500_000_000  # DeepSpeed's default reduce_bucket_size (elements)


def import_deepspeed(device: torch.device) -> Any:
    """Import `deepspeed` for `device` (``DS_ACCELERATOR`` must be set before the import on a CPU machine)."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu" if device.type == "cpu" else device.type)
    try:
        import deepspeed
    except ImportError as err:
        raise ImportError(f"strategy='deepspeed' needs the deepspeed package, which is not installed: {INSTALL_HINT}") from err
    if device.type == "cpu":
        skip_inference_comm_op(deepspeed)
    return deepspeed


def skip_inference_comm_op(deepspeed: Any) -> None:
    """Keep DeepSpeed's communication backend from compiling its shared-memory all-reduce op on a CPU machine.

    When the backend starts on CPU it builds ``deepspeed_shm_comm`` (C++ with OpenMP, 40 s to over 2 minutes of gcc
    on first use per machine and extensions folder), which only ``inference_all_reduce`` calls: DeepSpeed inference's
    tensor parallelism, never a training engine, whose collectives go through ``torch.distributed``. Marking the op
    incompatible makes the backend start without it, as on a platform that cannot build it. ``DS_BUILD_SHM_COMM=1``
    (DeepSpeed's own switch for this op) keeps it, and a backend already started is left as it is.
    """
    if os.environ.get("DS_BUILD_SHM_COMM") == "1" or _comm_backend_started():
        return
    compatible = deepspeed.ops.__compatible_ops__  # DeepSpeed's own table, probed once per process and kept
    if "deepspeed_shm_comm" in compatible:
        compatible["deepspeed_shm_comm"] = False


def _comm_backend_started() -> bool:
    from deepspeed.comm import comm

    return comm.cdb is not None


def load_config(config: dict[str, Any] | str | os.PathLike[str] | None) -> dict[str, Any]:
    """A copy of a DeepSpeed config given as a dict or a JSON file path (``{}`` for None)."""
    if config is None:
        return {}
    if isinstance(config, dict):
        return copy.deepcopy(config)
    if not isinstance(config, (str, os.PathLike)):
        raise TypeError(f"config must be a dict or the path of a DeepSpeed JSON config, got {type(config).__name__}")
    path = Path(config)
    if not path.is_file():
        raise FileNotFoundError(f"DeepSpeed config file {str(path)!r} does not exist; pass an existing JSON file or a dict")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"DeepSpeed config file {str(path)!r} is not valid JSON ({err}); fix the file or pass a dict") from None
    if not isinstance(data, dict):
        raise ValueError(f"DeepSpeed config file {str(path)!r} holds a {type(data).__name__}, not a JSON object")
    return data


def reduce_bucket_size(configured: Any, module: nn.Module) -> int:
    """The elements of ZeRO's gradient bucket for `module`: the config's ``reduce_bucket_size`` when it sets one (not
    ``"auto"``), else DeepSpeed's default (5e8) capped at the module's trainable elements.

    Stages 1-3 allocate the bucket whole, whatever the model's size (``setup_buckets`` in DeepSpeed's
    ``stage_1_and_2.py``; stage 3 for the engine's life, ``_setup_for_real_optimizer``): 2 GB in float32 for a model
    of a few million parameters. A bucket holds gradients until they are reduced, so one as large as the model is
    never full before backward ends: the cap reduces the same gradients at the same points and frees the rest.
    """
    if configured != _AUTO:
        return int(configured)
    elements = sum(getattr(p, "ds_numel", p.numel()) for p in module.parameters() if p.requires_grad)  # (ZeRO-3: whole)
    return max(1, min(REDUCE_BUCKET_ELEMENTS, elements))


def _agree(what: str, ours: Any, theirs: Any, default: Any) -> Any:
    """One value from our argument and the config's: either may be unset (``_UNSET``/``"auto"``); a conflict is an error."""
    if theirs is _UNSET or theirs == _AUTO:
        return default if ours is _UNSET else ours
    if ours is _UNSET or ours == theirs:
        return theirs
    raise ValueError(
        f"{what} is {ours!r} here but {theirs!r} in the DeepSpeed config; set it in one place only "
        f"(or set it to 'auto' in the config to take {ours!r})"
    )


class DeepSpeedStrategy(Strategy, Engine):
    """ZeRO data parallelism through DeepSpeed's engine.

    Args:
        cluster: the process layout (detected from the environment by default).
        cpu: force CPU (gloo) even when GPUs are present.
        precision: ``"no"`` or ``"bf16"`` (``"fp16"`` on GPUs only): the engine's own mixed precision, float32 master weights.
            The true modes (``"bf16-true"``, ...) are refused with a `ValueError`: the engine keeps float32 master weights.
        timeout: process-group timeout in seconds (as for DDP).
        zero_stage: 1 (optimizer states sharded), 2 (and gradients; the default, as Lightning and Accelerate),
            3 (and parameters), or 0 (plain data parallel through the engine). ``stage`` is Lightning's name for it.
        offload_optimizer: keep optimizer states (and the step) in CPU memory.
        offload_parameters: keep parameters in CPU memory (stage 3 only).
        gradient_clipping: clip the global gradient norm to this in the engine's step.
        config: a DeepSpeed config dict or JSON file; the arguments above fill its ``"auto"`` and missing values.
        backend: ``"gloo"``/``"nccl"``; chosen from the device when None.
        zero_init: at stage 3, whether `module_init_context` (``init_module()``) builds models partitioned
            (`deepspeed.zero.Init`) when its ``empty_init`` is None: True by default; False builds a full copy there
            (partitioned at prepare). True with another stage is a `ValueError`. Accelerate's ``zero3_init_flag``.
        export_weights: whether a checkpoint also holds the consolidated float32 weights (``model.safetensors``,
            gathered from every process's partition at each save), which any strategy, plain PyTorch and
            `TrainModule.load_from_checkpoint` load. False saves only the engine's files, as fast as the engine's
            own ``save_checkpoint``; resuming with strategy='deepspeed' needs nothing else, and DeepSpeed's
            ``zero_to_fp32.py`` in the checkpoint still recovers the weights.
        **unsupported: refused with a `TypeError` naming the supported arguments.
    """

    name = "deepspeed"
    precision_class = DeepSpeedPrecision
    precision: DeepSpeedPrecision

    def __init__(
        self,
        *,
        cluster: ClusterEnvironment | None = None,
        cpu: bool = False,
        precision: str = "no",
        timeout: float | None = None,
        zero_stage: int | None = None,
        offload_optimizer: bool | None = None,
        offload_parameters: bool | None = None,
        gradient_clipping: float | None = None,
        config: dict[str, Any] | str | os.PathLike[str] | None = None,
        backend: str | None = None,
        stage: int | None = None,
        zero_init: bool | None = None,
        export_weights: bool = True,
        **unsupported: Any,
    ) -> None:
        if stage is not None:  # Lightning's name for zero_stage
            if zero_stage is not None and zero_stage != stage:
                raise ValueError(f"stage={stage!r} and zero_stage={zero_stage!r} disagree; pass one of them")
            zero_stage = stage
        if unsupported:
            raise TypeError(
                f"DeepSpeedStrategy got unsupported arguments {sorted(unsupported)}; it takes zero_stage (or stage), offload_optimizer, "
                "offload_parameters, gradient_clipping, config, zero_init, export_weights, precision, cpu, timeout, backend"
            )
        if not dist.is_available():
            raise RuntimeError("strategy='deepspeed' needs torch.distributed, which this torch build lacks; use strategy='single'")
        cluster = detect_environment() if cluster is None else cluster
        device = best_device(cpu=cpu, local_rank=cluster.local_rank, assigned=cluster.device)
        self.config = load_config(config)
        mode = self._agree_precision(normalize_precision(precision), device)
        super().__init__(cluster=cluster, device=device, precision=mode)
        zero = self.config.setdefault("zero_optimization", {})
        if not isinstance(zero, dict):
            raise ValueError(f"'zero_optimization' in the DeepSpeed config must be an object, got {zero!r}")
        stage = _agree("zero_stage", _UNSET if zero_stage is None else zero_stage, zero.get("stage", _UNSET), 2)
        if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage={stage!r} is not a ZeRO stage; choose 0, 1, 2 or 3")
        zero["stage"] = self.zero_stage = int(stage)
        self._offload(zero, "offload_optimizer", offload_optimizer)
        self._offload(zero, "offload_param", offload_parameters)
        if self.zero_stage != 3 and zero.get("offload_param", {}).get("device", "none") != "none":
            raise ValueError(f"offload_parameters needs zero_stage=3 (parameters are not partitioned in stage {self.zero_stage}); set zero_stage=3")
        clip = _agree("gradient_clipping", _UNSET if gradient_clipping is None else float(gradient_clipping), self.config.get("gradient_clipping", _UNSET), 0.0)
        self.config["gradient_clipping"] = float(clip)
        self.config.setdefault("steps_per_print", 2**31 - 1)  # the engine's own progress lines; our faces log
        self.config.setdefault("zero_allow_untested_optimizer", True)  # any torch optimizer (SGD, ...), as Lightning
        if zero_init and self.zero_stage != 3:
            raise ValueError(
                f"zero_init=True (parameters partitioned as the model is built) needs ZeRO stage 3, but the stage is {self.zero_stage}; "
                "set zero_stage=3, or leave zero_init unset"
            )
        self.zero_init = zero_init is not False
        if not isinstance(export_weights, bool):
            raise TypeError(f"export_weights={export_weights!r} must be True or False")
        self.export_weights = export_weights
        self.sharded = self.zero_stage == 3  # forward gathers parameters (a collective)
        self.backend = backend or ("nccl" if device.type == "cuda" else "gloo")
        self.timeout: float = process_group_timeout(timeout)
        self.engine: Any = None
        self._masters = False
        self._owns_group = False
        self._groups_before: set[Any] | None = None  # the groups before DeepSpeed made its own (zero.Init, initialize)

    # configuration ------------------------------------------------------------------------------------
    def _agree_precision(self, mode: str, device: torch.device) -> str:
        DeepSpeedPrecision.refuse_true_precision(mode)  # before the config's bf16/fp16 sections are compared with it
        enabled = [name for name in ("bf16", "fp16") if self.config.get(name, {}).get("enabled") is True]
        if len(enabled) > 1:
            raise ValueError("the DeepSpeed config enables both bf16 and fp16; enable one")
        if enabled and mode not in ("no", enabled[0]):
            raise ValueError(f"mixed_precision is {mode!r} here but the DeepSpeed config enables {enabled[0]!r}; set it in one place only")
        mode = enabled[0] if enabled else mode
        if mode == "fp16" and device.type == "cpu":
            raise ValueError("DeepSpeed runs fp16 only on GPUs; on CPU use mixed_precision='bf16' or 'no'")
        return mode

    @staticmethod
    def _offload(zero: dict[str, Any], key: str, ours: bool | None) -> None:
        section = zero.get(key)
        theirs = _UNSET if section is None else section.get("device", "none") not in ("none", None)
        wanted = _agree(key, _UNSET if ours is None else bool(ours), theirs, False)
        if wanted and section is None:
            zero[key] = {"device": "cpu"}
        elif not wanted and section is None:
            zero.pop(key, None)

    def agree_accumulation(self, steps: int) -> int:
        theirs = self.config.get("gradient_accumulation_steps", _AUTO)
        if theirs == _AUTO:
            self.config["gradient_accumulation_steps"] = steps
            return steps
        if isinstance(theirs, bool) or not isinstance(theirs, int) or theirs < 1:
            raise ValueError(f"gradient_accumulation_steps={theirs!r} in the DeepSpeed config must be an int >= 1 or 'auto'")
        if steps == 1:  # the face kept its default: the config decides
            return theirs
        return int(_agree("gradient_accumulation_steps", steps, theirs, steps))

    def agree_clipping(self, value: float | None, algorithm: str = "norm") -> None:
        """Take the Trainer's ``gradient_clip_val`` into the engine's config (DeepSpeed clips by norm only)."""
        if value is None:
            return
        if algorithm != "norm":
            raise ValueError(f"gradient_clip_algorithm={algorithm!r}: DeepSpeed clips by the global norm only; use 'norm'")
        configured = self.config["gradient_clipping"]
        if configured and configured != float(value):
            raise ValueError(
                f"gradient_clip_val is {value!r} but the DeepSpeed strategy clips to gradient_clipping={configured!r}; set it in one place only"
            )
        self.config["gradient_clipping"] = float(value)

    def engine_config(self, batch_size: int | None, module: nn.Module | None = None) -> dict[str, Any]:
        """The final config for ``deepspeed.initialize`` (of `module`: its gradient bucket, `reduce_bucket_size`)."""
        config = copy.deepcopy(self.config)
        if module is not None:
            zero = config["zero_optimization"]
            zero["reduce_bucket_size"] = reduce_bucket_size(zero.get("reduce_bucket_size", _AUTO), module)
        for name, section in self.precision.engine_config().items():  # keep the user's other bf16/fp16 options
            config[name] = {**config.get(name, {}), **section}
        if config.get("gradient_accumulation_steps", _AUTO) == _AUTO:
            config["gradient_accumulation_steps"] = 1
        if config.get("train_micro_batch_size_per_gpu", _AUTO) == _AUTO:
            config["train_micro_batch_size_per_gpu"] = batch_size or 1  # only the engine's throughput reports use it
        if config.get("train_batch_size") == _AUTO:
            del config["train_batch_size"]
        return config

    # setup --------------------------------------------------------------------------------------------
    def setup_environment(self) -> None:
        if self.world_size == 1 and not dist.is_initialized():
            # the engine needs a process group even for one process; an in-memory store needs no free port
            dist.init_process_group(self.backend, store=dist.HashStore(), rank=0, world_size=1)
            self._owns_group = True
        else:  # a second call (module_init_context joined first) keeps the ownership the first one took
            self._owns_group = join_process_group(self.cluster, self.device, self.backend, self.timeout, self.teardown) or self._owns_group
        import_deepspeed(self.device)

    def module_init_context(self, empty_init: bool | None = None) -> AbstractContextManager[Any]:
        """Where a model is built. Stage 3 (unless ``empty_init=False``, or ``zero_init=False`` and ``empty_init`` None):
        inside `deepspeed.zero.Init`, so each parameter is partitioned across the processes as soon as its module is
        built, in the dtype the engine trains in (bf16 with ``precision="bf16"``); see `strategies.zero_init`. The
        process group is joined first if `setup_environment` has not run. Otherwise the base behaviour: a full copy on
        the device, or on the meta device with ``empty_init=True`` (materialized at prepare).
        """
        if self.zero_stage != 3 or empty_init is False or (empty_init is None and not self.zero_init):
            return super().module_init_context(empty_init)
        if not dist.is_initialized():
            self.setup_environment()  # zero.Init partitions across the process group
        os.environ.setdefault("LOCAL_RANK", str(self.local_rank))  # zero.Init picks its device by it (unset in a plain process)
        if self._groups_before is None:
            self._groups_before = groups_now()
        return partitioned_init(import_deepspeed(self.device), self.init_config(), self.precision.module_init_context())

    def init_config(self) -> dict[str, Any]:
        """The config for `deepspeed.zero.Init`: the engine's (its ZeRO section: parameter offload, quantized weights,
        ...; bf16/fp16: the dtype parameters are made in), with one-sample batches: the micro-batch size is known only
        at prepare, zero.Init does not use it, but DeepSpeed's config check needs consistent batch sizes."""
        config = self.engine_config(None)
        config.pop("train_batch_size", None)
        config["train_micro_batch_size_per_gpu"] = config["gradient_accumulation_steps"] = 1
        return config

    def setup_module(self, module: nn.Module, *, move: bool = True, wrap: bool = True) -> nn.Module:
        if not wrap:
            if is_partitioned(module):
                raise ValueError(
                    f"this {type(module).__name__} was built partitioned (ZeRO-3: init_module() or configure_model()), so it runs "
                    "only inside a DeepSpeed engine, not as a plain module: prepare it through the engine (accelerator.prepare(model, "
                    "optimizer); with the Trainer, fit before evaluating), or build it with init_module(empty_init=False)"
                )
            materialize_if_empty(self, module)
            return module.to(self.device) if move else module
        return self.setup_module_and_optimizers(module, [], move=move)[0]

    def setup_module_and_optimizers(
        self,
        module: nn.Module,
        optimizers: list[torch.optim.Optimizer],
        *,
        move: bool = True,
        batch_size: int | None = None,
        model_parameters: Any = None,
        lr_scheduler: Callable[[torch.optim.Optimizer], object] | None = None,
    ) -> tuple[nn.Module, list[torch.optim.Optimizer]]:
        """Build the engine. With no optimizer passed and an ``optimizer`` section in the config, the engine builds the
        optimizer from it, over `model_parameters` (parameters or parameter groups; default: every trainable
        parameter); `lr_scheduler` (a function of the optimizer) builds the engine's schedule when the config has
        no ``scheduler`` section (Accelerate's ``DummyOptim``/``DummyScheduler``). The engine's schedule, if any, is
        ``self.engine.lr_scheduler``, stepped by the engine in its optimizer step."""
        if self.engine is not None:
            raise ValueError(
                "strategy='deepspeed' drives one model per run (one DeepSpeed engine); a second model was prepared. "
                "Combine them into one nn.Module, or prepare the second one with evaluation_mode=True"
            )
        if len(optimizers) > 1:
            raise ValueError(
                f"DeepSpeed's engine steps one optimizer, got {len(optimizers)}; put their parameters into one optimizer "
                "as parameter groups"
            )
        if self.zero_stage != 3 and is_partitioned(module):
            raise ValueError(
                f"this {type(module).__name__} was built partitioned by deepspeed.zero.Init (ZeRO-3), but this strategy runs "
                f"ZeRO stage {self.zero_stage}; build it with the same strategy that trains it, or use zero_stage=3"
            )
        materialize_if_empty(self, module)  # built on the meta device (empty_init=True below stage 3): allocate and initialize
        optimizers = [repoint_optimizer(self, opt, "DeepSpeed cannot take its state") for opt in optimizers]
        config = self.engine_config(batch_size, module)
        if not optimizers and "optimizer" not in config and self.zero_stage < 3:
            # no optimizer (evaluation): below stage 3 nothing is partitioned, so the plain module runs as the engine would
            module = module.to(self.device) if move else module
            return (module if self.precision.dtype is None else module.to(self.precision.dtype)), []
        if optimizers and "optimizer" in config:
            raise ValueError(
                "an optimizer was passed and the DeepSpeed config has an 'optimizer' section; use one: drop the section, "
                "or pass no optimizer and let DeepSpeed build it"
            )
        if model_parameters is not None and "optimizer" not in config:
            raise ValueError("model_parameters are for the optimizer the DeepSpeed config describes, but the config has no 'optimizer' section")
        if lr_scheduler is not None and "scheduler" in config:
            raise ValueError("a scheduler function was passed and the DeepSpeed config has a 'scheduler' section; use one")
        if model_parameters is None and "optimizer" in config:
            model_parameters = [p for p in module.parameters() if p.requires_grad]
        deepspeed = import_deepspeed(self.device)
        before = self._groups_before if self._groups_before is not None else groups_now()
        engine, optimizer, _, _ = deepspeed.initialize(
            model=module,
            optimizer=optimizers[0] if optimizers else None,
            model_parameters=model_parameters,
            lr_scheduler=lr_scheduler,
            config=config,
            dist_init_required=False,
        )
        # DeepSpeed's own groups (its data-parallel one, ...) got the backend's default timeout, 30 minutes for gloo
        give_timeout(groups_now() - before, self.timeout)
        self._groups_before = None
        self.engine = engine
        self._masters = bool(optimizers) or "optimizer" in config  # the optimizer keeps float32 master copies
        return engine, [] if optimizer is None or not self._masters else [optimizer]

    def fill_auto(self, values: dict[str, Any]) -> None:
        """Replace the config's ``"auto"`` entries named in `values` by dotted key (``"optimizer.params.lr"``); entries
        set to anything else stay (Accelerate's ``deepspeed_config_process(must_match=False)``)."""
        for dotted, value in values.items():
            *path, key = dotted.split(".")
            node: Any = self.config
            for part in path:
                node = node.get(part) if isinstance(node, dict) else None
            if isinstance(node, dict) and node.get(key) == _AUTO:
                node[key] = value

    def setup_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        raise ValueError(
            "strategy='deepspeed' sets up the model and its optimizer together (one DeepSpeed engine): pass both to the "
            "same prepare() call, e.g. model, optimizer, loader = accelerator.prepare(model, optimizer, loader)"
        )

    def _engine(self) -> Any:
        if self.engine is None:
            raise RuntimeError("the DeepSpeed engine is not set up yet; prepare the model (with its optimizer) first")
        return self.engine

    # training -----------------------------------------------------------------------------------------
    def backward(self, loss: torch.Tensor, *, accumulation_steps: int = 1, boundary: bool = True, **kwargs: Any) -> None:
        """The engine's backward (it divides by its accumulation steps); on a `boundary` also its step:
        gradient reduction, clipping, optimizer step and zeroing."""
        engine = self._engine()
        engine.set_gradient_accumulation_boundary(boundary)
        engine.backward(loss, **kwargs)
        if boundary:
            engine.step()

    def optimizer_step(self, optimizer: torch.optim.Optimizer, **kwargs: Any) -> bool:
        """The engine stepped in `backward`; True unless it skipped the step (fp16 overflow)."""
        return bool(self._engine().was_step_applied())

    def gathered_parameters(self, module: nn.Module) -> AbstractContextManager[Any]:
        if self.zero_stage != 3 or self.engine is None:
            return contextlib.nullcontext()
        return _gathered_without_hooks(self.engine, list(self.unwrap_module(module).parameters()))

    def clip_grad_norm_(self, parameters: Any, max_norm: float, norm_type: float = 2.0) -> torch.Tensor:
        """The engine clipped in its step; returns the global norm it measured (before clipping).

        DeepSpeed clips to the configured ``gradient_clipping`` only, so another `max_norm` is refused.
        """
        configured = self.config["gradient_clipping"]
        if float(norm_type) != 2.0:
            raise ValueError(f"norm_type={norm_type!r}: DeepSpeed clips by the 2-norm only; use norm_type=2")
        if configured != float(max_norm):
            raise ValueError(
                f"DeepSpeed clips inside its engine step, to gradient_clipping={configured!r} from its config, so "
                f"clip_grad_norm_(max_norm={max_norm!r}) cannot apply; pass DeepSpeedStrategy(gradient_clipping={max_norm!r}) "
                "(or set 'gradient_clipping' in the DeepSpeed config)"
            )
        norm = self._engine().get_global_grad_norm()
        return torch.as_tensor(0.0 if norm is None else norm, dtype=torch.float32).detach().cpu()

    def clip_grad_value_(self, parameters: Any, clip_value: float) -> None:
        raise ValueError("DeepSpeed clips by the global gradient norm only, not by value; use clip_grad_norm_ with gradient_clipping set")

    # checkpoints --------------------------------------------------------------------------------------
    def module_state_dict(self, module: nn.Module) -> dict[str, torch.Tensor]:
        """Full float32 weights (the optimizer's master copies when there is one), on every rank. A collective."""
        from deepspeed.utils import safe_get_full_fp32_param

        inner = self.unwrap_module(module)
        by_name = dict(inner.named_parameters(remove_duplicate=False))
        masters = self._masters and not self._params_are_masters()
        state: dict[str, torch.Tensor] = {}
        for name, value in inner.state_dict(keep_vars=True).items():
            param = by_name.get(name)
            if param is None:
                state[name] = value.detach().cpu()
                continue
            full = safe_get_full_fp32_param(param) if masters else None
            if full is None:
                with self._gathered([param]):
                    full = param.detach().clone()
            state[name] = full.detach().cpu()
        return state

    def _params_are_masters(self) -> bool:
        """Whether the module's parameters are the float32 master weights themselves, whole on every process: ZeRO 0-2
        in float32 without offload, where the engine copies each step's result back into them. Reading them then
        needs no collective per parameter."""
        engine, zero = self.engine, self.config.get("zero_optimization", {})
        offload = zero.get("offload_optimizer") if isinstance(zero, dict) else None
        offloaded = isinstance(offload, dict) and offload.get("device", "none") not in (None, "none")
        return (engine is not None and self.zero_stage < 3 and not offloaded
                and not engine.bfloat16_enabled() and not engine.fp16_enabled())

    def _gathered(self, params: list[nn.Parameter], modifier_rank: int | None = None) -> AbstractContextManager[Any]:
        if self.zero_stage != 3:
            return contextlib.nullcontext()
        deepspeed = import_deepspeed(self.device)
        return deepspeed.zero.GatheredParameters(params, modifier_rank=modifier_rank)  # type: ignore[no-any-return]

    def load_module_state_dict(self, module: nn.Module, state: dict[str, torch.Tensor], strict: bool = True) -> None:
        """Load full weights (the same on every rank) into the engine's module and its master copies. A collective."""
        inner = self.unwrap_module(module)
        with self._gathered(list(inner.parameters()), modifier_rank=0):
            inner.load_state_dict(state, strict=strict)
        if not self._masters:
            return
        from deepspeed.utils import safe_set_full_fp32_param, safe_set_local_fp32_param

        for name, param in inner.named_parameters():
            if name not in state:
                continue
            value = state[name].to(self.device, torch.float32)
            if hasattr(param, "ds_id"):  # stage 3: DeepSpeed's full setter cannot cut the last, padded partition; cut it here
                safe_set_local_fp32_param(param, _local_partition(value, param))
            else:
                safe_set_full_fp32_param(param, value)

    def collect_checkpoint(self, models: list[nn.Module], optimizers: list[torch.optim.Optimizer], staging: Staging | None) -> Write:
        """The engine's own checkpoint in ``deepspeed/`` (every rank its partitions), plus the full float32 weights
        (``model.safetensors``) unless ``export_weights=False``.

        The engine's files go through our writer (`_ThroughCheckpointIO`): each is hashed in the pass that writes it
        and flushed with the rest. Synchronous only: the engine writes from its live partitions, in a collective.
        """
        if staging is not None:
            raise NotImplementedError(
                "async_save=True is not available with strategy='deepspeed': DeepSpeed's engine writes its checkpoint "
                "files itself, from its live partitions and in its own collectives, so there is no copy to write in the "
                "background. Save synchronously (leave async_save out)"
            )
        engine = self._engine()
        states = [self.module_state_dict(m) for m in models] if self.export_weights else []  # a collective: every rank

        def write(writer: checkpoint_io.CheckpointWriter) -> None:
            directory = writer.staging / store.DEEPSPEED_DIR
            with _through(engine, writer=writer):
                engine.save_checkpoint(str(directory), tag=_TAG, client_state={}, save_latest=False)
            files = [path.relative_to(writer.staging).as_posix() for path in sorted(directory.rglob("*")) if path.is_file()]
            # what the engine wrote without its checkpoint engine (its recovery scripts): read back to hash
            writer.hash_written([name for name in _owned(files, self.rank) if name not in writer.files])
            if self.rank == 0:
                for i, state in enumerate(states):
                    writer.save_safetensors(store.model_file(i), state)

        return write

    def load_checkpoint(
        self, reader: checkpoint_io.CheckpointReader | os.PathLike[str] | str, models: list[nn.Module],
        optimizers: list[torch.optim.Optimizer], *, strict: bool = True,
    ) -> None:
        """The engine's own checkpoint when there is one (each file checked in the pass that reads it, before the
        engine uses any of it: `_ThroughCheckpointIO`), else the weights alone."""
        reader = reader if isinstance(reader, checkpoint_io.CheckpointReader) else checkpoint_io.CheckpointReader(reader)
        path = reader.directory
        if not (path / store.DEEPSPEED_DIR).is_dir() or self.engine is None:
            # weights alone (no engine: a model prepared for evaluation), from model.safetensors
            if optimizers:
                raise checkpoint_io.CheckpointError(
                    f"checkpoint {str(path)!r} was not written by strategy='deepspeed', and DeepSpeed cannot take another "
                    "strategy's optimizer states; resume it with the strategy that wrote it, or load its weights alone "
                    "(strategies.checkpoint_io.load_weights(directory, model), or TrainModule.load_from_checkpoint)"
                )
            missing = [store.model_file(i) for i in range(len(models)) if not (path / store.model_file(i)).is_file()]
            if missing and (path / store.DEEPSPEED_DIR).is_dir():
                raise checkpoint_io.CheckpointError(checkpoint_io.no_exported_weights(path, missing[0]))
            super().load_checkpoint(reader, models, optimizers, strict=strict)
            return
        engine = self.engine
        engine_files = [name for name in reader.expected or {} if name.startswith(f"{store.DEEPSPEED_DIR}/")]
        saved_world = reader.manifest.get("world_size", self.world_size) if reader.manifest else self.world_size
        if int(saved_world) != self.world_size:
            self._load_resharded(reader, engine_files, int(saved_world), optimizers, strict)
            return
        # the files that no engine reads, checked by the process that saved them (no second agreement at the end): the
        # engine's recovery scripts, and the exported weights
        unread = [name for name in _owned(engine_files, self.rank) if not _reads(name, self.rank)]
        unread += [name for i in range(len(models)) if self.rank == 0 and (name := store.model_file(i)) in (reader.expected or {})]
        reader.prefetch(unread)  # checked while the engine loads (the files it reads are hashed in the pass that parses them)
        with _through(engine, reader=reader if reader.hashes else None):
            loaded, _ = engine.load_checkpoint(
                str(path / store.DEEPSPEED_DIR),
                tag=_TAG,
                load_module_strict=strict,
                load_optimizer_states=bool(optimizers),
                load_lr_scheduler_states=engine.lr_scheduler is not None,
            )
        if loaded is None:
            raise checkpoint_io.CheckpointError(f"DeepSpeed found no engine checkpoint in {str(path / store.DEEPSPEED_DIR)!r}")
        if reader.hashes:
            for name in _owned(engine_files, self.rank) + unread:
                if name not in reader.checked:
                    reader.read(name)

    def _load_resharded(
        self, reader: checkpoint_io.CheckpointReader, engine_files: list[str], saved_world: int,
        optimizers: list[torch.optim.Optimizer], strict: bool,
    ) -> None:
        """Load an engine checkpoint written by `saved_world` processes on this run's number: process 0 checks every
        engine file against the manifest, converts the checkpoint to DeepSpeed's universal format (each parameter's
        fp32 weights and optimizer states whole, ``deepspeed.checkpoint.ds_to_universal``) in a hidden folder beside it,
        and every engine loads its new partitions from there (``checkpoint: {load_universal: true}``); the folder is
        removed afterwards. The weights and optimizer states are the saved ones, bit for bit."""
        engine, path = self.engine, reader.directory
        if self.zero_stage not in (1, 2, 3):
            raise checkpoint_io.CheckpointError(
                f"checkpoint {str(path)!r} was written by {saved_world} processes and this run has {self.world_size}: "
                f"DeepSpeed's states are resharded from ZeRO stages 1-3 only (this run: zero_stage={self.zero_stage}); "
                f"resume on {saved_world} processes"
            )
        universal = path.parent / f".{path.name}.universal"
        problem = None
        if self.rank == 0:
            try:
                for name in engine_files:
                    reader.read(name)  # (checked before DeepSpeed unpickles any of it)
                _to_universal(path / store.DEEPSPEED_DIR / _TAG, universal / _TAG)
            except Exception as err:  # any process's failure, raised on every process below
                problem = f"{type(err).__name__}: {err}"
        problem = self.broadcast_object(problem, 0)
        try:
            if problem is not None:
                raise checkpoint_io.CheckpointError(
                    f"cannot reshard the DeepSpeed checkpoint {str(path)!r} of {saved_world} processes to {self.world_size}: {problem}"
                )
            # DeepSpeed's own internal: load_checkpoint reads engine._config.load_universal_checkpoint, which has no public
            # setter (engine.load_universal_checkpoint() only reads it; the JSON config fixes it at initialize): set for
            # this one load, reset after it
            engine._config.load_universal_checkpoint = True
            try:
                loaded, _ = engine.load_checkpoint(
                    str(universal), tag=_TAG, load_module_strict=strict, load_optimizer_states=bool(optimizers),
                    load_lr_scheduler_states=engine.lr_scheduler is not None,
                )
            finally:
                engine._config.load_universal_checkpoint = False
            if loaded is None:
                raise checkpoint_io.CheckpointError(f"DeepSpeed found no universal checkpoint in {str(universal)!r}")
        finally:
            self.barrier()
            if self.rank == 0:
                import shutil

                shutil.rmtree(universal, ignore_errors=True)

    def teardown(self) -> None:
        self.engine = None
        deepspeed = sys.modules.get("deepspeed")
        if self._owns_group and dist.is_initialized() and deepspeed is not None and deepspeed.comm.is_initialized():
            # DeepSpeed keeps handles of the groups it made from this one (a clone of the world group): its own destroy
            # lets them go, or the next engine in this process would use groups that no longer exist
            deepspeed.comm.destroy_process_group()
        leave_process_group(self._owns_group)
        self._owns_group = False

    def __repr__(self) -> str:
        return f"DeepSpeedStrategy(zero_stage={self.zero_stage}, device={self.device}, world_size={self.world_size}, precision={self.precision.mode!r})"


def _to_universal(source: Path, target: Path) -> None:
    """DeepSpeed's ``ds_to_universal`` of the engine checkpoint folder `source` into `target` (its output kept quiet),
    with the state a plain model's checkpoint lacks injected (``--inject_missing_state``)."""
    import argparse
    import shutil

    from deepspeed.checkpoint import ds_to_universal

    shutil.rmtree(target.parent, ignore_errors=True)  # (a conversion a crash left behind)
    args = argparse.Namespace(input_folder=str(source), output_folder=str(target), num_extract_workers=1, num_merge_workers=1,
                              keep_temp_folder=False, strict=True, inject_missing_state=True)
    with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):
        ds_to_universal.main(args)


def _owned(names: list[str], rank: int) -> list[str]:
    """The engine's files (`names`) that process `rank` accounts for: those of its own rank (``..._pp_rank_<rank>_...``),
    and on process 0 those of no rank (the model states, the recovery scripts)."""
    mine, anyone = re.compile(rf"(^|_)pp_rank_{rank}_"), re.compile(r"(^|_)pp_rank_\d+_")
    return [name for name in names if mine.search(Path(name).name) or (rank == 0 and not anyone.search(Path(name).name))]


def _reads(name: str, rank: int) -> bool:
    """Whether the engine of process `rank` reads its file `name` when it loads (ZeRO): its own partitions and the
    model states, which every process reads."""
    base = Path(name).name
    return base.endswith(".pt") and (re.search(rf"(^|_)pp_rank_{rank}_", base) is not None or re.search(r"(^|_)pp_rank_\d+_", base) is None)


class _ThroughCheckpointIO:
    """DeepSpeed's checkpoint engine (``engine.checkpoint_engine``, which opens every file the engine saves and
    loads), with its files going through ours: what it saves through `writer` (hashed in the pass that writes it,
    flushed with the checkpoint's other files; torch's zip format), what it loads through `reader` (parsed weights-only
    and hashed in that pass, returned once checked against the manifest; `load`). Everything else is the engine's."""

    def __init__(self, inner: Any, writer: checkpoint_io.CheckpointWriter | None, reader: checkpoint_io.CheckpointReader | None) -> None:
        self._inner, self._writer, self._reader = inner, writer, reader

    def save(self, state_dict: Any, path: str) -> None:
        name = _inside(path, self._writer.staging) if self._writer is not None else None
        if name is None:
            self._inner.save(state_dict, path)
        else:
            self._writer.save_torch(name, state_dict)  # type: ignore[union-attr]

    def load(self, path: str, map_location: Any = None) -> Any:
        """The file at `path`, checked: parsed without running anything (tensors, plain containers and the few
        DeepSpeed classes its files hold, `_saved_classes`) and hashed in that pass, returned once the digest
        matched; a file holding other objects (another DeepSpeed version's, a config's) is checked whole first, then
        unpickled as DeepSpeed does."""
        reader = self._reader
        name = _inside(path, reader.directory) if reader is not None else None
        if reader is None or name is None:
            return self._inner.load(path, map_location=map_location)
        try:
            return reader.torch_load(name, map_location, allowed=_saved_classes())
        except checkpoint_io.CheckpointError as err:
            if not isinstance(err.__cause__, pickle.UnpicklingError):  # (damage: refused by the check above)
                raise
        data: Any = MemoryFile(reader.read(name))  # intact, with other objects: DeepSpeed's own pickles, checked whole
        return torch.load(data, map_location=map_location, weights_only=False)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _saved_classes() -> list[type]:
    """The classes of DeepSpeed's own that its ZeRO checkpoint files hold (0.19: the optimizer files' loss scaler,
    ZeRO stage and parameter fragment addresses), which torch's weights-only unpickler may build (from their saved
    attributes; the stage from its value)."""
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, ZeroStageEnum, fragment_address]


def _inside(path: str, folder: Path) -> str | None:
    """`path` relative to `folder` (POSIX), or None when it lies elsewhere."""
    try:
        return Path(os.path.abspath(path)).relative_to(folder.absolute()).as_posix()
    except ValueError:
        return None


@contextlib.contextmanager
def _through(engine: Any, *, writer: checkpoint_io.CheckpointWriter | None = None, reader: checkpoint_io.CheckpointReader | None = None) -> Iterator[None]:
    """Route the engine's checkpoint files through `writer` / `reader` (`_ThroughCheckpointIO`) inside the block."""
    own = engine.checkpoint_engine
    if (writer is None and reader is None) or own is None:
        yield
        return
    engine.checkpoint_engine = _ThroughCheckpointIO(own, writer, reader)
    try:
        yield
    finally:
        engine.checkpoint_engine = own


def _local_partition(value: torch.Tensor, param: nn.Parameter) -> torch.Tensor:
    """This process's slice of a ZeRO-3 parameter's full `value`: as long as its partition, zero-padded at the end."""
    size = param.ds_tensor.numel()  # type: ignore[attr-defined]
    start = size * dist.get_rank(group=param.ds_process_group)  # type: ignore[attr-defined]
    piece = value.flatten()[start : start + size]
    return torch.cat([piece, piece.new_zeros(size - piece.numel())])


@contextlib.contextmanager
def _gathered_without_hooks(engine: Any, params: list[nn.Parameter]) -> Iterator[None]:
    """ZeRO-3: all-gather every parameter once and run forwards without the engine's per-module gather hooks.

    A forward under stage 3 all-gathers each submodule's parameters (a collective), which a process that has
    finished its evaluation batches would never join; with the parameters gathered once and the hooks lifted,
    forwards are local. The hooks are put back (and the parameters re-partitioned) on exit.
    """
    import deepspeed

    offload = getattr(engine.optimizer, "parameter_offload", engine.optimizer)
    with deepspeed.zero.GatheredParameters(params):
        offload._remove_module_hooks()
        try:
            yield
        finally:
            offload.setup_zero_stage3_hooks()
