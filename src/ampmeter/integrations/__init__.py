"""SDK instrumentation: every OpenAI / Anthropic call made inside a context becomes an ``llm`` node.

::

    import ampmeter
    from ampmeter.integrations import instrument

    instrument()                                   # all installed SDKs
    with ampmeter.ExecutionContext(max_cost_usd=0.50):
        client.chat.completions.create(...)        # reserved, checked, recorded

Outside a context the SDKs behave exactly as without ampmeter. No API key, header or (unless
``capture_content=True``) prompt or response text is put on a node; a failed call's error text
is scrubbed by :mod:`ampmeter.redact` (the client's API key included).
"""

from __future__ import annotations

from ampmeter import redact
from ampmeter.context import ExecutionContext
from ampmeter.integrations._common import StreamAbandoned, settings
from ampmeter.integrations.anthropic import instrument_anthropic, uninstrument_anthropic
from ampmeter.integrations.openai import instrument_openai, uninstrument_openai

__all__ = [
    "StreamAbandoned",
    "instrument",
    "instrument_anthropic",
    "instrument_openai",
    "is_instrumented",
    "set_default_context",
    "uninstrument",
    "uninstrument_anthropic",
    "uninstrument_openai",
]


def instrument(
    *, capture_content: bool = False, openai: bool = True, anthropic: bool = True
) -> list[str]:
    """Patch the installed SDKs (idempotent) and return the names of those patched.

    ``capture_content=True`` also stores the prompt and response text on each node (off by
    default: logs then hold no conversation text, and the message of a provider error, which may
    echo the prompt, is withheld from error text). Calling it again only updates that setting.
    """
    if not isinstance(capture_content, bool):
        raise TypeError(f"capture_content must be a bool, got {type(capture_content).__name__}")
    settings.capture_content = capture_content
    redact.configure(capture_content=capture_content)
    done: list[str] = []
    if openai and instrument_openai():
        done.append("openai")
    if anthropic and instrument_anthropic():
        done.append("anthropic")
    return done


def uninstrument() -> None:
    """Put every patched SDK attribute back exactly as it was (idempotent)."""
    uninstrument_openai()
    uninstrument_anthropic()
    settings.capture_content = False
    redact.configure(capture_content=False)


def is_instrumented() -> bool:
    """Whether any SDK is currently patched."""
    from ampmeter.integrations import anthropic as _anthropic
    from ampmeter.integrations import openai as _openai

    return _openai.is_instrumented() or _anthropic.is_instrumented()


def set_default_context(context: ExecutionContext | None) -> None:
    """A context for SDK calls made where no context is current (e.g. threads of a program run
    under ``ampmeter run``); None removes it."""
    if context is not None and not isinstance(context, ExecutionContext):
        raise TypeError(
            f"context must be an ExecutionContext or None, got {type(context).__name__}"
        )
    settings.default_context = context
