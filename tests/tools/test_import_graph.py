"""No import circles inside ``pydflash``: every module is parsed (not imported) with ``ast``, and each import
statement, at module level or inside a function, is an edge to the package module it names. A circle fails the test
with its modules in order, e.g. ``pydflash.a -> pydflash.b -> pydflash.a``.

An edge goes to the module that provides the name: ``from .x import y`` is an edge to ``x.y`` when ``y`` is a
submodule of ``x``, else to ``x``. Parent packages that Python imports on the way (``pydflash.server`` for
``pydflash.server.preset``) are not edges: a package's ``__init__`` importing one of its own submodules is not a
circle.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = "pydflash"


def module_files(root: pathlib.Path = ROOT) -> dict[str, pathlib.Path]:
    """Dotted module name -> its file, for every ``.py`` under the package."""
    out = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    """The absolute name of ``from <level dots><target> import ...`` written in ``module``."""
    if level == 0:
        return target or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def imported_names(module: str, path: pathlib.Path) -> list[tuple[str, list[str]]]:
    """Every package-internal import in ``module``'s file, anywhere in it: (the module it names, the names it takes
    from there; [] for ``import x``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, []) for alias in node.names if alias.name.split(".")[0] == PACKAGE]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_package, node.level, node.module)
            if base == PACKAGE or base.startswith(PACKAGE + "."):
                out.append((base, [alias.name for alias in node.names]))
    return out


def imports_of(module: str, path: pathlib.Path, modules: set[str]) -> set[str]:
    """The package modules that ``module`` imports anywhere in its file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                name = alias.name
                while name and name not in modules:  # "import pydflash.x.y" of a name that is no module
                    name = name.rpartition(".")[0]
                if name:
                    out.add(name)
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, is_package, node.level, node.module)
            if not (base == PACKAGE or base.startswith(PACKAGE + ".")):
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in modules:
                    out.add(sub)
                elif base in modules:
                    out.add(base)
    out.discard(module)
    return out


def import_graph(root: pathlib.Path = ROOT) -> dict[str, set[str]]:
    files = module_files(root)
    names = set(files)
    return {m: imports_of(m, p, names) for m, p in files.items()}


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected component of more than one module (Tarjan), as a closed path through it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                components.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_closed_path(graph, set(c)) for c in components]


def _closed_path(graph: dict[str, set[str]], comp: set[str]) -> list[str]:
    """A shortest path from the component's first module back to itself, inside the component."""
    start = min(comp)
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & comp):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return path[::-1] + [start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return sorted(comp)


def test_the_graph_sees_relative_and_function_level_imports(tmp_path):
    pkg = tmp_path / PACKAGE
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from . import leaf\n")
    (pkg / "sub" / "leaf.py").write_text("def f():\n    from ..top import thing\n")
    (pkg / "top.py").write_text("from .sub.leaf import f\nimport json\n")
    graph = import_graph(tmp_path)
    assert graph == {PACKAGE: set(), f"{PACKAGE}.sub": {f"{PACKAGE}.sub.leaf"},
                     f"{PACKAGE}.sub.leaf": {f"{PACKAGE}.top"}, f"{PACKAGE}.top": {f"{PACKAGE}.sub.leaf"}}
    assert find_cycles(graph) == [[f"{PACKAGE}.sub.leaf", f"{PACKAGE}.top", f"{PACKAGE}.sub.leaf"]]


def test_a_longer_circle_is_reported_in_order():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}
    assert find_cycles(graph) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_pydflash_has_no_import_circle():
    cycles = find_cycles(import_graph())
    if cycles:
        pytest.fail("import circles:\n" + "\n".join("  " + " -> ".join(c) for c in cycles))


def test_every_package_import_names_a_module_that_exists():
    """A rename that missed an import (``from ..serve.ray import build`` after serve/ moved) fails here, even inside
    a function that no other test calls."""
    files = module_files()

    def exists(name: str) -> bool:  # a module, or a package folder (pydflash/engine has no __init__.py)
        return name in files or (ROOT / name.replace(".", "/")).is_dir()

    missing = [f"{m}: {base}" for m, p in files.items() for base, _ in imported_names(m, p) if not exists(base)]
    assert not missing, "imports of modules that do not exist:\n  " + "\n  ".join(missing)
