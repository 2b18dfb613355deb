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

import sys
from collections.abc import Generator
from types import ModuleType
from typing import Any, Final

from ampmeter.errors import find_limit_exceeded
from ampmeter.integrations.patching import Patch, around, undo_all

__all__ = ["instrument_litellm", "uninstrument_litellm"]

_RETRY_HELPERS: Final = (
    "completion_with_retries",
    "responses_with_retries",
    "acompletion_with_retries",
    "aresponses_with_retries",
)

_patches: list[Patch] = []


def _not_retrying_a_stop(*args: Any, **kwargs: Any) -> Generator[None, Any, Any]:
    """Raise the error being handled where the helper was called, if it carries a stop (what
    LiteLLM raises without ``num_retries``); else run the helper."""
    handled = sys.exc_info()[1]
    if handled is not None and find_limit_exceeded(handled) is not None:
        raise handled
    return (yield)


def instrument_litellm(module: ModuleType) -> None:
    """Keep ``module``'s (``litellm``'s) retry helpers from retrying a stop (idempotent)."""
    if _patches:
        return
    for name in _RETRY_HELPERS:
        original = module.__dict__.get(name)
        if callable(original):
            _patches.append(Patch.apply(module, name, around(original, _not_retrying_a_stop)))


def uninstrument_litellm() -> None:
    """Put LiteLLM's retry helpers back (idempotent)."""
    undo_all(_patches)
