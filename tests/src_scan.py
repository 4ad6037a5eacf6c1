"""The ast scan behind the chokepoint tests (decode, storage): find calls of one kind in src/,
each named by its enclosing function's qualified name (``module.Class.method``)."""

from __future__ import annotations

import ast

from conftest import REPO

SRC = REPO / "src"


class ScopedFinder(ast.NodeVisitor):
    """Collects ``(qualified name, kind, line)`` of every call :meth:`match` names a kind for."""

    def __init__(self):
        self.stack: list[str] = []
        self.found: list[tuple[str, str, int]] = []

    def _scoped(self, node):
        self.stack.append(node.name)
        self.generic_visit(node)
        self.stack.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scoped

    def match(self, node: ast.Call) -> str | None:
        raise NotImplementedError

    def visit_Call(self, node):
        kind = self.match(node)
        if kind:
            self.found.append((".".join(self.stack) or "<module>", kind, node.lineno))
        self.generic_visit(node)


def calls_in(finder: type[ScopedFinder], source: str) -> list[tuple[str, str, int]]:
    scan = finder()
    scan.visit(ast.parse(source))
    return scan.found


def calls_in_src(finder: type[ScopedFinder]) -> dict[str, list[tuple[str, int]]]:
    """'module.qualname' -> [(kind, line)] over every file in src/."""
    out: dict[str, list[tuple[str, int]]] = {}
    for path in sorted(SRC.rglob("*.py")):
        module = ".".join(path.relative_to(SRC).with_suffix("").parts)
        for where, kind, line in calls_in(finder, path.read_text()):
            out.setdefault(f"{module}.{where}", []).append((kind, line))
    return out
