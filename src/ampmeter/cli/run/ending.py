"""How an ``ampmeter run`` ended: one end reason and one exit status, each meaning one thing
(the table: ``docs/integrations.md``, "Exit status and end reason").

When several apply, the first of interrupted, timeout, unmetered, then the stop (3 or 4) wins:
each is a fact about the whole run that the later ones cannot undo. A stop (3 or 4) replaces
the program's status only when that status says nothing of the program's own: 0 (it caught
the stop and went on) or 1 (Python's status for an uncaught exception, the stop itself
included). Any other status is the program's deliberate answer and is kept; the stop is
still in the summary and the log.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Final

__all__ = [
    "EXIT_ADMISSION_WAIT",
    "EXIT_LIMIT",
    "EXIT_TIMEOUT",
    "EXIT_UNMETERED",
    "Ending",
    "judge",
]

EXIT_LIMIT: Final = 3
"""A limit stopped a call of the program."""
EXIT_ADMISSION_WAIT: Final = 4
"""A call waited for other calls' reservations past its admission timeout (``BudgetBusy``)."""
EXIT_UNMETERED: Final = 5
"""Processes of the run's tree ran Python without joining its metering."""
EXIT_TIMEOUT: Final = 124
"""``--timeout`` ended the run (as coreutils' ``timeout``)."""

_STOP_CODES: Final = {"limit_exceeded": EXIT_LIMIT, "admission_wait": EXIT_ADMISSION_WAIT}
# Statuses that carry nothing of the program's own: a stop may replace them.
_NOT_THE_PROGRAMS_OWN: Final = (0, 1)


@dataclass(frozen=True)
class Ending:
    """The run's exit status, its end reason and why (None: nothing stopped it)."""

    exit_code: int
    termination: str
    stop_reason: str | None


def judge(
    program_code: int,
    *,
    logged: tuple[str, str | None],
    timeout: float | None,
    timed_out: bool,
    signalled: int | None,
    unmetered: int,
) -> Ending:
    """The ending of a run whose program exited with ``program_code`` (negative: the signal
    that ended it). ``logged`` is how the run's log says it ended (end reason, stop reason);
    ``timeout`` is the run's ``--timeout`` and ``timed_out`` whether it ended the program;
    ``signalled`` is the signal ``ampmeter run`` got and passed on (SIGINT or SIGTERM);
    ``unmetered`` counts the processes that ran unmetered."""
    if signalled is not None:
        name = signal.Signals(signalled).name
        return Ending(128 + signalled, "interrupted", f"interrupted: {name} passed to the program")
    termination, stop_reason = logged
    if timed_out or (timeout is not None and termination == "timeout"):
        return Ending(EXIT_TIMEOUT, "timeout", f"timeout: stopped at --timeout {timeout:g} s")
    if unmetered:
        reason = f"{unmetered} process(es) ran Python unmetered (see above)"
        return Ending(EXIT_UNMETERED, "unmetered", reason)
    code = _STOP_CODES.get(termination)
    if code is not None:
        kept = program_code if program_code not in _NOT_THE_PROGRAMS_OWN else code
        return Ending(kept, termination, stop_reason)
    if termination == "timeout":  # the program's own context's timeout_s: one of its limits
        kept = program_code if program_code not in _NOT_THE_PROGRAMS_OWN else EXIT_LIMIT
        return Ending(kept, termination, stop_reason)
    if program_code < 0:  # ended by a signal the run did not send: the shell's convention
        return Ending(128 - program_code, "error", None)
    return Ending(program_code, "success" if program_code == 0 else "error", None)
