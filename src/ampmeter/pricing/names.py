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

from functools import lru_cache

__all__ = ["model_identity", "user_price_names"]


def user_price_names(model: str) -> tuple[list[str], str | None]:
    """The names a price set with :func:`ampmeter.set_price` is found by, in order: ``model``
    in lower case, then without its provider prefix (when it has one the table knows); and
    the provider that prefix names (None without one)."""
    from ampmeter.pricing.genai_table import split_provider

    names = [model.lower()]
    prefixed = split_provider(model) if "/" in model else None
    if prefixed is None:
        return names, None
    names.append(prefixed[1].lower())
    return names, prefixed[0]


@lru_cache(maxsize=1024)
def model_identity(model: str) -> str:
    """The name prices know ``model`` by (see the module): two names that are priced as the same
    model have the same identity. Reads the price table the first time it is asked about a
    name (loading it once per process, about as long as the first priced call's lookup)."""
    from ampmeter.pricing.genai_table import table_model_id

    found = table_model_id(model, None)
    if found is not None:
        return found.lower()
    return user_price_names(model)[0][-1]
