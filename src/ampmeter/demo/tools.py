"""The demo agent's tools: a safe calculator and a lookup over a small bundled text."""

from __future__ import annotations

import ast
import operator
from functools import lru_cache
from importlib import resources
from typing import Any, Final

__all__ = ["TOOLS", "ToolError", "calculator", "lookup"]


class ToolError(ValueError):
    """A tool could not run on its input (the agent sees the message as its observation)."""


_BINARY: Final[dict[type, Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.Pow: operator.pow,
    ast.Mod: operator.mod,
    ast.FloorDiv: operator.floordiv,
}
_UNARY: Final[dict[type, Any]] = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_MAX_EXPONENT: Final = 100


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _eval(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        value = node.value
        assert isinstance(value, (int, float))
        return float(value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > _MAX_EXPONENT:
            raise ToolError("exponent too large")
        return float(_BINARY[type(node.op)](left, right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return float(_UNARY[type(node.op)](_eval(node.operand)))
    raise ToolError("only numbers and + - * / ** % // ( ) are allowed")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression (no names, no calls) and return the result as text."""
    text = expression.strip().replace("^", "**").replace(",", "")
    if not text:
        raise ToolError("empty expression")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ToolError(f"not an arithmetic expression: {expression!r}") from None
    try:
        value = _eval(tree)
    except ZeroDivisionError:
        raise ToolError("division by zero") from None
    return str(int(value)) if value.is_integer() else f"{value:.6g}"


@lru_cache(maxsize=1)
def _facts() -> dict[str, str]:
    text = resources.files("ampmeter.demo").joinpath("facts.txt").read_text("utf-8")
    facts: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            facts[key.strip().lower()] = value.strip()
    return facts


def lookup(term: str) -> str:
    """The bundled fact about ``term`` (matched on any word of it)."""
    words = [w.strip(" .?!'\"").lower() for w in term.split()]
    facts = _facts()
    for word in words:
        if word in facts:
            return facts[word]
    raise ToolError(f"no entry for {term.strip()!r}; known: {', '.join(sorted(facts))}")


TOOLS: Final = {"calculator": calculator, "lookup": lookup}
