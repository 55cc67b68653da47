"""No import circles among sparsegen's modules.

The graph is read from the source with `ast`, not by importing: an edge A -> B for every import of a
sparsegen module B that runs when A is loaded. That is every `import` / `from ... import` at module
level (in `if`/`try` blocks and class bodies too), except under `if TYPE_CHECKING:`, plus the packages
such an import initialises on the way (importing `sparsegen.select.device` runs
`sparsegen/select/__init__.py`), apart from the importer's own enclosing packages, which are already
loading by the time it runs.

Imports inside a function are left out: they run when the function is called, after every module has
finished loading, so they cannot meet a half-initialised module. They are how the package's facade
(`sparsegen/__init__.py`), the lazily loaded selection table (`sparsegen.select.__getattr__`) and
PyCUDA stay off the import path.
"""
from __future__ import annotations

import ast
from pathlib import Path

from .conftest import REPO

FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def modules(root: Path, package: str) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, is a package) for every .py under root/package."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return out


def _absolute(module: str, is_package: bool, level: int, name: str | None) -> str:
    """The absolute name a (possibly relative) `from` import names."""
    if not level:
        return name or ""
    base = module.split(".")[: len(module.split(".")) - (level - (1 if is_package else 0))]
    return ".".join(base + ([name] if name else []))


def _targets(node, module: str, is_package: bool, known) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = _absolute(module, is_package, node.level, node.module)
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]


def _load_time_imports(tree, module: str, is_package: bool, known):
    """The import targets that run when the module loads (see the module docstring)."""
    def walk(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, FUNCTIONS):
                continue
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                yield from (t for c in child.orelse for t in walk_one(c))
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield from _targets(child, module, is_package, known)
            yield from walk(child)

    def walk_one(node):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield from _targets(node, module, is_package, known)
        elif not isinstance(node, FUNCTIONS):
            yield from walk(node)

    return walk(tree)


def import_graph(root: Path, package: str = "sparsegen") -> dict[str, set[str]]:
    known = modules(root, package)
    graph = {m: set() for m in known}
    for module, (path, is_package) in known.items():
        for target in _load_time_imports(ast.parse(path.read_text()), module, is_package, known):
            parts = target.split(".")
            for i in range(1, len(parts) + 1):  # the target and the packages its import initialises
                name = ".".join(parts[:i])
                enclosing = module == name or module.startswith(name + ".")
                if name in known and name != module and (i == len(parts) or not enclosing):
                    graph[module].add(name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
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
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph.get(v, ()):
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_sparsegen_has_no_import_cycle():
    graph = import_graph(REPO)
    assert "sparsegen.api" in graph and "sparsegen.families.base" in graph["sparsegen.api"]
    assert cycles(graph) == []


def _write(root: Path, files: dict):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_check_finds_direct_and_package_cycles_and_skips_deferred_imports(tmp_path):
    _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": "from . import b\n",
        "pkg/b.py": "from .a import thing\n",
        "pkg/c.py": "def later():\n    from . import a\n",
        "pkg/sub/__init__.py": "from .. import d\n",
        "pkg/sub/leaf.py": "X = 1\n",
        "pkg/d.py": "from .sub.leaf import X\n",
        "pkg/e.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import f\n",
        "pkg/f.py": "from . import e\n",
    })
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.c"] == set() and graph["pkg.e"] == set()
    assert graph["pkg.d"] == {"pkg.sub", "pkg.sub.leaf"}
    assert cycles(graph) == [["pkg.a", "pkg.b"], ["pkg.d", "pkg.sub"]]
