"""No import circles in gspo_cli/: the module import graph, read from the source, has no cycle.

What counts as an edge A -> B (B a gspo_cli module): every `import gspo_cli.x.y` and
`from gspo_cli.x import y` in A, at the top of the module and inside functions and methods
alike (a lazy import only postpones the circle: the two modules still need each other, which is
what the folders are meant to rule out). `from gspo_cli.x import name` is an edge to the module
`gspo_cli.x.name` when that is a module, else to the package `gspo_cli.x` (its __init__).
Not counted: imports under `if TYPE_CHECKING:` (never run), and the import of a package's
__init__ that Python makes before any of its submodules (a package's front door may re-export its
own modules; the `every module imports on its own` test in test_house.py covers that order).

Inside `gspo_cli.analysis` the same graph must also run down its packages (ANALYSIS_LAYERS).
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


# gspo_cli.analysis inside: its packages, lowest first. A module imports its own package and
# the ones below it, never one above (the same rule as the house's layers in test_house.py).
ANALYSIS = "gspo_cli.analysis"
ANALYSIS_LAYERS = ["rundata", "stats", "tables", "figures", "report"]


def analysis_layer(module: str) -> str | None:
    """The analysis package a module belongs to (`gspo_cli.analysis.tables.compare` -> "tables");
    None for a module outside analysis and for analysis' own __init__."""
    if not module.startswith(ANALYSIS + "."):
        return None
    return module[len(ANALYSIS) + 1 :].split(".")[0]


def analysis_climbs(graph: dict[str, set[str]]) -> list[str]:
    """Every import inside analysis from a lower package to a higher one, as "a -> b"; a package
    missing from ANALYSIS_LAYERS is named as one too."""
    rank = {name: i for i, name in enumerate(ANALYSIS_LAYERS)}
    out = []
    for mod in sorted(graph):
        own = analysis_layer(mod)
        if own is None:
            continue
        if own not in rank:
            out.append(f"{mod}: in no layer of ANALYSIS_LAYERS")
            continue
        for dep in sorted(graph[mod]):
            layer = analysis_layer(dep)
            if layer in rank and rank[layer] > rank[own]:
                out.append(f"{mod} -> {dep}")
    return out


def test_analysis_imports_run_down_its_layers():
    graph = import_graph()
    layers = {analysis_layer(m) for m in graph} - {None}
    assert layers == set(ANALYSIS_LAYERS), layers
    assert analysis_climbs(graph) == []
    inside = {m: {d for d in deps if d.startswith(ANALYSIS)} for m, deps in graph.items() if m.startswith(ANALYSIS)}
    cycle = find_cycle(inside)
    assert cycle is None, "import cycle in analysis: " + " -> ".join(cycle)


def test_analysis_layers_catch_a_planted_upward_import(tmp_path):
    """A stats module that imports the report (lazily, inside a function) climbs; a report module
    that imports stats does not; a folder outside the layer list is named."""
    pkg = tmp_path / "gspo_cli"
    for sub in ("rundata", "stats", "report"):
        (pkg / "analysis" / sub).mkdir(parents=True)
        (pkg / "analysis" / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "analysis" / "__init__.py").write_text("")
    (pkg / "analysis" / "rundata" / "runs.py").write_text("X = 1\n")
    (pkg / "analysis" / "stats" / "seeds.py").write_text(
        "from gspo_cli.analysis.rundata.runs import X\n\ndef f():\n    from gspo_cli.analysis.report import build\n"
    )
    (pkg / "analysis" / "report" / "build.py").write_text("from gspo_cli.analysis.stats.seeds import f\n")
    graph = import_graph(pkg)
    assert analysis_climbs(graph) == ["gspo_cli.analysis.stats.seeds -> gspo_cli.analysis.report.build"]
    (pkg / "analysis" / "stats" / "seeds.py").write_text("from gspo_cli.analysis.rundata.runs import X\n")
    assert analysis_climbs(import_graph(pkg)) == []
    (pkg / "analysis" / "views").mkdir()
    (pkg / "analysis" / "views" / "__init__.py").write_text("")
    assert analysis_climbs(import_graph(pkg)) == ["gspo_cli.analysis.views: in no layer of ANALYSIS_LAYERS"]


def test_each_analysis_package_says_what_it_holds_and_may_import():
    for name in ["", *ANALYSIS_LAYERS]:
        init = PACKAGE / "analysis" / name / "__init__.py"
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert len(doc) > 100 and "import" in doc.lower(), f"{init}: a docstring saying what it holds and may import"
