"""No import circles (issue 77): no module of the package or of the built-in rules imports one
that imports it back, directly or through others.

Every import statement counts, wherever it is written: at module level, inside a function
(a deferred import still ties the two modules together), or under TYPE_CHECKING. An import
names the module it loads (`from a.b import c` is a.b.c where c is a module, else a.b); the
package `__init__` files that Python runs on the way are not counted as imports of the file.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Where each package's files are, under the name it is imported by.
PACKAGES = {"kineto_comm": ROOT / "kineto_comm", "kineto_comm_builtin_rules": ROOT / "rules"}


def _modules(packages: dict[str, Path]) -> dict[str, Path]:
    """Every module of the packages, by dotted name (a package by its own name)."""
    found = {}
    for package, folder in packages.items():
        for path in sorted(folder.rglob("*.py")):
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package's modules that `path` (module `name`) imports, anywhere in the file."""
    is_package = path.name == "__init__.py"
    here = name if is_package else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.add(sub if sub in modules else base)
    return {m for m in out if m in modules and m != name}


def _graph(packages: dict[str, Path] = PACKAGES) -> dict[str, set[str]]:
    """Which of the packages' modules each module imports."""
    modules = _modules(packages)
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[tuple[list[str], set[str]]]:
    """Each group of modules that reach each other through imports (Tarjan's strongly
    connected components), with one circle through it (a shortest way back to its first)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    circles = []
    for group in groups:
        start = min(group)
        paths = {start: [start]}
        todo = [start]
        while todo and start not in {w for v in todo for w in graph[v]}:
            nxt = []
            for v in todo:
                for w in sorted(graph[v] & group):
                    if w not in paths:
                        paths[w] = [*paths[v], w]
                        nxt.append(w)
            todo = nxt
        back = next(v for v in todo if start in graph[v])
        circles.append(([*paths[back], start], group))
    return circles


def test_the_walk_sees_every_kind_of_import(tmp_path):
    """Module-level, function-level, TYPE_CHECKING, relative and `import a.b` imports all
    count, and a made-up circle through three modules is found (a walk that saw none would
    pass any tree)."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "a.py": "from pkg.sub import b\n",
        "sub/__init__.py": "",
        "sub/b.py": "def f():\n    from . import c\n",
        "sub/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.a\n",
        "d.py": "from .sub.c import x\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    graph = _graph({"pkg": pkg})
    assert graph == {
        "pkg": set(),
        "pkg.a": {"pkg.sub.b"},
        "pkg.sub": set(),
        "pkg.sub.b": {"pkg.sub.c"},
        "pkg.sub.c": {"pkg.a"},
        "pkg.d": {"pkg.sub.c"},
    }
    assert _cycles(graph) == [
        (["pkg.a", "pkg.sub.b", "pkg.sub.c", "pkg.a"], set(graph) - {"pkg", "pkg.sub", "pkg.d"})
    ]
    assert _graph()["kineto_comm.per_rank"] >= {"kineto_comm.load.decode"}  # the real tree


def test_no_module_imports_one_that_imports_it_back():
    circles = _cycles(_graph())
    assert not circles, "import circles:\n" + "\n".join(
        f"{' -> '.join(circle)}  (with {len(group)} modules: {', '.join(sorted(group))})"
        for circle, group in circles
    )


# What the analyses sit below (docs/architecture.md): they compute the quantities that the
# rule API, the rules, the renderers and the engine read, so they import none of them.
ABOVE_ANALYSIS = (
    "kineto_comm.rules_api",
    "kineto_comm.rules_engine",
    "kineto_comm.tables",
    "kineto_comm.render",
    "kineto_comm.cli",
    "kineto_comm.diff",
    "kineto_comm_builtin_rules",
)


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    """Every module `start` imports, directly or through others."""
    seen, todo = set(), [start]
    while todo:
        for w in graph[todo.pop()] - seen:
            seen.add(w)
            todo.append(w)
    return seen


def test_analyses_import_nothing_above_them():
    """No module of kineto_comm/analysis reaches the rule API, `Tables`, the engine, the
    renderers or the rules, through any chain of imports: a derived quantity's home is below
    every reader of it (issue 77). The registry (analysis/derived.py) is checked like the
    rest, and the walk does reach the modules it names (a check that found nothing would
    pass any tree)."""
    graph = _graph()
    analyses = [m for m in graph if m.startswith("kineto_comm.analysis.")]
    assert "kineto_comm.analysis.derived" in analyses
    assert _reach(graph, "kineto_comm.analysis.derived") >= {
        "kineto_comm.analysis.model_of_time",
        "kineto_comm.analysis.waits",
    }
    assert "kineto_comm.rules_api" in _reach(graph, "kineto_comm.rules_engine")
    bad = {m: sorted(w for w in _reach(graph, m) if w.startswith(ABOVE_ANALYSIS)) for m in analyses}
    assert not {m: w for m, w in bad.items() if w}
