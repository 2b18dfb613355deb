"""Batch creations (OpenAI ``/v1/batches``, Anthropic ``/v1/messages/batches``, Gemini
``batchGenerateContent`` and ``asyncBatchEmbedContent``, Vertex AI ``batchPredictionJobs``):
requests for many model calls, billed when the batch runs, later, which ampmeter does not
meter (docs/integrations.md, "Batches").

A batch's creation is one ``llm`` node with no model (``""``), so with no price: it says
``unmetered`` (:data:`~ampmeter.policies.unpriced.META_UNMETERED`) and its cost is
``unpriced``, never $0. Under a cost limit (of the context or one above it) it is therefore
refused before it is sent, with a ``LimitExceeded`` naming the reason, unless the context
lets unpriced calls through (``on_unpriced="warn"`` or ``"allow"``): a run cannot pass its cap
through a batch unseen.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ampmeter.context import ExecutionContext
from ampmeter.integrations.adapter import Adapter, Tally
from ampmeter.integrations.lifecycle import Admitted, begin_call
from ampmeter.policies.unpriced import META_UNMETERED
from ampmeter.pricing.request_size import RequestSize

__all__ = ["ROUTES", "BatchAdapter", "batch_adapter"]

_UNMETERED: Final = "a batch, billed when it runs"
_NOTHING: Final = RequestSize(0, 0)


class BatchAdapter(Adapter):
    """A batch's creation at ``provider``: nothing of it is estimated or read as usage."""

    def __init__(self, provider: str, operation: str, sdk_method: str = "create") -> None:
        super().__init__(operation, sdk_method)
        self.provider = provider

    def measure(
        self, body: Mapping[str, Any], model: str | None
    ) -> tuple[RequestSize, int | None, bool]:
        return _NOTHING, 0, False

    def read_response(self, result: Any, tally: Tally) -> None:
        tally.tokens_in = tally.tokens_out = 0  # the creation bills nothing; its calls will

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
        """Begin and admit the node of a batch's creation (``LimitExceeded`` under a cost
        limit, unless unpriced calls are let through); ``extra`` and ``operation`` as
        :func:`~ampmeter.integrations.lifecycle.begin_call` takes them."""
        meta = {META_UNMETERED: _UNMETERED, **(extra or {})}
        # Model "": no price (None would be a call priced by the cost it records).
        return begin_call(ctx, self, body, "", meta, operation=operation)


# By how a request path ends, as http.ROUTES. Apart from those: a route that meters model calls
# (the proxy's) must never take a batch for one, whatever its body says.
ROUTES: Final[dict[str, BatchAdapter]] = {
    "/messages/batches": BatchAdapter("anthropic", "messages.batches"),
    "/batches": BatchAdapter("openai", "batches"),
    ":batchGenerateContent": BatchAdapter("google", "batchGenerateContent"),
    ":asyncBatchEmbedContent": BatchAdapter("google", "asyncBatchEmbedContent"),
    "/batchPredictionJobs": BatchAdapter("google", "batchPredictionJobs"),
}


def batch_adapter(path: str) -> BatchAdapter | None:
    """The batch creation a request path names, or None."""
    return next((adapter for suffix, adapter in ROUTES.items() if path.endswith(suffix)), None)
