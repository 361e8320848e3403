"""Every public function and method of the package is fully annotated (the package ships ``py.typed``).

Read from the source (the AST of every module under ``chainfb/``); nothing of the package is imported.

Public: a function at module level, or a method of a class at module level (nested classes included), whose
name has no leading underscore, plus ``__init__`` and ``__call__`` of such a class; a class whose name has a
leading underscore is private with all its methods.  Functions defined inside functions are not public.
Definitions under ``if`` / ``try`` at module or class level count.  Fully annotated: every parameter but the
first of a method (``self`` / ``cls``; a ``staticmethod`` has none), ``*args`` and ``**kwargs`` included, and
the return (not for ``__init__``).
"""
from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "chainfb"

PUBLIC_DUNDERS = {"__init__", "__call__"}


def _is_public(name: str) -> bool:
    return not name.startswith("_") or name in PUBLIC_DUNDERS


def _is_staticmethod(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in node.decorator_list)


def _unannotated(node: ast.FunctionDef | ast.AsyncFunctionDef, method: bool) -> list[str]:
    """The names of ``node``'s parameters without an annotation, and ``"return"`` if it lacks one."""
    a = node.args
    params = a.posonlyargs + a.args
    if method and params and not _is_staticmethod(node):
        params = params[1:]
    params = params + a.kwonlyargs + [p for p in (a.vararg, a.kwarg) if p is not None]
    lacking = [p.arg for p in params if p.annotation is None]
    if node.returns is None and node.name != "__init__":
        lacking.append("return")
    return lacking


def _body_defs(body: list[ast.stmt]):
    """The statements of ``body``, with those under ``if`` / ``try`` at the same level."""
    for node in body:
        if isinstance(node, ast.If):
            yield from _body_defs(node.body)
            yield from _body_defs(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _body_defs(block)
        else:
            yield node


def missing_annotations(source: str, filename: str) -> list[str]:
    """``"file:line name: [parameters lacking an annotation, "return"]"`` for every public function of one
    module's source."""
    found = []

    def visit(body: list[ast.stmt], owner: str | None) -> None:
        for node in _body_defs(body):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                visit(node.body, node.name if owner is None else f"{owner}.{node.name}")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _is_public(node.name):
                lacking = _unannotated(node, method=owner is not None)
                if lacking:
                    name = node.name if owner is None else f"{owner}.{node.name}"
                    found.append(f"{filename}:{node.lineno} {name}: {lacking}")

    visit(ast.parse(source, filename).body, None)
    return found


def _package_modules() -> list[str]:
    paths = []
    for folder, dirs, files in os.walk(os.path.join(ROOT, PACKAGE)):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        paths += [os.path.relpath(os.path.join(folder, f), ROOT).replace(os.sep, "/")
                  for f in sorted(files) if f.endswith(".py")]
    return paths


def test_public_functions_are_annotated():
    missing = []
    for path in _package_modules():
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            missing += missing_annotations(f.read(), path)
    assert not missing, "public functions lacking annotations:\n" + "\n".join(missing)


def test_checker_finds_what_lacks_an_annotation():
    source = '''
def f(x: int, y, *args, z: int = 0, **kw) -> int: ...
def g(x: int): ...
def _private(x): ...
def ok(x: int, *a: int, **k: int) -> None:
    def inner(y): ...
if True:
    def h(x) -> None: ...
class C:
    def __init__(self, a): ...
    def m(self, b: int): ...
    @staticmethod
    def s(a) -> None: ...
    @classmethod
    def c(cls, a: int) -> None: ...
    def __repr__(self): ...
    class D:
        def n(self, q) -> None: ...
class _P:
    def m(self, b): ...
'''
    assert missing_annotations(source, "m.py") == [
        "m.py:2 f: ['y', 'args', 'kw']",
        "m.py:3 g: ['return']",
        "m.py:8 h: ['x']",
        "m.py:10 C.__init__: ['a']",
        "m.py:11 C.m: ['return']",
        "m.py:13 C.s: ['a']",
        "m.py:18 C.D.n: ['q']",
    ]
