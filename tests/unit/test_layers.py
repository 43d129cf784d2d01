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
