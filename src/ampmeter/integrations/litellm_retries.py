"""LiteLLM's own ``num_retries`` leaves a budget stop alone.

With ``num_retries`` (per call, or ``litellm.num_retries``), LiteLLM's call wrapper catches the
error of a failed ``completion`` / ``acompletion`` / ``responses`` / ``aresponses`` and, while
handling it, calls ``litellm.<name>_with_retries``, which runs the request again under
tenacity. The sync wrapper retries every error its mapping gives (any ``openai.APIError``,
which a 400 is), the async one every error. A stop is raised before anything is sent and would
be refused again, so each retry only added a halted node. These helpers are wrapped: when the
error being handled carries a :class:`~ampmeter.LimitExceeded`, they raise that error again
(the one LiteLLM raises without ``num_retries``: a 400-class ``BadRequestError`` with the stop in
its chain) instead of retrying. Every other error is retried as LiteLLM does.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any, Final

from ampmeter.errors import find_limit_exceeded
from ampmeter.integrations.patching import Patch, undo_all

__all__ = ["instrument_litellm", "uninstrument_litellm"]

_RETRY_HELPERS: Final = ("completion_with_retries", "responses_with_retries")
_ASYNC_RETRY_HELPERS: Final = ("acompletion_with_retries", "aresponses_with_retries")

_patches: list[Patch] = []


def _stop_being_retried() -> BaseException | None:
    """The error being handled where the helper was called, if it carries a stop."""
    handled = sys.exc_info()[1]
    return handled if find_limit_exceeded(handled) is not None else None


def _sync_helper(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def helper(*args: Any, **kwargs: Any) -> Any:
        stopped = _stop_being_retried()
        if stopped is not None:
            raise stopped  # what LiteLLM raises without num_retries
        return original(*args, **kwargs)

    return helper


def _async_helper(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    async def helper(*args: Any, **kwargs: Any) -> Any:
        stopped = _stop_being_retried()
        if stopped is not None:
            raise stopped
        return await original(*args, **kwargs)

    return helper


def instrument_litellm(module: ModuleType) -> None:
    """Keep ``module``'s (``litellm``'s) retry helpers from retrying a stop (idempotent)."""
    if _patches:
        return
    for names, wrap in ((_RETRY_HELPERS, _sync_helper), (_ASYNC_RETRY_HELPERS, _async_helper)):
        for name in names:
            original = module.__dict__.get(name)
            if callable(original):
                _patches.append(Patch.apply(module, name, wrap(original)))


def uninstrument_litellm() -> None:
    """Put LiteLLM's retry helpers back (idempotent)."""
    undo_all(_patches)
