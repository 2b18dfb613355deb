"""What ``ampmeter run`` says while its program runs, on stderr: each warning a limit gives (in
the process where it fired), what a dry run would have stopped, and each call paused at a limit
with the command that lets it go on."""

from __future__ import annotations

import contextlib
import shlex
import threading
from collections.abc import Iterator
from typing import Any, Final

from ampmeter.cli.run.config import RunConfig
from ampmeter.cli.run.leftover import open_run_ledger

__all__ = ["say_limit_event", "watching_pauses"]

_PAUSE_POLL_S: Final = 0.25


def say_limit_event(event: Any, *, dry_run: bool = False) -> None:
    """The ``on_limit_event`` of the run's contexts: one line per event (a
    :class:`~ampmeter.LimitEvent`); ``dry_run``: the run's limits are soft, and unpriced calls
    let through only because of it."""
    from ampmeter.cli.output import printable, say
    from ampmeter.keys import is_money
    from ampmeter.money import format_usd

    value = format_usd(event.value) if is_money(event.key) else f"{event.value:,}"
    limit = plain_limit(event.limit.describe())
    if event.kind == "warning":
        text = f"warning: {event.threshold:.0%} of {limit} used: {value} (in {event.context})"
    elif event.kind == "soft_limit":
        text = (
            f"dry run: {event.key} reached {value} (in {event.context}): without --dry-run, "
            f"{limit} would have stopped this call or one before it"
        )
    elif event.kind == "unpriced":
        text = (
            f"warning: a call in {event.context} went to a model without a price: it counts "
            "as unpriced, never $0 (give --price MODEL=IN/OUT)"
        )
        if dry_run:
            text += "; without --dry-run it would have been refused"
    else:
        text = f"{event.kind}: {limit}: {value} (in {event.context})"
    say(printable(f"ampmeter run: {text}"))


def plain_limit(described: str) -> str:
    """A limit as the user set it: a dry run makes every limit soft, which is not theirs."""
    return described.removesuffix(" (soft)")


@contextlib.contextmanager
def watching_pauses(config: RunConfig, tree: dict[str, Any]) -> Iterator[None]:
    """While the block runs, name each call paused at a limit (``--on-exhausted pause``) once,
    with the ``ampmeter budget raise`` that lets it go on."""
    if config.on_exhausted != "pause" or config.dry_run:
        yield
        return
    stop = threading.Event()
    thread = threading.Thread(
        target=_watch, args=(tree, stop), name="ampmeter-run-pauses", daemon=True
    )
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)


def _watch(tree: dict[str, Any], stop: threading.Event) -> None:
    from ampmeter.cli.output import printable, say

    where, scope = tree["ledger"], tree["scope"]
    at = f"{shlex.quote(where)} {shlex.quote(scope)}"
    seen: set[str] = set()
    ledger = None
    try:
        while not stop.wait(_PAUSE_POLL_S):
            try:  # (until a process has metered, there is no ledger to open)
                ledger = ledger or open_run_ledger(tree, create=False)
                paused = [c for c in ledger.show(scope).paused_calls if c.id not in seen]
            except Exception:  # busy, or not reachable now: look again
                continue
            for call in paused:
                seen.add(call.id)
                say(
                    printable(
                        f"ampmeter run: paused: a call of {call.context} waits at the limit on "
                        f"{call.key}; it goes on once the limit is raised: ampmeter budget "
                        f"raise {at} {call.key} NEW_MAX (what is spent: ampmeter budget show "
                        f"{at})"
                    )
                )
    finally:
        if ledger is not None:
            ledger.close()
