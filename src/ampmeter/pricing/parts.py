"""Billed parts: usage a provider bills at a rate of its own, beyond the six counts of a call.

Anthropic bills a 1-hour cache write at twice the input rate (a 5-minute one at 1.25 times);
OpenAI and Gemini bill audio (and Gemini images and video) at rates of their own; a server
tool (web search, file search) is billed per use. Each such part is named as genai-prices
names its usage (``cache_write_1h_tokens``, ``input_audio_tokens``, ``web_searches``, ...),
counted beside the call's counts (:meth:`ampmeter.Call.record`'s ``parts``), shown under the
same name in the node's metadata and priced here at its own rate where the table has one; a
part the table does not price is billed as its parent kind (audio input as input, a 1-hour
write as a cache write), exactly as genai-prices does. A token part is a subset of its parent
count: its tokens are priced at the part's rate instead of the parent's, never twice.

A model that prices no part has no part rates (:attr:`Rates.parts` None): its parts cost what
their parents do, and a call reporting none does no work here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Final, NamedTuple, TypeVar

from ampmeter import _validate

__all__ = [
    "PARTS",
    "PRICE_KEYS",
    "UNCAPPED_TOOL_USES",
    "check_parts",
    "fit_parts",
    "part_units",
    "resolve_part_rates",
    "server_tool_uses",
]


class _Part(NamedTuple):
    name: str  # genai-prices' usage key, and the node's metadata key
    price_key: str  # genai-prices' price key (USD per million tokens, or per thousand uses)
    parents: tuple[str, ...]  # price keys it is billed at when the model has no price for it
    base: int | None  # which of Rates.scaled its tokens are priced at without it (None: none)
    less: str | None = None  # a part of it priced on its own (cached audio, of audio)


def _modality(kind: str) -> tuple[_Part, ...]:
    """The parts of one modality: its input, the cached share of it, its output."""
    read = f"cache_{kind}_read"
    return (
        _Part(f"input_{kind}_tokens", f"input_{kind}_mtok", (), 0, f"{read}_tokens"),
        _Part(f"{read}_tokens", f"{read}_mtok", (f"input_{kind}_mtok", "cache_read_mtok"), 2),
        _Part(f"output_{kind}_tokens", f"output_{kind}_mtok", (), 1),
    )


# (In Rates.scaled: 0 input, 1 output, 2 cache read, 3 cache write.)
_SPECS: Final = (
    _Part("cache_write_1h_tokens", "cache_write_1h_mtok", ("cache_write_mtok",), 3),
    *_modality("audio"),
    *_modality("image"),
    *_modality("video"),
    _Part("web_searches", "web_searches_kcount", (), None),
    _Part("storage_searches", "storage_searches_kcount", (), None),
)
PARTS: Final = tuple(spec.name for spec in _SPECS)
"""The billed parts a call may report, in the order :attr:`Rates.parts` holds their rates."""
PRICE_KEYS: Final = tuple(spec.price_key for spec in _SPECS)
"""Their genai-prices price keys, in the same order (``set_price(part_prices=...)``)."""
_AT: Final = {spec.name: at for at, spec in enumerate(_SPECS)}
_BASE_KEYS: Final = ("input_mtok", "output_mtok", "cache_read_mtok", "cache_write_mtok")
_INPUT_TOKENS: Final = ("input_audio_tokens", "input_image_tokens", "input_video_tokens")
_CACHE_READS: Final = (
    "cache_audio_read_tokens",
    "cache_image_read_tokens",
    "cache_video_read_tokens",
)
_OUTPUT_TOKENS: Final = ("output_audio_tokens", "output_image_tokens", "output_video_tokens")

UNCAPPED_TOOL_USES: Final = 10
"""The uses of a billed server tool (web search, file search) a request is reserved for when it
states no cap (Anthropic's ``max_uses``, OpenAI's ``max_tool_calls``): a stated bound, as the
provider sets none."""

_Rate = TypeVar("_Rate")


def server_tool_uses(
    tools: object, parts: Mapping[str, str], cap_field: str | None, cap: object = None
) -> dict[str, int]:
    """The uses of billed server tools a request's ``tools`` allow, by billed part: a tool
    whose ``type`` starts with a key of ``parts`` (``{"web_search": "web_searches"}``) is
    reserved for its own ``cap_field`` (Anthropic's ``max_uses``), else the request's ``cap``
    (OpenAI's ``max_tool_calls``, for all its built-in tools), else
    :data:`UNCAPPED_TOOL_USES`."""
    found: dict[str, int] = {}
    if not isinstance(tools, list):
        return found
    for tool in tools:
        kind = tool.get("type") if isinstance(tool, dict) else None
        if not isinstance(kind, str):
            continue
        part = next((name for prefix, name in parts.items() if kind.startswith(prefix)), None)
        if part is None:
            continue
        uses = tool.get(cap_field) if cap_field is not None else None
        for bound in (uses, cap):
            if type(bound) is int and 0 <= bound <= _validate.MAX_COUNT:
                break
        else:
            bound = UNCAPPED_TOOL_USES
        found[part] = found.get(part, 0) + bound
    return found


def resolve_part_rates(
    price: Callable[[str], _Rate | None], zero: _Rate
) -> tuple[_Rate, ...] | None:
    """Each part's rate from ``price`` (a price key to the model's rate for it, None where it
    has none), per million units (a per-thousand price times 1,000 is the caller's to make):
    its own, else its first parent the model prices, else the parent kind of its base count
    (input, output, cache read, cache write, as the six rates resolve them), else ``zero`` (a
    server tool the model does not price, which genai-prices bills at 0). None when the model
    prices no part: every part then costs what its parent count does."""
    own = [price(spec.price_key) for spec in _SPECS]
    if all(rate is None for rate in own):
        return None
    rates: list[_Rate] = []
    for spec, rate in zip(_SPECS, own, strict=True):
        for key in spec.parents:
            if rate is None:
                rate = price(key)
        if rate is None and spec.base is not None:
            rate = price(_BASE_KEYS[spec.base])
            if rate is None and spec.base >= 2:  # a cache rate it lacks is its input rate
                rate = price("input_mtok")
        rates.append(zero if rate is None else rate)
    return tuple(rates)


def check_parts(parts: Mapping[str, object], counts: _validate.Counts) -> dict[str, int]:
    """``parts`` as a dict of checked counts (zeros left out): each name one of :data:`PARTS`
    and each count as :func:`ampmeter._validate.count` checks one; ``ValueError`` when parts
    exceed what they are part of in ``counts`` (the call's checked counts)."""
    if not isinstance(parts, Mapping):
        raise TypeError(f"parts must be a mapping of part names to counts, got {parts!r}")
    checked: dict[str, int] = {}
    for name, value in parts.items():
        if name not in _AT:
            raise ValueError(f"unknown billed part {name!r}; known parts: {', '.join(PARTS)}")
        count = _validate.count(value, f"parts[{name!r}]")
        if count:
            checked[name] = count
    for names, whole, what in _limits(checked, counts):
        total = sum(checked.get(name, 0) for name in names)
        if total > whole:
            listed = " + ".join(f"{name} ({checked.get(name, 0)})" for name in names)
            raise ValueError(f"the billed parts {listed} exceed {what} ({whole})")
    return checked


def fit_parts(parts: dict[str, int], counts: _validate.Counts) -> None:
    """Cut ``parts`` (counts a provider reported, each >= 0) in place until they fit ``counts``
    as :func:`check_parts` requires, the last named part of a sum first."""
    for names, whole, _ in _limits(parts, counts):
        excess = sum(parts.get(name, 0) for name in names) - max(whole, 0)
        for name in reversed(names):
            if excess <= 0:
                break
            cut = min(excess, parts.get(name, 0) - _floor(parts, name))
            if cut > 0:
                parts[name] -= cut
                excess -= cut


def _floor(parts: Mapping[str, int], name: str) -> int:
    """The least a part can be cut to: the cached part of it (cached audio is audio)."""
    less = _SPECS[_AT[name]].less
    return 0 if less is None else parts.get(less, 0)


def _limits(
    parts: Mapping[str, int], counts: _validate.Counts
) -> Iterator[tuple[tuple[str, ...], int, str]]:
    """The sums of parts that must not exceed a whole: (the parts, the whole, what it is), in
    the order a cut must go (a part's cached share is fitted before the part), each worked out
    from ``parts`` as they are when it is reached (:func:`fit_parts` cuts them on the way)."""
    t_in, t_out, cached, writes, reasoning, _ = counts
    yield ("cache_write_1h_tokens",), writes, "the cache-write tokens"
    yield _CACHE_READS, cached, "the cached tokens"
    for read, whole in zip(_CACHE_READS, _INPUT_TOKENS, strict=True):
        yield (read,), parts.get(whole, 0), f"{whole}"
    # Uncached media is uncached input: the media, less its cached share, fits in it.
    reads = sum(parts.get(name, 0) for name in _CACHE_READS)
    uncached = t_in - cached - writes + reads
    yield _INPUT_TOKENS, uncached, "the uncached input tokens (+ cached media)"
    yield _OUTPUT_TOKENS, t_out - reasoning, "the output tokens that are not reasoning"


def part_units(parts: Mapping[str, int], scaled: tuple[int, ...], own: tuple[int, ...]) -> int:
    """What ``parts`` (checked) add to a call's cost, in the units of its rates' ``scaled``
    (its six rates) and ``own`` (its part rates, scaled alike): each part's tokens at its own
    rate instead of the rate its parent count priced them at, a server tool's uses at theirs."""
    units = 0
    for name, count in parts.items():
        spec = _SPECS[_AT[name]]
        if spec.less is not None:
            count -= parts.get(spec.less, 0)
        base = 0 if spec.base is None else scaled[spec.base]
        units += count * (own[_AT[name]] - base)
    return units
