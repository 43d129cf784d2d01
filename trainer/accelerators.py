"""``lightning.pytorch.accelerators`` under the rename: none is offered. The device is a string,
``Trainer(accelerator="auto"|"cpu"|"gpu"|"cuda"|"mps"|"tpu")``, and ``devices`` a process count; `trainer.Accelerator`
is the Accelerate-style face (keep your own loop), not Lightning's accelerator base class."""

from __future__ import annotations

from trainer.lightning_api import not_offered

_MODULE = "lightning.pytorch.accelerators"


def _device(name: str) -> str:
    return (f"pass Trainer(accelerator={name!r}) (a string; devices= is the process count); torch.{'cuda' if name != 'mps' else 'backends.mps'}"
            ".is_available() tells whether the device exists")


Accelerator = not_offered(
    "Accelerator", _MODULE,
    "accelerators are strings here (Trainer(accelerator='cpu'|'gpu'|'cuda'|'mps'|'tpu')); trainer.Accelerator is the "
    "Accelerate-style face, not an accelerator base class",
    module=__name__,
)
CPUAccelerator = not_offered("CPUAccelerator", _MODULE, "pass Trainer(accelerator='cpu') (a string)", module=__name__)
CUDAAccelerator = not_offered("CUDAAccelerator", _MODULE, _device("cuda"), module=__name__)
MPSAccelerator = not_offered("MPSAccelerator", _MODULE, _device("mps"), module=__name__)
XLAAccelerator = not_offered("XLAAccelerator", _MODULE, "pass Trainer(accelerator='tpu') (it runs strategy='xla')", module=__name__)
find_usable_cuda_devices = not_offered(
    "find_usable_cuda_devices", _MODULE,
    "devices= is a process count here (a list of GPU ids is refused); choose the GPUs with CUDA_VISIBLE_DEVICES",
    module=__name__,
)

__all__ = ["Accelerator", "CPUAccelerator", "CUDAAccelerator", "MPSAccelerator", "XLAAccelerator", "find_usable_cuda_devices"]
