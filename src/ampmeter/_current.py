"""Which context and node are current (per thread and task), and which contexts are open."""

from __future__ import annotations

import contextvars
import weakref
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ampmeter.context import ExecutionContext

__all__ = [
    "CURRENT",
    "OPEN",
    "current_context",
    "current_node_id",
    "enclosing_context",
    "open_contexts",
    "restore",
    "set_enclosing_context",
]

CURRENT: contextvars.ContextVar[tuple[ExecutionContext, str] | None] = contextvars.ContextVar(
    "ampmeter_current", default=None
)
"""The innermost context entered here and the innermost open node in it."""

OPEN: weakref.WeakSet[ExecutionContext] = weakref.WeakSet()
"""Contexts made and not yet closed, in any thread."""

_ENCLOSING: list[ExecutionContext] = []  # at most one: the process's enclosing context


def set_enclosing_context(context: ExecutionContext | None) -> None:
    """Make ``context`` the parent of every context this process makes without one (None: no
    such parent). ``ampmeter run`` sets its process's context here, so a context the program
    opens itself runs inside the run: its calls are logged and count toward the run's limits,
    and its own limits still apply."""
    _ENCLOSING[:] = [] if context is None else [context]


def enclosing_context() -> ExecutionContext | None:
    """The context that new contexts of this process run inside, while it is open, or None."""
    if _ENCLOSING and not _ENCLOSING[0].closed:
        return _ENCLOSING[0]
    return None


def current_context() -> ExecutionContext | None:
    """The innermost context entered in this thread or task, or None."""
    current = CURRENT.get()
    return current[0] if current is not None else None


def current_node_id() -> str | None:
    """The innermost open node (a call or step block, or a context's own node), or None."""
    current = CURRENT.get()
    return current[1] if current is not None else None


def open_contexts() -> list[ExecutionContext]:
    """Contexts made and not yet closed, in any thread (to explain an unmetered call)."""
    return list(OPEN)


def restore(token: contextvars.Token[Any] | None, fallback: ExecutionContext | None) -> None:
    """Undo a ``CURRENT.set``. From another task or thread than the one that set it (where the
    token does not apply), make ``fallback`` (at its own node) current instead; a closed
    context is never left current."""
    if token is None:
        return
    try:
        CURRENT.reset(token)
    except ValueError:
        CURRENT.set(None if fallback is None else (fallback, fallback.node_id))
    current = CURRENT.get()
    while current is not None and current[0].closed:
        parent = current[0].parent
        current = None if parent is None else (parent, parent.node_id)
        CURRENT.set(current)
