"""One process, one device."""

from __future__ import annotations

import torch

from strategies.base import Strategy, best_device
from strategies.environment import ClusterEnvironment


class SingleDeviceStrategy(Strategy):
    """Runs on the best available device (CUDA, MPS, then CPU), or CPU with ``cpu=True``."""

    name = "single"

    def __init__(
        self,
        *,
        cluster: ClusterEnvironment | None = None,
        device: torch.device | str | None = None,
        cpu: bool = False,
        precision: str = "no",
        timeout: float | None = None,
    ) -> None:
        cluster = ClusterEnvironment() if cluster is None else cluster
        if cluster.is_distributed:
            raise RuntimeError(
                f"strategy='single' cannot run the {cluster.world_size} processes this environment started "
                f"(detected from {cluster.source}); use strategy='ddp' (or 'auto'), or launch a single process"
            )
        super().__init__(cluster=cluster, device=best_device(cpu=cpu) if device is None else torch.device(device), precision=precision)
        if self.device.type == "cuda" and self.device.index is not None:
            torch.cuda.set_device(self.device)
