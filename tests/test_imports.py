"""No import circles in gspo_cli/: the module import graph, read from the source, has no cycle.

What counts as an edge A -> B (B a gspo_cli module): every `import gspo_cli.x.y` and
`from gspo_cli.x import y` in A, at the top of the module and inside functions and methods
alike (a lazy import only postpones the circle: the two modules still need each other, which is
what the folders are meant to rule out). `from gspo_cli.x import name` is an edge to the module
`gspo_cli.x.name` when that is a module, else to the package `gspo_cli.x` (its __init__).
Not counted: imports under `if TYPE_CHECKING:` (never run), and the import of a package's
__init__ that Python makes before any of its submodules (a package's front door may re-export its
own modules; the `every module imports on its own` test in test_house.py covers that order).
"""

from __future__ import annotations

import ast
from pathlib import Path

import gspo_cli

PACKAGE = Path(gspo_cli.__file__).parent


def module_name(path: Path, root: Path = PACKAGE) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_lines(tree: ast.AST) -> set[int]:
    """Line numbers inside `if TYPE_CHECKING:` blocks."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else None
            if name == "TYPE_CHECKING":
                for child in node.body:
                    out.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return out


def imports_of(path: Path, modules: set[str], root: Path = PACKAGE) -> set[str]:
    """The gspo_cli modules (in `modules`) that the file at `path` imports (see the docstring)."""
    tree = ast.parse(path.read_text())
    skip = _type_checking_lines(tree)
    me = module_name(path, root)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from .x import y
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            if base != "gspo_cli" and not base.startswith("gspo_cli."):
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in modules:
                    out.add(sub)
                elif base in modules:
                    out.add(base)
    out.discard(me)
    return out


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """{module: the gspo_cli modules it imports} for every module under `root`."""
    paths = sorted(root.rglob("*.py"))
    modules = {module_name(p, root) for p in paths}
    return {module_name(p, root): imports_of(p, modules, root) for p in paths}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as [a, b, ..., a], or None when it has none (depth-first search,
    nodes visited in sorted order so the cycle named is the same on every run)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return path[path.index(dep) :] + [dep]
            if dep not in state and (found := visit(dep)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycle_in_the_package():
    graph = import_graph()
    assert "gspo_cli.spec.loading" in graph and sum(len(v) for v in graph.values()) > 100
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_find_cycle_names_a_planted_cycle():
    graph = {"a": {"b"}, "b": {"c", "d"}, "c": set(), "d": {"e"}, "e": {"b"}}
    assert find_cycle(graph) == ["b", "d", "e", "b"]
    del graph["e"]
    assert find_cycle(graph) is None
    assert find_cycle({"x": {"x"}}) == ["x", "x"]


def test_lazy_imports_count_and_type_checking_ones_do_not(tmp_path):
    """The graph read from planted files: a function-level import is an edge; one under
    `if TYPE_CHECKING:` is not; `from pkg import mod` points at the module."""
    pkg = tmp_path / "gspo_cli"
    (pkg / "p").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "p" / "__init__.py").write_text("from gspo_cli.p.a import f\n")
    (pkg / "p" / "a.py").write_text("def f():\n    from gspo_cli.p import b\n    return b\n")
    (pkg / "p" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gspo_cli.p.a import f\n"
        "def g():\n    import gspo_cli.p.a\n"
    )
    graph = import_graph(pkg)
    assert graph == {
        "gspo_cli": set(),
        "gspo_cli.p": {"gspo_cli.p.a"},
        "gspo_cli.p.a": {"gspo_cli.p.b"},
        "gspo_cli.p.b": {"gspo_cli.p.a"},
    }
    assert find_cycle(graph) == ["gspo_cli.p.a", "gspo_cli.p.b", "gspo_cli.p.a"]
