"""Where a read-only view (a graph, a stats object) finds the kernel and level it shows.

A view must not hand its kernel out as a public attribute, yet the core and the context need to
reach it: the tie is kept here, weakly, beside the view rather than on it."""

from __future__ import annotations

import weakref

from ampmeter._core.cells import Level
from ampmeter._core.kernel import Kernel

__all__ = ["bind", "bound"]

_VIEWS: weakref.WeakKeyDictionary[object, tuple[Kernel, Level | None]] = weakref.WeakKeyDictionary()


def bind(view: object, kernel: Kernel, level: Level | None = None) -> None:
    """Tie a read-only view (a graph, a stats object) to the kernel and level it shows, so the
    core can find them without the view handing them out."""
    _VIEWS[view] = (kernel, level)


def bound(view: object) -> tuple[Kernel, Level | None]:
    """The kernel and level a view shows (see :func:`bind`)."""
    return _VIEWS[view]
