"""The house rules of the layout, read from the code's own imports (module level and inside functions):
no import cycle; imports only go down the ladder; no library module imports a command line; no folder
with more than about 15 modules.

The ladder, bottom up: the modules shared by every level (``numerics/*.py``), the tensor level, the layer
level (which may use the tensor level), the communication level (``numerics.ep``), loss curves
(``convergence.curves``), training (``convergence.train``, which compares its curves), the convergence
protocol (``convergence.protocol``: many training runs, judged on their curves); ``golden`` and ``mxval`` sit
on top. The ``__main__`` modules are command lines and may reach any level of their package.

Command lines are the ``__main__`` and ``cli`` modules, and a module's ``main`` function; the shared CLI
plumbing (``numerics.cli``: one line and exit 2 on bad input) may be imported only by a module that has a
``main``. Library code raises ``numerics.errors.BadInput`` and never needs a command line's helpers.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("numerics", "convergence", "golden", "mxval")
MAX_MODULES_PER_FOLDER = 15  # the layout rule docs/architecture.md states: no folder of more than about 15 modules

# area -> the areas it may import (itself included implicitly)
ALLOWED = {
    "numerics": set(),
    "numerics.tensor": {"numerics"},
    "numerics.layer": {"numerics", "numerics.tensor"},
    "numerics.ep": {"numerics"},
    "convergence": {"numerics", "numerics.tensor", "numerics.layer", "numerics.ep"},
    "convergence.curves": {"numerics"},
    "convergence.train": {"numerics", "numerics.tensor", "numerics.layer", "numerics.ep", "convergence",
                          "convergence.curves"},
    "convergence.protocol": {"numerics", "numerics.tensor", "numerics.layer", "numerics.ep", "convergence",
                             "convergence.curves", "convergence.train"},
    "golden": {"numerics", "numerics.tensor", "numerics.layer", "numerics.ep", "convergence",
               "convergence.curves", "convergence.train", "convergence.protocol"},
    "mxval": {"numerics", "numerics.tensor", "numerics.layer", "numerics.ep", "convergence",
              "convergence.curves", "convergence.train", "convergence.protocol", "golden"},
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def _imported_names(node: ast.AST, known: set[str]) -> list[str]:
    """The dotted names an import statement imports (none for any other node): `from pkg import mod` imports
    pkg.mod, `from mod import name` imports mod."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        return [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module for a in node.names]
    return []


def _project_module(name: str, known: set[str]) -> str:
    """The project module a dotted name lies in ("" for none)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name


def _imports(path: Path, known: set[str]) -> set[str]:
    """Every project module ``path`` imports, wherever the import statement is."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        for n in _imported_names(node, known):
            if n := _project_module(n, known):
                out.add(n)
    return out


def _area(module: str) -> str:
    for area in sorted(ALLOWED, key=len, reverse=True):
        if module == area or module.startswith(area + "."):
            return area
    raise AssertionError(f"{module} belongs to no area of the ladder; add it to ALLOWED in {__file__}")


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: _imports(p, set(mods)) - {m} for m, p in mods.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def _upward(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for mod, deps in graph.items():
        if mod.endswith("__main__") or mod in PACKAGES:
            continue  # entry points and package inits may reach their whole package
        here = _area(mod)
        for dep in deps:
            there = _area(dep)
            if there != here and there not in ALLOWED[here] and not dep.endswith("__main__"):
                bad.append(f"{mod} ({here}) imports {dep} ({there})")
            if dep.endswith("__main__"):
                bad.append(f"{mod} imports the entry point {dep}")
    return sorted(bad)


def _is_cli(module: str) -> bool:
    return module.endswith("__main__") or module.rpartition(".")[2] == "cli"


def _has_main(path: Path) -> bool:
    return any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in ast.parse(path.read_text()).body)


def _cli_imports(graph: dict[str, set[str]], has_main) -> list[str]:
    bad = []
    for mod, deps in graph.items():
        if _is_cli(mod):
            continue
        for dep in deps:
            if dep == "numerics.cli" and has_main(mod):
                continue  # a module's own main() parsing its arguments
            if _is_cli(dep):
                bad.append(f"{mod} imports the command line {dep}")
    return sorted(bad)


def test_layout_has_no_import_cycle():
    assert _cycles(_graph()) == []


def test_layout_imports_only_go_down_the_ladder():
    assert _upward(_graph()) == []


def test_layout_no_library_module_imports_a_command_line():
    mods = _modules()
    assert _cli_imports(_graph(), lambda m: _has_main(mods[m])) == []


def test_layout_folders_hold_at_most_about_15_modules():
    counts = defaultdict(int)
    for path in _modules().values():
        if path.name != "__init__.py":
            counts[path.parent.relative_to(ROOT)] += 1
    assert {str(d): n for d, n in counts.items() if n > MAX_MODULES_PER_FOLDER} == {}


# a worker (``python -m convergence train``, ``protocol --piece``, a Slurm job, a torchrun rank) is started once a run
# or a piece, often a dozen times a protocol: what it imports before it trains it pays each time. scipy (~1 CPU-s)
# is for judging, which a worker never does: imported inside the functions that judge
WORKER_ENTRIES = ("convergence.train.cli", "convergence.protocol.cli")
NOT_AT_WORKER_START = {"scipy"}


def _import_time_imports(path: Path, known: set[str]) -> tuple[set[str], set[str]]:
    """(project modules, other top-level packages) ``path`` imports when it is imported: outside functions."""
    project, other = set(), set()
    todo = list(ast.parse(path.read_text()).body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        todo.extend(ast.iter_child_nodes(node))
        for n in _imported_names(node, known):
            if n.partition(".")[0] not in PACKAGES:
                other.add(n.partition(".")[0])
            elif n := _project_module(n, known):
                project.add(n)
    return project, other


def _imported_at_start(entries, mods: dict[str, Path]) -> dict[str, set[str]]:
    """Each other top-level package the ``entries`` import when imported -> the project modules that import it."""
    seen, todo, by = set(), list(entries), defaultdict(set)
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        parts = m.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))  # a module's packages are imported first
        project, other = _import_time_imports(mods[m], set(mods))
        todo.extend(project)
        for o in other:
            by[o].add(m)
    return by


def test_layout_a_worker_starts_without_what_only_judging_needs():
    by = _imported_at_start(WORKER_ENTRIES, _modules())
    assert {o: sorted(by[o]) for o in NOT_AT_WORKER_START & set(by)} == {}
    assert {"torch", "numpy"} <= set(by)  # the walk does reach the modules a worker imports


# ---- the checks above must be able to fail

def test_layout_cycle_finder_finds_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c"]]


def test_layout_ladder_flags_a_planted_upward_import():
    graph = {"numerics.tensor.mx": {"convergence.train.loop"}, "convergence.train.loop": {"numerics.tensor.mx"},
             "convergence.curves.load": {"convergence.train.model"}}
    assert _upward(graph) == [
        "convergence.curves.load (convergence.curves) imports convergence.train.model (convergence.train)",
        "numerics.tensor.mx (numerics.tensor) imports convergence.train.loop (convergence.train)",
    ]


def test_layout_flags_a_planted_cli_import():
    graph = {"golden.layer_stats": {"numerics.layer.cli"}, "mxval.validate.levels": {"numerics.cli"},
             "numerics.tensor.report": {"numerics.cli"}}
    assert _cli_imports(graph, lambda m: m == "numerics.tensor.report") == [
        "golden.layer_stats imports the command line numerics.layer.cli",
        "mxval.validate.levels imports the command line numerics.cli",
    ]


@pytest.mark.parametrize("source, want", [
    ("from numerics.tensor import mx\n", {"numerics.tensor.mx"}),
    ("def f():\n    from numerics.layer.harness import run_suite\n", {"numerics.layer.harness"}),
    ("import numerics.ep.check as c\n", {"numerics.ep.check"}),
])
def test_layout_reads_imports_wherever_they_are(tmp_path, source, want):
    p = tmp_path / "m.py"
    p.write_text(source)
    assert _imports(p, set(_modules())) == want
