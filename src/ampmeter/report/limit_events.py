"""The report's marker for limit events (warnings, soft limits, ...) of a run.

A separate piece so the report's layout can change around it: :func:`limit_events_html` gives a
badge and a short list per run, read from the ``limit_events`` metadata the policies write on
the node whose settlement produced each event (see :mod:`ampmeter.policies`).
"""

from __future__ import annotations

import html
from typing import Any

from ampmeter.analysis.runs import Run
from ampmeter.policies import META_LIMIT_EVENTS

__all__ = ["limit_events_html", "run_limit_events"]


def run_limit_events(run: Run) -> list[dict[str, Any]]:
    """The limit events recorded in ``run``'s nodes, in log order."""
    found: list[dict[str, Any]] = []
    for event in run.events:
        metadata = event.get("metadata")
        listed = metadata.get(META_LIMIT_EVENTS) if isinstance(metadata, dict) else None
        if isinstance(listed, list):
            found.extend(item for item in listed if isinstance(item, dict))
    return found


def limit_events_html(run: Run) -> tuple[str, str]:
    """A badge for the run's summary line and the list of its limit events ("" when none)."""
    events = run_limit_events(run)
    if not events:
        return "", ""
    esc = html.escape
    items = []
    for event in events:
        fraction = event.get("fraction")
        share = f" ({fraction:.0%})" if isinstance(fraction, (int, float)) else ""
        items.append(
            f"<li>{esc(str(event.get('kind')))}: {esc(str(event.get('key')))}{esc(share)} "
            f'<span class="muted">limit {esc(str(event.get("limit")))}, node '
            f"{esc(str(event.get('node_id')))}</span></li>"
        )
    badge = f'<span class="badge warn">{len(events)} limit event(s)</span>'
    return badge, f'<ul class="limit-events">{"".join(items)}</ul>'
