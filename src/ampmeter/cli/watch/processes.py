"""Whether the processes that wrote a run are still going, so that ``watch`` calls a run ended
only when they have ended (a call can take minutes and log nothing meanwhile).

A process counts as alive when a process of that id exists on this machine and (where
``/proc`` tells) started before the run's first call ended: a dead process whose id was reused
is not taken for the run's. A process on another machine cannot be checked.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from functools import cache

__all__ = ["stat_fields", "this_host", "verdict"]


@cache
def this_host() -> str:
    """This machine's host name, as ampmeter writes it in the log."""
    return os.uname().nodename


def _boot_time_s() -> float | None:
    try:
        with open("/proc/stat", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except OSError:
        return None
    return None


def stat_fields(pid: int) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after the command's name (which, in brackets, may
    hold spaces); none where ``/proc`` does not tell."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as handle:
            return handle.read().rpartition(")")[2].split()
    except OSError:
        return []


def _alive(pid: int, since_ms: float) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        pass
    fields = stat_fields(pid)
    if fields[:1] in (["Z"], ["X"]):  # ended, not yet reaped by its parent
        return False
    boot = _boot_time_s()
    if boot is None or len(fields) < 20 or not fields[19].isdigit():
        return True
    # Field 22 of stat (the 20th after the command's closing parenthesis): clock ticks after
    # boot at which the process started.
    started = boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    return started * 1000.0 <= since_ms + 1000.0


def verdict(processes: Iterable[tuple[str | None, int]], since_ms: float) -> str | None:
    """``"alive"`` when one of ``processes`` ((host, pid) pairs) is still running, ``"ended"``
    when every one is on this machine and has ended, None when that cannot be told (none
    known, or one on another machine). ``since_ms``: when the run's first call ended."""
    known = list(processes)
    if not known:
        return None
    local = [pid for host, pid in known if host == this_host()]
    if any(_alive(pid, since_ms) for pid in local):
        return "alive"
    return "ended" if len(local) == len(known) else None
