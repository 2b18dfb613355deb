"""Annotations for arguments that ampmeter checks itself.

The hot modules (graph, stats, the limit check, context) are compiled with mypyc, which checks
every annotated argument where Python code calls in, with a generic message ("int object
expected; got str") that does not name the argument, and which turns ``True`` into ``1.0`` for a
``float`` parameter. Where ampmeter validates an argument itself, with a message that names it,
the parameter is annotated with one of these aliases instead: type checkers see the real type,
while the compiled build (type-checked with ``--platform ampmeter-mypyc``, see
``scripts/compile_core.py``) sees ``object`` and leaves the check to ampmeter. At run time the
aliases are never evaluated (the modules use postponed annotations).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Final, TypeAlias

COMPILE_PLATFORM: Final = "ampmeter-mypyc"

if TYPE_CHECKING and sys.platform != "ampmeter-mypyc":
    from ampmeter.stats import ExecutionStats

    Str: TypeAlias = str
    Int: TypeAlias = int
    Float: TypeAlias = float
    OptStr: TypeAlias = str | None
    OptInt: TypeAlias = int | None
    OptFloat: TypeAlias = float | None
    Meta: TypeAlias = dict[str, Any]
    OptMeta: TypeAlias = dict[str, Any] | None
    OptStats: TypeAlias = "ExecutionStats | None"
else:
    Str: TypeAlias = object
    Int: TypeAlias = object
    Float: TypeAlias = object
    OptStr: TypeAlias = object
    OptInt: TypeAlias = object
    OptFloat: TypeAlias = object
    Meta: TypeAlias = object
    OptMeta: TypeAlias = object
    OptStats: TypeAlias = object
