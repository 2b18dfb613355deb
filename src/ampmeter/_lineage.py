"""Where a call ran, as the event log writes it: ``metadata.contexts``, the contexts from the
run's root down to the call's own, each with its name and the ceilings it set itself.

Views read it to name a run by its root context (not by the first sub-agent that logged a line)
and to put each limit on the context that set it, so a sub-agent stopped by its own cap is not
shown as the run's end. It is built once per context and shared by every call made in it: a
call pays one dictionary entry, not a walk up the tree.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Final

from ampmeter.keys import is_money
from ampmeter.limits import Limit, LimitType

__all__ = ["META_CONTEXTS", "Lineage", "lineage"]

META_CONTEXTS: Final = "contexts"
"""The metadata key of the lineage (a list of ``{"name", "limits"}``, root first; the root also
holds its ``id``, ``pid`` and ``host``)."""

Lineage = tuple[dict[str, Any], ...]


def _ceilings(limits: Sequence[Limit]) -> dict[str, Any]:
    """A context's own hard ceilings by key (``amp:input_tokens:*`` for a prefix limit); money
    as its exact decimal text, counts as numbers. Soft and windowed limits stop no call."""
    found: dict[str, Any] = {}
    for limit in limits:
        if not limit.is_ceiling:
            continue
        key = limit.key + ("*" if limit.type is LimitType.PREFIX else "")
        value = limit.max_value
        if is_money(limit.key):
            found[key] = str(value)
        else:
            found[key] = int(value) if float(value).is_integer() else value
    return found


def lineage(above: Lineage | None, name: str, limits: Sequence[Limit]) -> Lineage:
    """The lineage of a context named ``name`` with its own ``limits``, under ``above`` (its
    parent's lineage; None for a root, which also records the process it runs in so a view
    can tell whether the run is still going)."""
    entry: dict[str, Any] = {"name": name}
    ceilings = _ceilings(limits)
    if ceilings:
        entry["limits"] = ceilings
    if above is None:
        # A root also says which one it is (two roots of one name in one process are two
        # runs) and where it runs (so a view can tell whether it still does); with os alone,
        # as secrets and socket would add to every process's cold start. The id is digits
        # only: hex such as "3e100" reads as a huge exponent to the summary's DuckDB scan,
        # which then reads the whole file the slow way.
        ident = f"{int.from_bytes(os.urandom(6), 'big'):015d}"
        entry |= {"id": ident, "pid": os.getpid(), "host": os.uname().nodename}
        return (entry,)
    return (*above, entry)
