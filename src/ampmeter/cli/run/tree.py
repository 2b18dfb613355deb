"""The program's process tree, as ``ampmeter run`` sees it: which Python processes never joined
the run's metering (what is flagged and why: ``docs/integrations.md``, "Processes that escape
the run").

Every Python interpreter that starts with the run's environment leaves a mark named after its
pid in the run's directory. While the program runs, :class:`TreeWatch` reads ``/proc`` every
:data:`POLL_S` seconds for the processes of the program's session and their descendants. A
process is Python once seen running Python in two polls, so that the instant between a Python
program's ``fork`` and its ``exec`` of another program is never taken for a Python process.
"""

from __future__ import annotations

import os
import shlex
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from ampmeter.cli.watch.processes import stat_fields

__all__ = ["POLL_S", "Seen", "TreeWatch", "joined_pids"]

POLL_S: Final = 0.1
"""Seconds between two looks at the process tree."""
_PROC: Final = Path("/proc")
_PYTHON_NAMES: Final = ("python", "pypy")
_COMMAND_CHARS: Final = 200  # a command line shown in a message is cut here


@dataclass
class Seen:
    """One process of the tree: its command line, and in how many polls in a row it was
    running a Python interpreter."""

    pid: int
    command: str
    python_polls: int = 0
    python: bool = False  # seen running Python in two polls in a row


@dataclass
class TreeWatch:
    """Watches the process tree of the session ``session`` (the program's pid) in a thread."""

    session: int
    available: bool = field(default_factory=lambda: (_PROC / "self" / "stat").exists())
    seen: dict[tuple[int, str], Seen] = field(default_factory=dict)
    _outside: set[int] = field(default_factory=set)  # pids seen, not of the tree
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> TreeWatch:
        """Start polling (nothing happens without ``/proc``)."""
        if self.available:
            self.poll()
            self._thread = threading.Thread(target=self._run, name="ampmeter-tree", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop polling (after one last look)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            self.poll()
        self.poll()

    def poll(self) -> None:
        """Look at every process once: note those of the tree, and which run Python."""
        found: dict[int, tuple[str, int]] = {}  # pid -> (start time, parent pid)
        in_tree: set[int] = {self.session}
        entries = _numeric_entries()
        # A process once seen outside the tree stays outside (its children are new pids), so
        # only new processes and the tree's are read again: a poll costs little on a busy host.
        self._outside &= set(entries)
        for entry in entries:
            if entry in self._outside:
                continue
            stat = _stat(entry)
            if stat is None:
                continue
            start, parent, session = stat
            found[entry] = (start, parent)
            if session == self.session:
                in_tree.add(entry)
        # Descendants that left the session (setsid) are still the program's.
        while added := {
            pid
            for pid, (start, parent) in found.items()
            if pid not in in_tree and (parent in in_tree or (pid, start) in self.seen)
        }:
            in_tree |= added
        for pid in in_tree:
            if pid in found:
                self._note(pid, found[pid][0])
        self._outside |= found.keys() - in_tree

    def _note(self, pid: int, start: str) -> None:
        key = (pid, start)
        seen = self.seen.get(key)
        if seen is None:
            seen = self.seen[key] = Seen(pid, _command(pid))
        if _runs_python(pid):
            seen.python_polls += 1
            if seen.python_polls >= 2:
                seen.python = True
                seen.command = _command(pid) or seen.command
        else:
            seen.python_polls = 0

    def unmetered(self, joined: set[int]) -> list[Seen]:
        """The Python processes seen that never joined (``joined``: the pids that did)."""
        return sorted(
            (s for s in self.seen.values() if s.python and s.pid not in joined),
            key=lambda s: s.pid,
        )

    def others(self) -> int:
        """How many processes of the tree never ran Python while seen."""
        return sum(1 for s in self.seen.values() if not s.python and s.python_polls == 0)


def joined_pids(processes_dir: str) -> set[int]:
    """The pids that left a mark in the run's directory (see the module)."""
    heads = (name.partition("-")[0] for name in os.listdir(processes_dir))
    return {int(head) for head in heads if head.isdigit()}


def _numeric_entries() -> list[int]:
    try:
        return [int(name) for name in os.listdir(_PROC) if name.isdigit()]
    except OSError:
        return []


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(start time, parent pid, session id) of ``pid``, or None when it is gone."""
    fields = stat_fields(pid)
    try:
        return fields[19], int(fields[1]), int(fields[3])
    except (IndexError, ValueError):
        return None


def _runs_python(pid: int) -> bool:
    try:
        exe = os.readlink(_PROC / str(pid) / "exe")
    except OSError:
        return False
    name = os.path.basename(exe.removesuffix(" (deleted)"))
    return name.startswith(_PYTHON_NAMES) or exe == os.path.realpath(sys.executable)


def _command(pid: int) -> str:
    try:
        raw = (_PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return ""
    words = [w.decode(errors="replace") for w in raw.split(b"\0") if w]
    text = shlex.join(words)
    return text if len(text) <= _COMMAND_CHARS else text[: _COMMAND_CHARS - 1] + "…"
