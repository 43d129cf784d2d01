"""``lightning.pytorch.plugins.environments`` under the rename: none is offered. The cluster is detected from the
environment variables each launcher sets (torchrun/torchelastic, SLURM, ``trainer launch``, MPI-style ``RANK``/
``WORLD_SIZE``) by `strategies.environment.detect_environment`; no environment object is passed to the Trainer."""

from __future__ import annotations

from trainer.lightning_api import not_offered

_MODULE = "lightning.pytorch.plugins.environments"
_REASON = ("the cluster is detected from the launcher's environment variables (strategies.environment.detect_environment: "
           "torchrun, SLURM, `trainer launch`); start the processes with one of them instead of passing an environment object")

ClusterEnvironment = not_offered("ClusterEnvironment", _MODULE, _REASON, module=__name__)
KubeflowEnvironment = not_offered("KubeflowEnvironment", _MODULE, _REASON, module=__name__)
LightningEnvironment = not_offered("LightningEnvironment", _MODULE, _REASON, module=__name__)
LSFEnvironment = not_offered("LSFEnvironment", _MODULE, _REASON, module=__name__)
MPIEnvironment = not_offered("MPIEnvironment", _MODULE, _REASON, module=__name__)
SLURMEnvironment = not_offered("SLURMEnvironment", _MODULE, _REASON, module=__name__)
TorchElasticEnvironment = not_offered("TorchElasticEnvironment", _MODULE, _REASON, module=__name__)
XLAEnvironment = not_offered("XLAEnvironment", _MODULE, _REASON, module=__name__)

__all__ = [
    "ClusterEnvironment", "KubeflowEnvironment", "LSFEnvironment", "LightningEnvironment", "MPIEnvironment", "SLURMEnvironment",
    "TorchElasticEnvironment", "XLAEnvironment",
]
