"""Usage a provider did not report, for a request it billed: estimated, never zero (the rules
as users read them: docs/integrations.md).

The input is what the reservation estimated; the output is counted from what was received,
failing toward charging: a token per character of text and tool arguments (a token of text is,
but for rare characters split into bytes, at least one character), at most the call's
``max_tokens`` (the provider wrote no more), at least one token per content event, or exactly
by the offline tokenizer when it is switched on and knows the model; when nothing countable
came, the most the call could write.
"""

from __future__ import annotations

from ampmeter.context import Call
from ampmeter.integrations.adapter import Tally
from ampmeter.pricing import tokenizer
from ampmeter.pricing.max_output import output_bound

__all__ = [
    "charge_unanswered_attempts",
    "estimate_cut_stream",
    "estimate_unreported",
    "received_output_tokens",
]


def received_output_tokens(tally: Tally, model: str | None, most: int | None) -> int | None:
    """The output tokens counted from what ``tally`` received, or None when nothing was, or
    when the response wrote output it did not send (``tally.unseen``: a reasoning model's):
    by the offline tokenizer when it is switched on, knows the model and the text was kept (a
    whole response), else a token per character, at most ``most`` (the call's ``max_tokens``)."""
    if tally.unseen or (tally.chars <= 0 and tally.chunks <= 0):
        return None
    count = tokenizer.COUNTERS[model] if model and tally.received else None
    if count is not None and tally.received:
        counted = count("".join(tally.received))
    else:
        counted = tally.chars if most is None else min(tally.chars, most)
    return max(counted, tally.chunks)


def estimate_unreported(call: Call, tally: Tally) -> None:
    """Estimate what ``tally`` lacks of the usage of ``call``'s request, which was sent and
    answered (see the module). A request always has input, so a missing input count is
    estimated. A missing output count is what was received; when nothing countable was, it
    is the most the call could write if the response reported no usage at all or wrote output
    it did not send, else 0 (Gemini leaves out counts that are 0)."""
    kind = call.kind
    if kind not in ("llm", "embedding"):
        return
    reserved_in, reserved_out, _, _ = call.reserved
    unreported = tally.tokens_in is None
    if unreported:
        tally.tokens_in = reserved_in
        tally.estimated = True
        if kind == "embedding" and tally.tokens_out is None:
            tally.tokens_out = 0
    if tally.tokens_out is None and kind == "llm":
        counted = received_output_tokens(tally, call.model, reserved_out or None)
        if counted is None and (unreported or tally.unseen):
            counted = reserved_out or output_bound(call.model, None)
        if counted is not None:
            tally.tokens_out = counted
            tally.estimated = True


def estimate_cut_stream(call: Call, tally: Tally) -> bool:
    """Complete the usage of a stream cut before its last event (its usage report, OpenAI's
    last, may not have come): what was not reported is estimated, and the output is at least
    what was received. True if anything was estimated. The output count of a response that
    wrote output unseen (``tally.unseen``) is not final before its report: it is estimated."""
    if tally.unseen:
        tally.tokens_out = None  # so far: the unseen output may be missing from it
    elif tally.tokens_in is not None and (tally.tokens_out or 0) >= tally.chunks:
        return False
    estimate_unreported(call, tally)  # the input if missing (the output too if nothing came)
    counted = received_output_tokens(tally, call.model, call.reserved[1] or None) or 0
    tally.tokens_out = max(tally.tokens_out or 0, counted)
    tally.estimated = True
    return True


def charge_unanswered_attempts(call: Call, tally: Tally) -> None:
    """Add to ``tally`` what the attempts the SDK retried after sending them and getting no
    answer (``tally.unanswered``) may have been billed: its reservation each, as for any
    request sent whose bill is unknown (the provider may have written the whole answer)."""
    reserved_in, reserved_out, _, _ = call.reserved
    attempts = tally.unanswered
    tally.tokens_in = (tally.tokens_in or 0) + attempts * reserved_in
    tally.tokens_out = (tally.tokens_out or 0) + attempts * reserved_out
    tally.estimated = True
