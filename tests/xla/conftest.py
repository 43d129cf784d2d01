"""The XLA tests run on torch_xla's CPU runtime, in their own environment (``bash tests/xla/run.sh``).

Where torch_xla is importable, the runtime starts here, at collection, before any test runs a backward: torch's
autograd engine counts each device type's devices once, at the first backward of the process, and a CPU backward
before the XLA runtime started breaks every XLA backward after it (pytorch/xla#4174).
"""

from __future__ import annotations

import importlib.util
import os

HAVE_XLA = importlib.util.find_spec("torch_xla") is not None
SKIP_REASON = "needs torch_xla (torch 2.9 + torch_xla 2.9, its own environment): run `bash tests/xla/run.sh`"

if HAVE_XLA:
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    import torch_xla

    torch_xla.device()
