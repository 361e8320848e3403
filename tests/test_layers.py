"""The package's layers hold: no import cycle, and no module imports from a layer above its own.

The imports are read from the source (the AST of every module under ``chainfb/``); nothing of the package is
imported, so this runs in about a second.  ``docs/layout.md`` shows the same table (a test below checks that
it does) and says what each layer holds.

What counts as an import of module ``m`` by module ``x``:

- every ``import`` / ``from ... import`` naming ``chainfb`` (absolute or relative), at module level *and*
  inside functions (a lazy import is a dependency too; it only runs later);
- ``from p import name`` counts as an import of the module ``p.name`` when there is one, else of ``p``;
- importing ``a.b.c`` also runs the ``__init__`` of the packages ``a`` and ``a.b``: those count as imported
  too, except the packages ``x`` itself lies in (already running when ``x`` runs).

Not counted:

- imports under ``if TYPE_CHECKING:`` (never run);
- a package's import of one of its own modules made inside a function (``chainfb.engines`` loading the
  engine it picked, on demand): the package is always initialised before its modules, and the function runs
  after both, so such an edge cannot close a cycle that Python would trip over, nor cross a layer;
- an import inside the module ``__getattr__`` of a package, of a module listed with that package in
  ``ALIASES``: an old import path kept working, the name resolved on first use from the layer above where
  it lives now.  Nothing in the lower package uses it; each alias is listed here, so a new one is a
  decision, not an accident.
"""
from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "chainfb"

#: The layers, lowest first.  A module belongs to the layer of the longest prefix listed that names it
#: or one of its packages (``chainfb`` names the package's ``__init__`` alone); it may import from its own
#: layer and the layers below, never from a layer above.  Inside a layer, the groups of one entry (several
#: lists) are independent: none imports another.
LAYERS = [
    # argument checks, array plumbing, the caches, sorting, and the GPU layer (kernel sources, their loader, torch
    # <-> CuPy interop, the transducer score-map launchers): imports nothing of chainfb above it
    ("base", [["chainfb.checks", "chainfb._arrays", "chainfb._cache", "chainfb._sort", "chainfb.cuda"]]),
    # the graph data model and its files
    ("fst", [["chainfb.fst", "chainfb.fst_binary"]]),
    # generic FST algorithms on Fst: connect / trim, determinize, minimize, intersect, epsilon removal
    ("fst_algo", [["chainfb.fst_algo"]]),
    ("batch", [["chainfb.batch"]]),
    ("lattice", [["chainfb.lattice"]]),
    # the engine seam and its implementations
    ("engines", [["chainfb.engines"]]),
    # the criterion seam, and the pdf score map (Kaldi's strided copy)
    ("criterion", [["chainfb.criterion", "chainfb.score_map"]]),
    # the generic public API over pdf graphs
    ("api", [["chainfb.api"]]),
    # the losses, each its own package, none importing another (chain's graph building included)
    ("losses", [["chainfb.ctc"], ["chainfb.chain"], ["chainfb.transducer"]]),
    # forced alignment for every criterion
    ("alignment", [["chainfb.alignment"]]),
    # drop-ins for other toolkits' APIs (chainfb.kaldi: the old path of chainfb.compat.kaldi)
    ("compat", [["chainfb.compat", "chainfb.kaldi"]]),
    # the package's own namespace, and the graph generators of tests and benchmarks
    ("top", [["chainfb", "chainfb.testing"]]),
    # the console scripts (setup.cfg's entry points): graph building and drawing from the command line
    ("cli", [["chainfb.cli"]]),
]

#: old import paths served by a package ``__getattr__`` from a layer above: (package, module it reads from)
ALIASES = {
    ("chainfb.transducer", "chainfb.alignment.transducer"),
}


@dataclass(frozen=True)
class Import:
    src: str
    dst: str  # the module named, or a package whose __init__ importing it runs
    line: int
    named: str  # the module the statement names
    function: str = ""  # the function the statement is in ("" at module level)

    @property
    def lazy(self) -> bool:
        return bool(self.function)

    def __str__(self) -> str:
        return f"{self.src}:{self.line} -> {self.dst}{' (in a function)' if self.lazy else ''}"


def modules(root: str = ROOT) -> dict[str, tuple[str, bool]]:
    """``{module name: (path, is_package)}`` of every module under ``chainfb/``."""
    out = {}
    for d, dirs, files in os.walk(os.path.join(root, PACKAGE)):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            path = os.path.join(d, f)
            parts = os.path.relpath(path, root)[: -len(".py")].split(os.sep)
            is_pkg = parts[-1] == "__init__"
            out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


def _ancestors(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _targets(node, name: str, is_pkg: bool, known) -> list[str]:
    """The chainfb modules an import statement of module ``name`` names."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == PACKAGE]
    if node.level:
        base = name.split(".") if is_pkg else name.split(".")[:-1]
        base = base[: len(base) - node.level + 1]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if target.split(".")[0] != PACKAGE:
        return []
    return [f"{target}.{a.name}" if f"{target}.{a.name}" in known else target for a in node.names]


def imports(root: str = ROOT) -> list[Import]:
    """Every import of a chainfb module by a chainfb module (see the module docstring)."""
    known = modules(root)
    out = []
    for name, (path, is_pkg) in known.items():
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        mine = set(_ancestors(name)) | {name}

        def visit(node, function, name=name, is_pkg=is_pkg, mine=mine):
            if isinstance(node, ast.If) and _is_type_checking(node.test):
                for child in node.orelse:
                    visit(child, function)
                return
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for t in _targets(node, name, is_pkg, known):
                    for m in [t] + [a for a in _ancestors(t) if a not in mine]:
                        if m != name:
                            out.append(Import(name, m, node.lineno, t, function))
                return
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                function = function or node.name
            elif isinstance(node, ast.Lambda):
                function = function or "<lambda>"
            for child in ast.iter_child_nodes(node):
                visit(child, function)

        visit(tree, "")
    return out


def counted(edges: list[Import]) -> list[Import]:
    """The imports the checks count (see the module docstring)."""
    def own_module_on_demand(e):
        return e.lazy and e.dst.startswith(e.src + ".")

    def alias(e):
        return e.function == "__getattr__" and (e.src, e.named) in ALIASES

    return [e for e in edges if not own_module_on_demand(e) and not alias(e)]


def cycles(edges: list[Import]) -> list[list[str]]:
    """The import cycles: strongly connected components of more than one module (Tarjan), sorted."""
    graph: dict[str, set] = {}
    for e in edges:
        graph.setdefault(e.src, set()).add(e.dst)
        graph.setdefault(e.dst, set())
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def connect(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
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
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return sorted(found)


def layer_of(name: str) -> tuple[int, int, str]:
    """``(layer index, group index, layer name)`` of a module: its longest listed prefix."""
    best = None
    for i, (layer, groups) in enumerate(LAYERS):
        for j, group in enumerate(groups):
            for prefix in group:
                # the root package names its own __init__ only, never the modules under it
                if name == prefix or (prefix != PACKAGE and name.startswith(prefix + ".")):
                    if best is None or len(prefix) > best[0]:
                        best = (len(prefix), i, j, layer)
    if best is None:
        raise KeyError(name)
    return best[1:]


def violations(edges: list[Import]) -> list[str]:
    """Imports from a layer above the importer's, or between independent groups of one layer."""
    out = []
    for e in edges:
        (i, gi, li), (j, gj, lj) = layer_of(e.src), layer_of(e.dst)
        if j > i:
            out.append(f"{e}: layer {li!r} imports from {lj!r} above it")
        elif j == i and gi != gj:
            out.append(f"{e}: {LAYERS[i][1][gi][0]} and {LAYERS[j][1][gj][0]} are independent in layer {li!r}")
    return sorted(set(out))


# ------------------------------------------------------------------ the tests
def test_every_module_has_a_layer():
    missing = []
    for name in modules():
        try:
            layer_of(name)
        except KeyError:
            missing.append(name)
    assert not missing, f"modules in no layer (add them to LAYERS): {missing}"


def test_no_import_cycles():
    found = cycles(counted(imports()))
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_import_from_a_higher_layer():
    found = violations(counted(imports()))
    assert not found, "layer violations:\n" + "\n".join(found)


def test_aliases_are_package_getattrs():
    """Each alias listed is served by the module ``__getattr__`` of a package (an import anywhere else is
    counted like any other)."""
    known = modules()
    for pkg, target in ALIASES:
        assert known[pkg][1], f"ALIASES: {pkg} is not a package"
        served = [e for e in imports() if e.src == pkg and e.named == target and e.function == "__getattr__"]
        assert served, f"ALIASES lists {pkg} -> {target}, which no __getattr__ of {pkg} imports: remove it"


def test_docs_list_the_same_layers():
    """``docs/layout.md``'s table (``| layer | modules | what |``; ``;`` between independent groups) is LAYERS."""
    with open(os.path.join(ROOT, "docs", "layout.md"), encoding="utf-8") as f:
        text = f.read()
    head = text.index("| layer | modules | what |")
    rows = []
    for line in text[head:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        layer, mods = [c.strip() for c in line.strip("|").split("|")][:2]
        rows.append((layer, [re.findall(r"`([^`]+)`", g) for g in mods.split(";")]))
    assert rows == LAYERS


# ------------------------------------------------------------------ the checks check themselves
def _tree(tmp_path, files: dict):
    for rel, text in files.items():
        path = tmp_path / PACKAGE / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(tmp_path)


def test_checks_find_a_cycle_through_a_lazy_import_and_a_package(tmp_path):
    root = _tree(tmp_path, {
        "__init__.py": "",
        "a/__init__.py": "from .x import f\n",
        "a/x.py": "def f():\n    from ..b.y import g\n",
        "b/__init__.py": "",
        "b/y.py": "from ..a import f as g\n",
        "c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import x\n",
        "d/__init__.py": "def pick():\n    from . import impl\n",
        "d/impl.py": "from . import pick\n",
    })
    edges = imports(root)
    assert cycles(counted(edges)) == [["chainfb.a", "chainfb.a.x", "chainfb.b.y"]]
    assert not any(e.src == "chainfb.c" for e in edges)
    assert Import("chainfb.b.y", "chainfb.a", 1, "chainfb.a") in edges
    assert Import("chainfb.a.x", "chainfb.b", 2, "chainfb.b.y", "f") in edges  # the package b runs first


def test_checks_find_an_import_from_above(tmp_path):
    root = _tree(tmp_path, {
        "__init__.py": "",
        "fst.py": "def read():\n    from .engines import numpy_log\n",
        "engines/__init__.py": "",
        "engines/numpy_log.py": "from ..fst import read\n",
        "ctc.py": "from .chain import loss\n",
        "chain/__init__.py": "",
        "chain/loss.py": "",
    })
    found = violations(counted(imports(root)))
    assert any(v.startswith("chainfb.fst:2 -> chainfb.engines ") and "'fst' imports from 'engines'" in v
               for v in found), found
    assert "chainfb.ctc:1 -> chainfb.chain.loss: chainfb.ctc and chainfb.chain are independent in layer " \
           "'losses'" in found, found


def test_an_alias_is_exempt_only_in_a_package_getattr(tmp_path):
    files = {
        "__init__.py": "",
        "transducer/__init__.py": "def __getattr__(name):\n    from ..alignment import transducer\n",
        "alignment/__init__.py": "",
        "alignment/transducer.py": "from ..transducer import x\n",
    }
    edges = counted(imports(_tree(tmp_path / "getattr", files)))
    assert not cycles(edges) and not violations(edges)
    files["transducer/__init__.py"] = "from ..alignment import transducer\n"
    edges = counted(imports(_tree(tmp_path / "module_level", files)))
    assert cycles(edges) == [["chainfb.alignment.transducer", "chainfb.transducer"]]
    assert "chainfb.transducer:1 -> chainfb.alignment.transducer: layer 'losses' imports from 'alignment' " \
           "above it" in violations(edges)
