"""The import layers of the three packages, read from the source with `ast` (nothing is imported).

From the bottom up::

    strategies            everything distributed; imports nothing from trainer or callbacks
    callbacks             the Callback API, built-ins and trackers; nothing from trainer.fit (the Trainer face) at run time:
                          a callback sees the trainer through what it is handed (a declared trainer view), so imports of
                          trainer.fit are for type checking only
    Accelerator face      every trainer module outside trainer/fit: trainer/accelerator/*, trainer/utils.py,
                          trainer/big_modeling.py, trainer/state.py, trainer/tracking.py, trainer/logging.py,
                          trainer/launchers.py, the CLI (trainer/cli/*, trainer/__main__.py) and the package front door
                          trainer/__init__.py (which names the Trainer lazily, as a string). It imports nothing from
                          trainer.fit or callbacks, except callbacks.trackers (Accelerate's GeneralTracker API, which
                          ``Accelerator(log_with=...)`` needs), and nothing it imports may import trainer.fit in turn
    trainer.fit           the Trainer face, on top: it may import anything
    Lightning's paths     trainer.strategies, trainer.plugins, trainer.utilities, trainer.accelerators, trainer.core,
                          trainer.trainer, trainer.tuner (`LIGHTNING_PATHS`, see trainer/lightning_api.py): thin re-exports for user
                          scripts, beside trainer.fit on top; no module of the project imports them (the front door
                          names them lazily, as strings), so ``trainer.strategies`` never stands in for ``strategies``

Function-level imports count as imports (they run when the function does); imports under ``if TYPE_CHECKING:`` do
not. Every function-level import of the project's own modules says why it is not at the top of its module, in a
``# lazy: <reason>`` comment on the import line or on the line just above it (one comment above a run of imports
covers the run): an optional dependency behind it, the import cost of ``import trainer`` / the CLI, or an import
cycle. One without such a reason (no cycle, and the module is loaded anyway) belongs at the top of its module.
Optional third-party packages (deepspeed, torch_xla, tqdm, ...) imported inside functions need no comment.

Nor does a module reach into another object's private attributes (``trainer._args``, ``finder._min_lr``): what crosses
a module boundary has a public name (see "private attributes" below, and `ALLOWED_PRIVATE_REACHES`).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("strategies", "callbacks", "trainer")
LIGHTNING_PATHS = ("trainer.strategies", "trainer.plugins", "trainer.utilities", "trainer.accelerators", "trainer.core",
                   "trainer.trainer", "trainer.lightning_api", "trainer.profilers", "trainer.tuner")
REASON = re.compile(r"#\s*lazy:\s*\S")

# Temporary exceptions, each (importing module, imported module) -> why; remove the entry with the import (a test fails
# while an entry outlives its import). An import across the layers, e.g.
# ("trainer.accelerator.accelerator", "trainer.fit.preemption"): "trigger_on_signals reads SIGNALS; moving down":
TEMPORARY_LAYER_EXCEPTIONS: dict[tuple[str, str], str] = {}
# Function-level imports without a reason, in files being rewritten: each should move to the top of its module.
_HOIST = "no cycle, and the module is loaded already when this one is imported: move the import to the top"
TEMPORARY_WITHOUT_REASON: dict[tuple[str, str], str] = {}
# Circles of modules being broken: a circle within one of these sets is let through (a test fails while an entry
# outlives its circle).
TEMPORARY_CIRCLES: set[frozenset[str]] = set()


@dataclass(frozen=True)
class Import:
    module: str  # the importing module
    path: str  # its file, relative to the repository
    line: int
    target: str  # the imported module (``from a import b`` names ``a.b`` when that is a module, else ``a``)
    in_function: bool
    type_checking: bool
    has_reason: bool

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.module} imports {self.target}"


@cache
def _files() -> dict[str, Path]:
    files = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:  # relative: from the importing module's package
        package = module.split(".") if is_package else module.split(".")[:-1]
        base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in _files() else base for alias in node.names]


@cache
def _imports(module: str) -> tuple[Import, ...]:
    path = _files()[module]
    return _scan(module, str(path.relative_to(ROOT)), path.read_text(encoding="utf-8"), path.name == "__init__.py")


def _scan(module: str, relative: str, source: str, is_package: bool) -> tuple[Import, ...]:
    comments = {tok.start[0]: tok.string for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT}
    lines = source.splitlines()
    found: list[tuple[ast.Import | ast.ImportFrom, bool, bool]] = []

    def visit(node: ast.AST, in_function: bool, type_checking: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    visit_one(stmt, in_function, True)
                for stmt in child.orelse:
                    visit_one(stmt, in_function, type_checking)
            else:
                visit_one(child, in_function, type_checking)

    def visit_one(node: ast.AST, in_function: bool, type_checking: bool) -> None:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append((node, in_function, type_checking))
        visit(node, in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)), type_checking)

    visit(ast.parse(source, relative), False, False)
    starts = {line: node.lineno for node, _, _ in found for line in range(node.lineno, (node.end_lineno or node.lineno) + 1)}

    def has_reason(node: ast.Import | ast.ImportFrom) -> bool:
        if any(REASON.search(comments.get(line, "")) for line in range(node.lineno, (node.end_lineno or node.lineno) + 1)):
            return True
        above = node.lineno - 1
        while above in starts:  # a run of imports shares the comment above it
            above = starts[above] - 1
        return above >= 1 and lines[above - 1].lstrip().startswith("#") and bool(REASON.search(comments.get(above, "")))

    return tuple(
        Import(module, relative, node.lineno, target, in_function, type_checking, has_reason(node))
        for node, in_function, type_checking in found
        for target in _targets(node, module, is_package)
    )


def _runtime_imports(modules: list[str]) -> list[Import]:
    return [imp for module in modules for imp in _imports(module) if not imp.type_checking and imp.target.split(".")[0] in PACKAGES]


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _lightning_path(module: str) -> bool:
    return any(_under(module, path) for path in LIGHTNING_PATHS)


def _accelerator_face() -> list[str]:
    return [m for m in _files() if _under(m, "trainer") and not _under(m, "trainer.fit") and not _lightning_path(m)]


def _allowed(imp: Import) -> bool:
    return (imp.module, imp.target) in TEMPORARY_LAYER_EXCEPTIONS


def _report(rule: str, offenders: list[Import]) -> str:
    return f"{rule}:\n  " + "\n  ".join(dict.fromkeys(map(str, offenders)))


def test_strategies_import_nothing_from_trainer_or_callbacks() -> None:
    modules = [m for m in _files() if _under(m, "strategies")]
    offenders = [imp for imp in _runtime_imports(modules) if _under(imp.target, "trainer") or _under(imp.target, "callbacks")]
    assert not offenders, _report("strategies is the bottom layer: move the shared piece into strategies", offenders)


def test_the_accelerator_face_imports_neither_the_trainer_nor_callbacks_except_trackers() -> None:
    offenders = [
        imp for imp in _runtime_imports(_accelerator_face())
        if (_under(imp.target, "trainer.fit") or (_under(imp.target, "callbacks") and not _under(imp.target, "callbacks.trackers")))
        and not _allowed(imp)
    ]
    assert not offenders, _report("the Accelerator face sits below trainer.fit and callbacks (callbacks.trackers aside): "
                                  "move the shared piece down into trainer/accelerator or strategies", offenders)


def test_callbacks_import_nothing_from_the_trainer_face_at_run_time() -> None:
    modules = [m for m in _files() if _under(m, "callbacks")]
    offenders = [imp for imp in _runtime_imports(modules) if _under(imp.target, "trainer.fit")]
    assert not offenders, _report("callbacks see the Trainer through the object they are handed; import trainer.fit only "
                                  "under `if TYPE_CHECKING:`, or move the shared piece down", offenders)


def test_nothing_the_accelerator_face_imports_reaches_the_trainer_face() -> None:
    """Transitively: the trackers, and whatever they import, load no trainer.fit module either."""
    files = _files()
    start = [*_accelerator_face(), *(m for m in files if _under(m, "callbacks.trackers"))]
    reached_from: dict[str, Import | None] = dict.fromkeys(start)
    todo = list(start)
    while todo:
        for imp in _runtime_imports([todo.pop()]):
            if _allowed(imp):
                continue
            parts = imp.target.split(".")
            for module in (".".join(parts[:i]) for i in range(1, len(parts) + 1)):  # a package's __init__ runs first
                if module in files and module not in reached_from:
                    reached_from[module] = imp
                    todo.append(module)
    offenders = [imp for module, imp in reached_from.items() if imp is not None and _under(module, "trainer.fit")]
    assert not offenders, _report("the Accelerator face loads trainer.fit through", offenders)


def test_nothing_imports_lightnings_paths() -> None:
    """Lightning's paths are for user scripts; inside the project `strategies` is the package, `trainer.strategies` its
    re-export (a module that imported the re-export would read as if it imported the package)."""
    offenders = [imp for imp in _runtime_imports([m for m in _files() if not _lightning_path(m)]) if _lightning_path(imp.target)]
    assert not offenders, _report("import from where the code lives (strategies, trainer.fit, ...), not from Lightning's "
                                  "paths (trainer.strategies, trainer.utilities, ...)", offenders)


def test_function_level_imports_of_our_modules_give_a_reason() -> None:
    offenders = [imp for imp in _runtime_imports(list(_files()))
                 if imp.in_function and not imp.has_reason and (imp.module, imp.target) not in TEMPORARY_WITHOUT_REASON]
    assert not offenders, _report("a function-level import of our own modules needs a '# lazy: <reason>' comment on its line "
                                  "or the line above (optional dependency, import cost, import cycle), or move it to the top", offenders)


def _import_graph(modules: set[str], imports: list[Import]) -> dict[str, list[str]]:
    """Module -> the modules it imports at run time (function-level imports included; ``from a import name`` is ``a``)."""
    graph: dict[str, list[str]] = {module: [] for module in modules}
    for imp in imports:
        target = imp.target
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != imp.module:
            graph[imp.module].append(target)
    return graph


def _circles(graph: dict[str, list[str]]) -> list[list[str]]:
    """The circles of `graph`: its strongly connected sets of two or more modules (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []
    for root in graph:
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        work = [(root, iter(graph[root]))]
        while work:
            node, targets = work[-1]
            target = next(targets, None)
            if target is not None:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    work.append((target, iter(graph[target])))
                elif target in stack:
                    low[node] = min(low[node], index[target])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                members = stack[stack.index(node):]
                del stack[stack.index(node):]
                if len(members) > 1:
                    circles.append(sorted(members))
    return circles


def test_no_circle_of_modules_even_through_function_level_imports() -> None:
    """A circle hidden behind a function-level import still ties its modules together (neither can be read, tested or
    moved alone); break it by moving the shared piece into a module both import."""
    files = _files()
    circles = _circles(_import_graph(set(files), _runtime_imports(list(files))))
    new = [members for members in circles if not any(set(members) <= allowed for allowed in TEMPORARY_CIRCLES)]
    assert not new, "circles of modules (each imports the next, some inside functions):\n  " + "\n  ".join(map(str, new))
    stale = [sorted(allowed) for allowed in TEMPORARY_CIRCLES if not any(set(members) <= allowed for members in circles)]
    assert not stale, f"remove {stale} from TEMPORARY_CIRCLES: the circle is broken"


def test_the_circle_finder_counts_function_level_imports_but_not_type_checking_ones() -> None:
    sources = {
        "strategies.a": "import strategies.b\n",
        "strategies.b": "def f():\n    import strategies.c  # lazy: x\n",
        "strategies.c": "from strategies.a import x\nfrom strategies.d import y\n",
        "strategies.d": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import strategies.c\n",
    }
    imports = [imp for module, source in sources.items() for imp in _scan(module, module, source, False) if not imp.type_checking]
    assert _circles(_import_graph(set(sources), imports)) == [["strategies.a", "strategies.b", "strategies.c"]]


def test_temporary_exceptions_are_still_needed() -> None:
    imports = _runtime_imports(list(_files()))
    for name, allowed, needed in (
        ("TEMPORARY_LAYER_EXCEPTIONS", TEMPORARY_LAYER_EXCEPTIONS, {(imp.module, imp.target) for imp in imports}),
        ("TEMPORARY_WITHOUT_REASON", TEMPORARY_WITHOUT_REASON,
         {(imp.module, imp.target) for imp in imports if imp.in_function and not imp.has_reason}),
    ):
        stale = sorted(set(allowed) - needed)
        assert not stale, f"remove {stale} from {name}: the import moved or gained a reason"


def test_the_checker_reads_function_level_type_checking_and_relative_imports() -> None:
    source = """\
from typing import TYPE_CHECKING
from . import registry
if TYPE_CHECKING:
    from trainer.fit.trainer import Trainer
else:
    import callbacks.base


def build():
    import callbacks.checkpoint  # lazy: a reason on the line
    # lazy: one reason above a run
    from strategies import data
    from trainer.fit import checkpointing
    x = 1
    from trainer import utils
    import deepspeed
"""
    found = [(imp.line, imp.target, imp.in_function, imp.type_checking, imp.has_reason) for imp in _scan("strategies", "s.py", source, True)]
    assert [f for f in found if f[1].split(".")[0] in PACKAGES] == [
        (2, "strategies.registry", False, False, False),
        (4, "trainer.fit.trainer", False, True, False),
        (6, "callbacks.base", False, False, False),
        (10, "callbacks.checkpoint", True, False, True),
        (12, "strategies.data", True, False, True),
        (13, "trainer.fit.checkpointing", True, False, True),
        (15, "trainer.utils", True, False, False),
    ]


MAX_LINES = 800


def test_no_module_over_800_lines() -> None:
    """A module that outgrows this holds several concerns: split it along them (docs/architecture.md)."""
    long = {module: n for module, path in _files().items() if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


# ---------------------------------------------------------------------------------------- private attributes
# No module reaches into another object's private attributes: what crosses a module boundary is a public, named
# contract (a property, a method, a small dataclass, a function). Read from the source with `ast`:
#
# * a private name (``_x``, not a dunder) belongs to the modules that define it: as ``self._x``/``cls._x``, in a class
#   body, or at a module's top level (a function, a class, an assignment, an import alias);
# * a reach is ``obj._x`` (read, written or deleted), ``getattr``/``setattr``/``hasattr``/``delattr(obj, "_x")`` or
#   ``object.__setattr__(obj, "_x", ...)``, where `obj` is not ``self``/``cls`` and the module does not define ``_x``
#   itself, and ``_x`` is a name some module of the project defines (``module._buffers``, torch's, is none of ours); a
#   receiver that is a third-party module (``torch.autograd._profiler_enabled``) is that package's business; and
#   ``from <our module> import _x``.
#
# What is left is listed below as "path:function:receiver._x" -> why, each a deliberate reach into a third-party
# object's internal whose private name happens to be one of ours too, with a comment at the place; an entry that no
# longer matches fails (`test_every_allowed_private_reach_is_still_needed`).
ALLOWED_PRIVATE_REACHES: dict[str, str] = {
    "strategies/deepspeed.py:DeepSpeedStrategy._load_resharded:engine._config": (
        "DeepSpeed's engine: load_checkpoint reads engine._config.load_universal_checkpoint, which has no public setter "
        "(engine.load_universal_checkpoint() only reads it); set for one load and reset (our own `_config` is "
        "DeepSpeedPlugin's, in trainer/accelerator/config.py)"
    ),
}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _top_level(tree: ast.Module) -> list[ast.stmt]:
    """The module's statements outside functions and classes (through ``if``/``try``/``with`` blocks)."""
    found: list[ast.stmt] = []
    todo = list(tree.body)
    while todo:
        stmt = todo.pop()
        found.append(stmt)
        if not isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            todo.extend(child for child in ast.iter_child_nodes(stmt) if isinstance(child, ast.stmt))
            if isinstance(stmt, ast.Try):
                todo.extend(s for handler in stmt.handlers for s in handler.body)
    return found


def _defined_private_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()

    def assigned(targets: list[ast.expr]) -> None:
        names.update(leaf.id for target in targets for leaf in ast.walk(target) if isinstance(leaf, ast.Name))

    for stmt in _top_level(tree):
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(stmt.name)
        elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
            names.update(alias.asname or alias.name.split(".")[0] for alias in stmt.names)
        elif isinstance(stmt, ast.Assign):
            assigned(stmt.targets)
        elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)):
            assigned([stmt.target])
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for stmt in node.body:
                if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names.add(stmt.name)
                elif isinstance(stmt, ast.Assign):
                    assigned(stmt.targets)
                elif isinstance(stmt, ast.AnnAssign):
                    assigned([stmt.target])
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _is_own(node.value):
            names.add(node.attr)
    return {name for name in names if _is_private(name)}


def _is_own(receiver: ast.expr) -> bool:
    """``self``, ``cls`` or ``super()``: the object's own attributes."""
    if isinstance(receiver, ast.Name):
        return receiver.id in ("self", "cls")
    return isinstance(receiver, ast.Call) and isinstance(receiver.func, ast.Name) and receiver.func.id == "super"


def _third_party_names(tree: ast.Module) -> set[str]:
    """Names a module binds to a third-party module or its members (``import torch``, ``from torch import nn``)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.asname or alias.name.split(".")[0] for alias in node.names if alias.name.split(".")[0] not in PACKAGES)
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] not in PACKAGES:
            names.update(alias.asname or alias.name for alias in node.names)
    return names


def _root(receiver: ast.expr) -> str | None:
    while isinstance(receiver, (ast.Attribute, ast.Call, ast.Subscript)):
        receiver = receiver.func if isinstance(receiver, ast.Call) else receiver.value
    return receiver.id if isinstance(receiver, ast.Name) else None


def _reaches(relative: str, tree: ast.Module, ours: set[str]) -> list[tuple[str, int]]:
    """``("path:function:receiver._x", line)`` of each reach of `tree` (see above) into the private names `ours`."""
    own, third_party = _defined_private_names(tree), _third_party_names(tree)
    found: list[tuple[str, int]] = []

    def reach(receiver: ast.expr, name: str, where: str, line: int) -> None:
        if _is_private(name) and name in ours and name not in own and not _is_own(receiver) and _root(receiver) not in third_party:
            found.append((f"{relative}:{where}:{ast.unparse(receiver)}.{name}", line))

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = where
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                inner = child.name if where == "<module>" else f"{where}.{child.name}"
            if isinstance(child, ast.Attribute):
                reach(child.value, child.attr, where, child.lineno)
            elif isinstance(child, ast.Call) and len(child.args) >= 2 and isinstance(child.args[1], ast.Constant) \
                    and isinstance(child.args[1].value, str):
                func = child.func
                by_name = isinstance(func, ast.Name) and func.id in ("getattr", "setattr", "hasattr", "delattr")
                by_object = isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "object" \
                    and func.attr in ("__setattr__", "__getattribute__", "__delattr__")
                if by_name or by_object:
                    reach(child.args[0], child.args[1].value, where, child.lineno)
            elif isinstance(child, ast.ImportFrom) and not child.level and (child.module or "").split(".")[0] in PACKAGES:
                found.extend((f"{relative}:{where}:{child.module}.{alias.name}", child.lineno) for alias in child.names if _is_private(alias.name))
            visit(child, inner)

    visit(tree, "<module>")
    return found


@cache
def _trees() -> dict[str, ast.Module]:
    return {str(path.relative_to(ROOT)): ast.parse(path.read_text(encoding="utf-8"), str(path)) for path in _files().values()}


@cache
def _private_reaches() -> tuple[tuple[str, int], ...]:
    trees = _trees()
    ours = set().union(*(_defined_private_names(tree) for tree in trees.values()))
    return tuple(found for relative, tree in trees.items() for found in _reaches(relative, tree, ours))


def test_no_module_reaches_into_another_objects_private_attributes() -> None:
    offenders = [f"{key} (line {line})" for key, line in _private_reaches() if key not in ALLOWED_PRIVATE_REACHES]
    assert not offenders, (
        "reaches into private attributes defined elsewhere (give the crossing a public name: a property, a method, a "
        "small dataclass, a function argument; or, for a third-party object's internal, an ALLOWED_PRIVATE_REACHES entry "
        "saying why):\n  " + "\n  ".join(offenders)
    )


def test_every_allowed_private_reach_is_still_needed() -> None:
    stale = sorted(set(ALLOWED_PRIVATE_REACHES) - {key for key, _ in _private_reaches()})
    assert not stale, f"remove {stale} from ALLOWED_PRIVATE_REACHES: the reach is gone"


def test_the_reach_finder_sees_reads_writes_getattr_and_imports_but_not_own_or_third_party_attributes() -> None:
    owner = """\
import torch
_table = {}
class Part:
    _cache = None
    def __init__(self):
        self._state = 0
    def _step(self):
        return self._state, torch._C, super()._step()
"""
    reacher = """\
import torch
from trainer.x import _table, Part
class Other:
    def __init__(self):
        self._mine = 1
    def run(self, part, peer):
        part._state += 1
        peer._mine = 2
        torch.autograd._step()
        getattr(part, "_cache", None)
        object.__setattr__(part, "_cache", 1)
        return part._step(), part._buffers, part.__dict__
def helper(part):
    del part._cache
"""
    ours = _defined_private_names(ast.parse(owner)) | _defined_private_names(ast.parse(reacher))
    assert ours == {"_table", "_cache", "_state", "_step", "_mine"}
    found = [key for key, _ in _reaches("r.py", ast.parse(reacher), ours)]
    assert found == [
        "r.py:<module>:trainer.x._table", "r.py:Other.run:part._state", "r.py:Other.run:part._cache",
        "r.py:Other.run:part._cache", "r.py:Other.run:part._step", "r.py:helper:part._cache",
    ]
    assert not _reaches("o.py", ast.parse(owner), ours)
