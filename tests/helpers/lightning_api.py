"""Lightning 2.6's public names per module, as recorded in ``tests/fixtures/lightning_api.json`` ("modules").

Run it where Lightning is installed (a side virtual environment; never in the project's) to refresh the record::

    /path/to/venv-with-lightning/bin/python tests/helpers/lightning_api.py > /tmp/modules.json

A module's names are its ``__all__``; for the submodules without one, the names listed in `CURATED` (what Lightning
scripts import from them). `tests/unit/test_lightning_api.py` compares the record with Lightning when it is importable.
"""

from __future__ import annotations

import importlib
import json
import sys

PACKAGES = (  # the modules with an ``__all__``
    "lightning", "lightning.pytorch", "lightning.pytorch.strategies", "lightning.pytorch.plugins",
    "lightning.pytorch.plugins.precision", "lightning.pytorch.plugins.io", "lightning.pytorch.utilities",
    "lightning.pytorch.accelerators", "lightning.pytorch.loggers", "lightning.pytorch.core", "lightning.pytorch.trainer",
    "lightning.pytorch.callbacks", "lightning.pytorch.profilers",
)
CURATED = {  # submodules without ``__all__``: the names scripts import from them
    "lightning.pytorch.plugins.environments": [
        "ClusterEnvironment", "KubeflowEnvironment", "LSFEnvironment", "LightningEnvironment", "MPIEnvironment",
        "SLURMEnvironment", "TorchElasticEnvironment", "XLAEnvironment",
    ],
    "lightning.pytorch.utilities.rank_zero": [
        "LightningDeprecationWarning", "rank_prefixed_message", "rank_zero_debug", "rank_zero_deprecation", "rank_zero_info",
        "rank_zero_only", "rank_zero_warn",
    ],
    "lightning.pytorch.utilities.combined_loader": ["CombinedLoader"],
    "lightning.pytorch.cli": [
        "ArgsType", "LRSchedulerCallable", "LRSchedulerTypeTuple", "LRSchedulerTypeUnion", "LightningArgumentParser", "LightningCLI",
        "OptimizerCallable", "ReduceLROnPlateau", "SaveConfigCallback", "instantiate_class",
    ],
    "lightning.pytorch.tuner": ["Tuner"],
    "lightning.pytorch.utilities.seed": ["isolate_rng"],
    "lightning.pytorch.utilities.grads": ["grad_norm"],
    "lightning.pytorch.utilities.exceptions": ["MisconfigurationException"],
    "lightning.pytorch.utilities.deepspeed": ["convert_zero_checkpoint_to_fp32_state_dict"],
    "lightning.pytorch.utilities.types": [
        "EVAL_DATALOADERS", "LRSchedulerConfig", "LRSchedulerConfigType", "LRSchedulerPLType", "LRSchedulerType",
        "LRSchedulerTypeTuple", "LRSchedulerTypeUnion", "OptimizerConfig", "OptimizerLRScheduler", "OptimizerLRSchedulerConfig",
        "STEP_OUTPUT", "TRAIN_DATALOADERS",
    ],
}


def public_names() -> dict[str, list[str]]:
    """`PACKAGES`' ``__all__`` and `CURATED`'s names, checked against the installed Lightning."""
    names: dict[str, list[str]] = {}
    for path in PACKAGES:
        names[path] = sorted(n for n in importlib.import_module(path).__all__ if not n.startswith("__"))
    for path, listed in CURATED.items():
        module = importlib.import_module(path)
        absent = [n for n in listed if not hasattr(module, n)]
        if absent:
            raise SystemExit(f"{path} has no {absent}: update CURATED")
        names[path] = sorted(listed)
    return names


if __name__ == "__main__":
    json.dump({"lightning_version": importlib.import_module("lightning").__version__, "modules": public_names()}, sys.stdout, indent=1)
