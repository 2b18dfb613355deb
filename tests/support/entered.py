"""Which functions a piece of work enters: the tests that pin a call's path read it."""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import FrameType

__all__ = ["entered"]


def entered(work: Callable[[], object], counts: Callable[[FrameType], bool]) -> list[str]:
    """The qualified names of the functions ``work()`` enters on this thread, in order, of
    those whose frame ``counts``."""
    names: list[str] = []

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call" and counts(frame):
            names.append(frame.f_code.co_qualname)

    sys.setprofile(profile)
    try:
        work()
    finally:
        sys.setprofile(None)
    return names
