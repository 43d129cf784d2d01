"""Trainwright: a PyTorch training framework with two faces over one core.

* ``Trainer`` + ``TrainModule`` — the Lightning-style face.
* ``Accelerator`` — the Accelerate-style face: keep your loop.

Names are imported on first use so that ``import trainer`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Accelerator": "trainer.accelerator",
    "ProjectConfiguration": "trainer.accelerator.config",
    "DataLoaderConfiguration": "trainer.accelerator.config",
    "GradientAccumulationPlugin": "trainer.accelerator.config",
    "DistributedType": "trainer.accelerator.config",
    "DistributedDataParallelKwargs": "trainer.accelerator.config",
    "DDPKwargs": "trainer.accelerator.config",
    "DeepSpeedPlugin": "trainer.accelerator.config",
    "FullyShardedDataParallelPlugin": "trainer.accelerator.config",
    "TorchDynamoPlugin": "trainer.accelerator.config",
    "ParallelismConfig": "trainer.accelerator.parallelism",
    "AutocastKwargs": "trainer.accelerator.kwargs",
    "DDPCommunicationHookType": "trainer.accelerator.kwargs",
    "GradScalerKwargs": "trainer.accelerator.kwargs",
    "InitProcessGroupKwargs": "trainer.accelerator.kwargs",
    "ProfileKwargs": "trainer.accelerator.kwargs",
    "find_executable_batch_size": "trainer.utils",
    "synchronize_rng_states": "trainer.utils",
    "is_rich_available": "trainer.utils",
    "skip_first_batches": "trainer.data_loader",
    "PartialState": "trainer.accelerator.layout",
    "AcceleratorState": "trainer.accelerator.layout",
    "Trainer": "trainer.fit.trainer",
    "TrainModule": "trainer.fit.module",
    "DataModule": "trainer.fit.datamodule",
    "LoggerType": "callbacks.trackers",
    "GeneralTracker": "callbacks.trackers",
    "notebook_launcher": "trainer.launchers",
    "debug_launcher": "trainer.launchers",
    "init_empty_weights": "trainer.big_modeling",
    "init_on_device": "trainer.big_modeling",
    "set_seed": "trainer.utils",
    "seed_everything": "trainer.utils",
    "Callback": "callbacks.base",
    "convert_lightning_checkpoint": "strategies.lightning_checkpoint",
}

# Lightning's subpackages under the rename (``import trainer as pl; pl.strategies.DDPStrategy``): see
# trainer/lightning_api.py. ``callbacks`` and ``loggers`` are the top-level packages the rename table names.
_SUBMODULES = {
    "strategies": "trainer.strategies",
    "plugins": "trainer.plugins",
    "utilities": "trainer.utilities",
    "accelerators": "trainer.accelerators",
    "core": "trainer.core",
    "trainer": "trainer.trainer",
    "profilers": "trainer.profilers",
    "tuner": "trainer.tuner",
    "callbacks": "callbacks",
    "loggers": "callbacks.trackers",
}

__all__ = [*sorted(_EXPORTS), "__version__"]


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        value = importlib.import_module(_SUBMODULES[name])
    elif name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    else:
        # lazy: `import trainer` stays cheap; Accelerate names not provided come with their reason (trainer.unsupported)
        from trainer.unsupported import unsupported_names

        return unsupported_names(__name__)(name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return [*__all__, *_SUBMODULES]
