"""No `Any` at the seams: a parameter that names an object of the project or of torch (a trainer, a module, a strategy,
an optimizer, a mesh, ...) says which type it takes, in the three packages, read from the source with `ast` (nothing is
imported).

A parameter with one of `SEAM_NAMES` annotated ``Any`` (or ``Any | None``, ``Optional[Any]``, ``typing.Any``) fails the
scan unless `ALLOWED_ANY` lists it, as ``"path:function:param"`` (the function by its qualified name,
``Class.method``) -> why it stays ``Any``. A function that duck-types its argument (``getattr``, ``hasattr``,
``isinstance`` over anything) takes ``object``; a listed parameter whose annotation gets a type must leave the list (a
test fails while an entry outlives its ``Any``).
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("strategies", "callbacks", "trainer")
SEAM_NAMES = frozenset({
    "trainer", "module", "pl_module", "strategy", "accelerator", "optimizer", "datamodule", "logger", "tracker", "callback",
    "precision", "device_mesh", "mesh", "scheduler", "lr_scheduler", "dataloader", "engine", "model",
})

_DEEPSPEED_UNTYPED = (
    "a DeepSpeedEngine: DeepSpeed ships no type information (no py.typed) and mypy runs with ignore_missing_imports, so "
    "`deepspeed.DeepSpeedEngine` would be Any under another name; the engine is an optional dependency's object"
)
ALLOWED_ANY: dict[str, str] = {
    "strategies/deepspeed.py:_through:engine": _DEEPSPEED_UNTYPED,
    "strategies/deepspeed.py:_gathered_without_hooks:engine": _DEEPSPEED_UNTYPED,
    "trainer/planning/measure.py:_name_zero_state:engine": _DEEPSPEED_UNTYPED,
    "trainer/accelerator/dummies.py:EngineScheduler.__init__:scheduler": (
        "the schedule a DeepSpeed engine built (engine.lr_scheduler: deepspeed.runtime.lr_schedules' WarmupLR and friends, "
        "or what lr_scheduler_callable returned): no torch LRScheduler, untyped, used through get_last_lr/state_dict/"
        "load_state_dict and __getattr__"
    ),
    "trainer/accelerator/wrappers.py:PreparedScheduler.__init__:scheduler": (
        "a torch LRScheduler/ReduceLROnPlateau or the EngineScheduler stand-in, whose private _step_count it bumps as "
        "Accelerate's AcceleratedScheduler does; typed as that union, mypy refuses the write through EngineScheduler's "
        "__getattr__, and torch's get_last_lr gives list[float | Tensor] where this wrapper promises list[float]"
    ),
    "trainer/fit/module.py:TrainModule.lr_scheduler_step:scheduler": (
        "duck-typed: any object with step() (or step(metric)), as _scheduler_config and Lightning accept; the hook exists "
        "so that an override can step a scheduler with another step signature (LRSchedulerConfig.scheduler is Any too)"
    ),
}


def _is_any(annotation: ast.expr) -> bool:
    """``Any``, ``typing.Any``, ``Any | None``, ``None | Any``, ``Optional[Any]``, or one of them as a string."""
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        try:
            return _is_any(ast.parse(annotation.value, mode="eval").body)
        except SyntaxError:
            return False
    if isinstance(annotation, ast.Name):
        return annotation.id == "Any"
    if isinstance(annotation, ast.Attribute):
        return annotation.attr == "Any" and isinstance(annotation.value, ast.Name) and annotation.value.id in ("typing", "t")
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        sides = (annotation.left, annotation.right)
        return any(_is_any(side) for side in sides) and all(_is_any(side) or _is_none(side) for side in sides)
    if isinstance(annotation, ast.Subscript):
        base = annotation.value
        optional = (isinstance(base, ast.Name) and base.id == "Optional") or (isinstance(base, ast.Attribute) and base.attr == "Optional")
        return optional and _is_any(annotation.slice)
    return False


def _is_none(node: ast.expr) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def scan(relative: str, source: str) -> list[tuple[str, int]]:
    """``("path:function:param", line)`` of each parameter of `SEAM_NAMES` annotated `Any` in `source`."""
    found: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = child.args
                params = [*args.posonlyargs, *args.args, *args.kwonlyargs, *(a for a in (args.vararg, args.kwarg) if a is not None)]
                found.extend((f"{relative}:{prefix}{child.name}:{a.arg}", a.lineno) for a in params
                             if a.arg in SEAM_NAMES and a.annotation is not None and _is_any(a.annotation))
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source, relative), "")
    return found


@cache
def _found() -> dict[str, int]:
    found: dict[str, int] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            found.update(scan(relative, path.read_text(encoding="utf-8")))
    return found


def test_no_seam_parameter_is_any() -> None:
    new = [f"{key.split(':')[0]}:{line}: {key}" for key, line in _found().items() if key not in ALLOWED_ANY]
    assert not new, (
        "parameters that name a trainer, module, strategy, optimizer, ... are annotated Any; give them their type "
        "(TrainerView in callbacks, Trainer in trainer/fit, TrainModule, Strategy, DataModule | None, DeviceMesh, ...; "
        "`object` where the function duck-types its argument), or list them in ALLOWED_ANY with the reason:\n  "
        + "\n  ".join(new)
    )


def test_allowed_any_entries_are_still_needed() -> None:
    stale = sorted(set(ALLOWED_ANY) - set(_found()))
    assert not stale, f"remove {stale} from ALLOWED_ANY: the parameter is typed now, renamed, or gone"


def test_every_allowed_any_gives_a_reason() -> None:
    assert all(len(reason.split()) >= 8 for reason in ALLOWED_ANY.values())


def test_the_scan_catches_any_at_a_seam() -> None:
    source = '''\
import typing
from typing import Any, Optional


def plain(trainer: Any, batch: Any, module: object) -> None: ...


def optional(optimizer: Any | None = None, *, strategy: Optional[Any] = None, mesh: None | Any = None) -> None: ...


def spelled(model: typing.Any, engine: "Any", scheduler: "Any | None" = None) -> None: ...


def typed(trainer: TrainerView, module: TrainModule | None, datamodule: Any | int, logger: list[Any]) -> None: ...


class Hooks:
    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        def inner(callback: Any, *dataloader: Any, **precision: Any) -> None: ...

    async def later(self, tracker: Any) -> None: ...
'''
    assert scan("m.py", source) == [
        ("m.py:plain:trainer", 5),
        ("m.py:optional:optimizer", 8),
        ("m.py:optional:strategy", 8),
        ("m.py:optional:mesh", 8),
        ("m.py:spelled:model", 11),
        ("m.py:spelled:engine", 11),
        ("m.py:spelled:scheduler", 11),
        ("m.py:Hooks.on_fit_start:trainer", 18),
        ("m.py:Hooks.on_fit_start:pl_module", 18),
        ("m.py:Hooks.on_fit_start.inner:callback", 19),
        ("m.py:Hooks.on_fit_start.inner:dataloader", 19),
        ("m.py:Hooks.on_fit_start.inner:precision", 19),
        ("m.py:Hooks.later:tracker", 21),
    ]
