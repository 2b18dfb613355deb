"""botocore hands a budget stop back as itself.

botocore's HTTP session wraps every error its urllib3 request raises in ``HTTPClientError``,
which its retry handlers retry as a connection error. A stop is raised at the HTTP layer before
a Bedrock request is sent, and would be refused again: each retry only added a halted node, and
the caller got an HTTP client error. The session's ``send`` is wrapped so that an
``HTTPClientError`` around an ampmeter error raises that error instead, which botocore neither
retries nor wraps: the caller gets the :class:`~ampmeter.LimitExceeded` itself.
"""

from __future__ import annotations

from collections.abc import Generator
from types import ModuleType
from typing import Any

from ampmeter.errors import AmpmeterError
from ampmeter.integrations.patching import Patch, around, undo_all

__all__ = ["instrument_botocore", "uninstrument_botocore"]

_patches: list[Patch] = []


def _unwrapping_a_stop(*args: Any, **kwargs: Any) -> Generator[None, Any, Any]:
    from botocore.exceptions import HTTPClientError

    try:
        return (yield)
    except HTTPClientError as wrapped:
        error = wrapped.kwargs.get("error")
        if isinstance(error, AmpmeterError):
            raise error from None
        raise


def instrument_botocore(module: ModuleType) -> None:
    """Make ``module``'s (``botocore.httpsession``'s) session raise a stop as itself
    (idempotent)."""
    session = getattr(module, "URLLib3Session", None)
    if _patches or session is None or "send" not in session.__dict__:
        return
    send = around(session.__dict__["send"], _unwrapping_a_stop)
    _patches.append(Patch.apply(session, "send", send))


def uninstrument_botocore() -> None:
    """Put botocore's session back (idempotent)."""
    undo_all(_patches)
