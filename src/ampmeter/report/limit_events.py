"""The report's marker for limit events (warnings, soft limits, ...) of a run.

A separate piece so the report's layout can change around it: :func:`limit_events_html` gives a
badge and a short list per run, read from the ``limit_events`` metadata the policies write on
the node whose settlement produced each event (see :mod:`ampmeter.policies`), which
:func:`ampmeter.analysis.digest.digest_logs` collects per run.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["limit_events_html"]


def limit_events_html(events: Sequence[Mapping[str, Any]]) -> tuple[str, str]:
    """A badge for the run's summary line and the list of its limit events ("" when none)."""
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
