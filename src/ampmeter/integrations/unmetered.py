"""Billed requests ampmeter does not meter: batch creations (OpenAI ``/v1/batches``,
Anthropic ``/v1/messages/batches``, Gemini ``batchGenerateContent`` and
``asyncBatchEmbedContent``, Vertex AI ``batchPredictionJobs``, Bedrock's
``model-invocation-job``), billed when the batch runs, later; OpenAI's speech, transcriptions
and translations, billed by the audio made or heard; a Gemini
context cache, billed for its tokens and the hours it is kept (docs/integrations.md,
"Batches and other requests ampmeter does not meter").

Such a request is one ``llm`` node with no model (``""``), so with no price: it says
``unmetered`` (:data:`~ampmeter.policies.unpriced.META_UNMETERED`: what it is) and its cost is
``unpriced``, never $0. Under a cost limit (of the context or one above it) it is therefore
refused before it is sent, with a ``LimitExceeded`` naming the reason, unless the context
lets unpriced calls through (``on_unpriced="warn"`` or ``"allow"``): a run cannot pass its cap
through one unseen.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ampmeter.context import ExecutionContext
from ampmeter.integrations.adapter import Adapter, Tally
from ampmeter.integrations.lifecycle import Admitted, begin_call
from ampmeter.policies.unpriced import META_UNMETERED
from ampmeter.pricing.request_size import RequestSize

__all__ = ["ROUTES", "UnmeteredAdapter", "unmetered_adapter"]

_BATCH: Final = "a batch, billed when it runs"
_NOTHING: Final = RequestSize(0, 0)


class UnmeteredAdapter(Adapter):
    """A billed request to ``provider`` that ampmeter does not meter (``what`` it sends, as the
    node and a refusal say it): nothing of it is estimated or read as usage."""

    def __init__(
        self, provider: str, operation: str, what: str = _BATCH, sdk_method: str = "create"
    ) -> None:
        super().__init__(operation, sdk_method)
        self.provider = provider
        self.what = what

    def measure(
        self, body: Mapping[str, Any], model: str | None
    ) -> tuple[RequestSize, int | None, bool]:
        return _NOTHING, 0, False

    def read_response(self, result: Any, tally: Tally) -> None:
        tally.tokens_in = tally.tokens_out = 0  # (its bill, if any, is not read: unpriced)

    def read_event(self, event: Any, tally: Tally, hide_usage: bool) -> bool:
        self.read_response(event, tally)
        return False

    def begin(
        self,
        ctx: ExecutionContext,
        body: Mapping[str, Any],
        extra: Mapping[str, Any] | None = None,
        operation: str | None = None,
    ) -> Admitted:
        """Begin and admit the request's node (``LimitExceeded`` under a cost limit, unless
        unpriced calls are let through); ``extra`` and ``operation`` as
        :func:`~ampmeter.integrations.lifecycle.begin_call` takes them."""
        meta = {META_UNMETERED: self.what, **(extra or {})}
        # Model "": no price (None would be a call priced by the cost it records).
        return begin_call(ctx, self, body, "", meta, operation=operation)


_AUDIO: Final = "audio, billed by its length"
# By how a request path ends, as http.ROUTES. Apart from those: a route that meters model calls
# (the proxy's) must never take one of these for one, whatever its body says.
ROUTES: Final[dict[str, UnmeteredAdapter]] = {
    "/messages/batches": UnmeteredAdapter("anthropic", "messages.batches"),
    "/batches": UnmeteredAdapter("openai", "batches"),
    ":batchGenerateContent": UnmeteredAdapter("google", "batchGenerateContent"),
    ":asyncBatchEmbedContent": UnmeteredAdapter("google", "asyncBatchEmbedContent"),
    "/batchPredictionJobs": UnmeteredAdapter("google", "batchPredictionJobs"),
    "/model-invocation-job": UnmeteredAdapter("aws", "create_model_invocation_job"),
    "/audio/speech": UnmeteredAdapter("openai", "audio.speech", "speech, billed as it is made"),
    "/audio/transcriptions": UnmeteredAdapter("openai", "audio.transcriptions", _AUDIO),
    "/audio/translations": UnmeteredAdapter("openai", "audio.translations", _AUDIO),
    "/cachedContents": UnmeteredAdapter(
        "google", "caches", "a context cache, billed for its tokens and the hours it is kept"
    ),
}


def unmetered_adapter(path: str) -> UnmeteredAdapter | None:
    """The billed request ampmeter does not meter that a request path names, or None."""
    return next((adapter for suffix, adapter in ROUTES.items() if path.endswith(suffix)), None)
