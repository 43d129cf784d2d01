"""`TrainModule.to_torchscript` and `TrainModule.to_onnx`: Lightning's export methods.

Both export the module in eval mode and restore its mode after; an input given neither as an argument nor as the
module's ``example_input_array`` is an error. The input passes through the module's batch-transfer hooks to its
device first, as in Lightning.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from trainer.fit.module import TrainModule


def _example(module: TrainModule, given: Any, what: str) -> Any:
    example = module.example_input_array if given is None else given
    if example is None:
        raise ValueError(f"{what} needs an input: pass one, or set self.example_input_array in {type(module).__name__}.__init__")
    example = module.on_before_batch_transfer(example, 0)
    example = module.transfer_batch_to_device(example, module.device, 0)
    return module.on_after_batch_transfer(example, 0)


def to_torchscript(module: TrainModule, file_path: str | os.PathLike[str] | None, method: str, example_inputs: Any, **kwargs: Any) -> Any:
    """`module` scripted (``method="script"``) or traced (``"trace"``, on `example_inputs` or its ``example_input_array``),
    saved with ``torch.jit.save`` to `file_path` when given."""
    if method not in ("script", "trace"):
        raise ValueError(f"The 'method' parameter only supports 'script' or 'trace', but value given was: {method}")
    training = module.training
    module.jit_is_scripting = True
    try:
        if method == "script":
            scripted = torch.jit.script(module.eval(), **kwargs)
        else:
            inputs = _example(module, example_inputs, "to_torchscript(method='trace')")
            scripted = torch.jit.trace(module.eval(), example_inputs=inputs, **kwargs)
    finally:
        module.jit_is_scripting = False
        module.train(training)
    if file_path is not None:
        torch.jit.save(scripted, os.fspath(file_path))
    return scripted


def to_onnx(module: TrainModule, file_path: str | os.PathLike[str] | None, input_sample: Any, **kwargs: Any) -> Any:
    """Export `module` to `file_path` (None: no file) with ``torch.onnx.export`` on `input_sample` (or its ``example_input_array``)."""
    try:
        import onnx  # noqa: F401  (torch's exporter writes through it)
    except ImportError as err:
        raise ModuleNotFoundError(
            f"{type(module).__name__}.to_onnx() requires the onnx package; install it with `pip install onnx` (and onnxscript)"
        ) from err
    inputs = _example(module, input_sample, "to_onnx")
    training = module.training
    try:
        return torch.onnx.export(module.eval(), inputs, None if file_path is None else os.fspath(file_path), **kwargs)
    finally:
        module.train(training)
