"""``lightning.pytorch.utilities.seed`` (and fabric's) under the rename: `isolate_rng` and `seed_everything`."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

from trainer.utils import seed_everything


@contextmanager
def isolate_rng(include_cuda: bool = True) -> Iterator[None]:
    """Restore the python, numpy and torch random states (CUDA's too, unless `include_cuda` is False) on exit."""
    python, numpy, cpu = random.getstate(), np.random.get_state(), torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if include_cuda and torch.cuda.is_available() else None
    try:
        yield
    finally:
        random.setstate(python)
        np.random.set_state(numpy)
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


__all__ = ["isolate_rng", "seed_everything"]
