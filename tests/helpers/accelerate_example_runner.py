"""Run one of Accelerate's example scripts in this process and record what its model saw, for comparing frameworks.

Usage (one process, or each process of ``torchrun`` / ``trainer launch``)::

    python tests/helpers/accelerate_example_runner.py --framework trainer --trace DIR SCRIPT [script args...]

``--framework trainer`` runs the script with its imports renamed (``accelerate`` -> ``trainer``, nothing else);
``accelerate`` runs it as it is. ``--without wandb,aim`` makes those packages look not installed to the run
(``import`` fails, ``importlib.util.find_spec`` finds nothing), so ``log_with="all"`` picks the same trackers everywhere. Every forward of the top-level model (a ``*For*`` transformers class, found through
torch's global forward hook, so nothing in either framework is touched) appends one JSON line to
``DIR/rank<RANK>.jsonl``: whether it trained, a digest of the batch's tensors, their shapes and the loss.
``datasets``/``evaluate`` are `tests.helpers.offline_hub` and the hub model is the tiny local one
(`tests.helpers.accelerate_examples.build_offline_hub`); the caller sets up ``PYTHONPATH`` and the environment.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # (the repository root, for `tests.helpers`)

from tests.helpers.accelerate_examples import accelerate_to_trainer


def _digest(kwargs: dict[str, Any]) -> tuple[str, dict[str, list[int]]]:
    h = hashlib.sha1()
    shapes = {}
    for name in sorted(kwargs):
        value = kwargs[name]
        if isinstance(value, torch.Tensor):
            h.update(name.encode())
            h.update(value.detach().cpu().contiguous().numpy().tobytes())
            shapes[name] = list(value.shape)
    return h.hexdigest()[:16], shapes


class _WholePrints:
    """Standard output that reaches the pipe one whole print at a time.

    ``print(x)`` writes ``x`` and then ``"\\n"`` in two calls; between them another process's print can land in the middle
    of a line (seen with multi-line tensor reprs). This keeps what was written until it ends a line, then writes it in one
    call (atomic on a pipe up to its buffer size), so the processes' outputs interleave by whole prints.
    """

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._pending: list[str] = []

    def write(self, text: str) -> int:
        self._pending.append(text)
        if text.endswith("\n"):
            self.flush()
        return len(text)

    def flush(self) -> None:
        if self._pending:
            self._stream.write("".join(self._pending))
            self._pending.clear()
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--framework", choices=["accelerate", "trainer"], required=True)
    parser.add_argument("--trace", required=True)
    parser.add_argument("--without", default="", help="comma-separated packages this run sees as not installed")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    opts = parser.parse_args()
    sys.stdout = _WholePrints(sys.stdout)  # processes interleave by whole print only
    trace = Path(opts.trace)
    trace.mkdir(parents=True, exist_ok=True)
    out = open(trace / f"rank{os.environ.get('RANK', '0')}.jsonl", "w")  # noqa: SIM115 (open for the whole run)

    def record(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
        if "For" not in type(module).__name__ or not type(module).__module__.startswith("transformers."):
            return
        batch, shapes = _digest(kwargs)
        loss = getattr(output, "loss", None)
        out.write(json.dumps({"train": module.training, "batch": batch, "shapes": shapes,
                              "loss": None if loss is None else float(loss)}) + "\n")
        out.flush()

    for name in filter(None, opts.without.split(",")):  # `import name` fails and importlib.util.find_spec(name) is None
        sys.modules[name] = None  # type: ignore[assignment]
    torch.nn.modules.module.register_module_forward_hook(record, with_kwargs=True)
    source = Path(opts.script).read_text()
    if opts.framework == "trainer":
        source = accelerate_to_trainer(source)
    sys.argv = [opts.script, *opts.args]
    sys.path.insert(0, str(Path(opts.script).resolve().parent))
    try:
        exec(compile(source, opts.script, "exec"), {"__name__": "__main__", "__file__": opts.script, "__builtins__": __builtins__})
    finally:
        out.close()


if __name__ == "__main__":
    main()
