"""Where are we running? Read the launcher's environment variables into one small record.

Sources, in order: a Ray Train worker, torchrun / torch elastic (and our own launcher, which runs on it), SLURM,
OpenMPI, MPICH / Intel MPI / PMI. If any of them says there are N > 1 processes, the run is distributed with N
processes: a strategy that cannot do that must raise, never fall back to one process.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_PG_TIMEOUT = 300.0


@dataclass(frozen=True)
class ClusterEnvironment:
    """The process layout the environment describes."""

    world_size: int = 1
    rank: int = 0
    local_rank: int = 0
    local_world_size: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    source: str = "none"
    device: str | None = None  # the device the launcher assigned this process (Ray Train's), if it did

    @property
    def several_machines(self) -> bool:
        return self.world_size > self.local_world_size

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    value = env.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer; fix or unset it") from None


def _slurm_master(env: Mapping[str, str]) -> str:
    nodelist = env.get("SLURM_NODELIST") or env.get("SLURM_JOB_NODELIST") or "127.0.0.1"
    first = nodelist.split(",")[0]
    if "[" in first:  # node[01-04] -> node01
        prefix, rest = first.split("[", 1)
        first = prefix + rest.split("-")[0].split(",")[0].rstrip("]")
    return first


def _torch_variables(env: Mapping[str, str], source: str, *, node_rank: int, device: str | None = None) -> ClusterEnvironment:
    """The layout torch's variables describe (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
    ``MASTER_ADDR``/``MASTER_PORT``), set by torchrun or by Ray Train."""
    world = _int(env, "WORLD_SIZE", 1)
    return ClusterEnvironment(
        world_size=world,
        rank=_int(env, "RANK", 0),
        local_rank=_int(env, "LOCAL_RANK", 0),
        local_world_size=_int(env, "LOCAL_WORLD_SIZE", world),
        node_rank=node_rank,
        master_addr=env.get("MASTER_ADDR", "127.0.0.1"),
        master_port=_int(env, "MASTER_PORT", 29500),
        source=source,
        device=device,
    )


def detect_environment(env: Mapping[str, str] | None = None) -> ClusterEnvironment:
    """Detect the process layout from environment variables.

    Args:
        env: the environment to read (``os.environ`` by default).

    Returns:
        A `ClusterEnvironment`; ``source`` names where it came from (``"ray"``, ``"torchrun"``, ``"trainwright"``,
        ``"slurm"``, ``"openmpi"``, ``"pmi"`` or ``"none"``).
    """
    env = os.environ if env is None else env
    addr = env.get("MASTER_ADDR", "127.0.0.1")
    port = _int(env, "MASTER_PORT", 29500)
    if is_ray_train_worker(env):
        return _torch_variables(env, "ray", node_rank=_int(env, "NODE_RANK", 0), device=env.get("ACCELERATE_TORCH_DEVICE") or None)
    if "WORLD_SIZE" in env and "RANK" in env:
        source = "trainwright" if env.get("TRAINWRIGHT_LAUNCHED") == "1" else "torchrun"
        return _torch_variables(env, source, node_rank=_int(env, "GROUP_RANK", 0))
    if "SLURM_NTASKS" in env and "SLURM_PROCID" in env and env.get("SLURM_JOB_NAME") not in ("bash", "interactive"):
        world = _int(env, "SLURM_NTASKS", 1)
        return ClusterEnvironment(
            world_size=world,
            rank=_int(env, "SLURM_PROCID", 0),
            local_rank=_int(env, "SLURM_LOCALID", 0),
            local_world_size=_int(env, "SLURM_NTASKS_PER_NODE", world),
            node_rank=_int(env, "SLURM_NODEID", 0),
            master_addr=env.get("MASTER_ADDR") or _slurm_master(env),
            master_port=port,
            source="slurm",
        )
    if "OMPI_COMM_WORLD_SIZE" in env:
        world = _int(env, "OMPI_COMM_WORLD_SIZE", 1)
        return ClusterEnvironment(
            world_size=world,
            rank=_int(env, "OMPI_COMM_WORLD_RANK", 0),
            local_rank=_int(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0),
            local_world_size=_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", world),
            node_rank=_int(env, "OMPI_COMM_WORLD_NODE_RANK", 0),
            master_addr=addr,
            master_port=port,
            source="openmpi",
        )
    if "PMI_SIZE" in env or "PMIX_SIZE" in env:
        world = _int(env, "PMI_SIZE", _int(env, "PMIX_SIZE", 1))
        return ClusterEnvironment(
            world_size=world,
            rank=_int(env, "PMI_RANK", _int(env, "PMIX_RANK", 0)),
            local_rank=_int(env, "MPI_LOCALRANKID", _int(env, "PALS_LOCAL_RANKID", 0)),
            local_world_size=_int(env, "MPI_LOCALNRANKS", world),
            master_addr=addr,
            master_port=port,
            source="pmi",
        )
    return ClusterEnvironment()


def is_ray_train_worker(env: Mapping[str, str] | None = None) -> bool:
    """Whether this is a worker of a Ray Train ``TorchTrainer``: a Ray worker process (``RAY_RAYLET_PID``) given
    torch's variables by Ray Train (``RANK``, ``WORLD_SIZE``, ``NODE_RANK``; torchrun sets ``GROUP_RANK`` instead),
    not a torchrun started inside a Ray task. Reads variables only: Ray is not imported."""
    env = os.environ if env is None else env
    return ("RAY_RAYLET_PID" in env and "NODE_RANK" in env and "WORLD_SIZE" in env and "RANK" in env
            and "TORCHELASTIC_RUN_ID" not in env and "GROUP_RANK" not in env)


def env_setting(name: str, default: str | None = None) -> str | None:
    """Read a ``TRAINWRIGHT_<NAME>`` setting passed down by the launcher."""
    value = os.environ.get(f"TRAINWRIGHT_{name}")
    return default if value in (None, "") else value


def env_flag(name: str) -> bool | None:
    value = env_setting(name)
    if value is None:
        return None
    return value.strip().lower() in ("1", "true", "yes", "on")


def process_group_timeout(explicit: float | None = None) -> float:
    """The process-group timeout in seconds: explicit > ``TRAINWRIGHT_PG_TIMEOUT`` > 300 s."""
    if explicit is not None:
        value = float(explicit)
    else:
        raw = env_setting("PG_TIMEOUT")
        value = float(raw) if raw is not None else DEFAULT_PG_TIMEOUT
    if value <= 0:
        raise ValueError(f"process_group_timeout={value!r} must be a positive number of seconds, e.g. 300")
    return value


def running_xla() -> Any:
    """``torch_xla.core.xla_model`` when this process has started torch_xla's runtime (it computes on an XLA device),
    else None. Cheap: imports and starts nothing."""
    xlac = getattr(sys.modules.get("torch_xla"), "_XLAC", None)
    if xlac is None or not xlac._xla_runtime_is_initialized():
        return None
    import torch_xla.core.xla_model as xm

    return xm
