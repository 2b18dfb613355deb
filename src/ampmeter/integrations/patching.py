"""Patching: attributes replaced on a library's classes, and put back exactly."""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

__all__ = ["Patch", "undo_all"]


@dataclass(slots=True)
class Patch:
    """One attribute replaced on a class (or a module), and how to put it back exactly."""

    owner: type | ModuleType
    name: str
    had_own: bool
    original: Any

    @classmethod
    def apply(cls, owner: type | ModuleType, name: str, replacement: Any) -> Patch:
        """Replace ``owner.name`` with ``replacement`` and remember the original."""
        had_own = name in owner.__dict__
        original = owner.__dict__.get(name)
        setattr(owner, name, replacement)
        return cls(owner, name, had_own, original)

    def undo(self) -> None:
        """Restore the original attribute (or remove the override if it was inherited)."""
        if self.had_own:
            setattr(self.owner, self.name, self.original)
        else:
            delattr(self.owner, self.name)


def undo_all(patches: list[Patch]) -> None:
    """Restore every patch, last applied first, and empty the list (idempotent)."""
    while patches:
        patches.pop().undo()
