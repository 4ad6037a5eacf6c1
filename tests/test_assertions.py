"""Every assertion in tests/ can fail: none tests a value that is true whatever the code under
test does (a non-empty string or container literal, an f-string, a string made by str(),
repr(), format() or json.dumps(), a true constant)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ALWAYS_A_STRING = {"str", "repr", "format", "json.dumps"}


def dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{dotted(node.value)}.{node.attr}"
    return ""


def always_true(test: ast.expr) -> bool:
    """Whether ``test`` holds whatever the code under test returns (``and`` of such parts too)."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return any(always_true(value) for value in test.values)
    if isinstance(test, ast.Constant):
        return bool(test.value)
    if isinstance(test, ast.JoinedStr):
        return any(not isinstance(v, ast.Constant) or v.value for v in test.values)
    if isinstance(test, (ast.List, ast.Tuple, ast.Set)):
        return bool(test.elts)
    if isinstance(test, ast.Dict):
        return bool(test.keys)
    if isinstance(test, ast.Call) and dotted(test.func) in ALWAYS_A_STRING:
        return dotted(test.func) != "str" or bool(test.args)  # str() alone is "", false
    return False


def assertions_that_cannot_fail(source: str, name: str) -> list[str]:
    return [
        f"{name}:{node.lineno}: assert {ast.unparse(node.test)}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Assert) and always_true(node.test)
    ]


def test_no_assertion_in_tests_is_true_by_construction():
    found = [
        line for path in sorted(TESTS.glob("*.py")) for line in assertions_that_cannot_fail(path.read_text(), path.name)
    ]
    assert found == [], "assertions that hold whatever the code does:\n" + "\n".join(found)


def test_the_check_finds_each_kind_of_assertion_that_cannot_fail():
    planted = """
assert json.dumps(reason_of(nodes))
assert f"{steps} steps"
assert str(value)
assert (steps, "why")
assert count == 1 and [count]
assert "a reason"
assert count == 1, "a message is not the test"
assert steps and reason
assert str()
"""
    assert [line.split(": ", 1)[1] for line in assertions_that_cannot_fail(planted, "planted")] == [
        "assert json.dumps(reason_of(nodes))",
        "assert f'{steps} steps'",
        "assert str(value)",
        "assert (steps, 'why')",
        "assert count == 1 and [count]",
        "assert 'a reason'",
    ]
