"""Patching: attributes replaced on a library's classes, and put back exactly."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Generator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

__all__ = ["Patch", "around", "undo_all"]

Around = Callable[..., Generator[None, Any, Any]]


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


def around(original: Callable[..., Any], hook: Around) -> Callable[..., Any]:
    """``original`` (a function or a coroutine function: one hook serves both) run inside
    ``hook``, a generator function called with the same arguments: it yields once, just before
    the call, is sent its result (or thrown its error) and returns what the caller gets."""

    if inspect.iscoroutinefunction(original):

        @functools.wraps(original)
        async def call_async(*args: Any, **kwargs: Any) -> Any:
            steps = hook(*args, **kwargs)
            next(steps)
            try:
                result = await original(*args, **kwargs)
            except BaseException as exc:
                return _resume(steps.throw, exc)
            return _resume(steps.send, result)

        return call_async

    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        steps = hook(*args, **kwargs)
        next(steps)
        try:
            result = original(*args, **kwargs)
        except BaseException as exc:
            return _resume(steps.throw, exc)
        return _resume(steps.send, result)

    return call


def _resume(step: Callable[[Any], object], value: Any) -> Any:
    """Resume a hook after the call; what it returns."""
    try:
        step(value)
    except StopIteration as done:
        return done.value
    raise RuntimeError("an around() hook yielded twice")
