"""How a model's name is matched: the one rule prices use, shared by everything else that names
models (a downgrade ladder's rungs).

A name means the model the price table prices it as: case does not matter, a dated snapshot
or alias the table prices as another model is that model (``GPT-4o``, ``gpt-4o-2024-08-06``
and ``openai/gpt-4o`` are all ``gpt-4o``), while one the table prices on its own stays its own
(``gpt-4o-2024-05-13``). A name the table does not know matches as :func:`ampmeter.set_price`
matches it: in lower case, without a provider prefix the table knows (``openai/my-model`` is
``my-model``).
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

__all__ = ["longest_prefix", "model_identity", "user_price_names"]


def longest_prefix(prefixes: Iterable[str], model: object, separators: str = "") -> str | None:
    """The longest of ``prefixes`` that ``model``'s name (in lower case, without a provider
    prefix) starts with, or None: the rule every per-family table (output limits, encodings,
    image and tool-prompt rules) is read by. With ``separators``, only a prefix followed by one
    of them or by the end of the name counts (``gpt-4`` is not ``gpt-40``)."""
    name = model.rpartition("/")[2].lower() if isinstance(model, str) else ""
    found: str | None = None
    for prefix in prefixes:
        if not name.startswith(prefix) or (found is not None and len(found) >= len(prefix)):
            continue
        if not separators or len(name) == len(prefix) or name[len(prefix)] in separators:
            found = prefix
    return found


def user_price_names(model: str) -> tuple[list[str], str | None]:
    """The names a price set with :func:`ampmeter.set_price` is found by, in order: ``model``
    in lower case, then without its provider prefix (when it has one the table knows); and
    the provider that prefix names (None without one)."""
    from ampmeter.pricing.genai_table import split_provider

    prefixed = split_provider(model) if "/" in model else None
    if prefixed is None:
        return [model.lower()], None
    return [model.lower(), prefixed[1].lower()], prefixed[0]


@lru_cache(maxsize=1024)
def model_identity(model: str) -> str:
    """The name prices know ``model`` by (see the module): two names that are priced as the same
    model have the same identity. Reads the price table the first time it is asked about a
    name (loading it once per process, about as long as the first priced call's lookup)."""
    from ampmeter.pricing.genai_table import table_model_id

    found = table_model_id(model, None)
    return found.lower() if found is not None else user_price_names(model)[0][-1]
