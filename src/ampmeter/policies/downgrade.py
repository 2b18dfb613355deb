"""A downgrade ladder (``downgrade={0.8: {"gpt-4o": "gpt-4o-mini"}}``; ``docs/containment.md``
says how rungs name models): past each fraction of the cost ceiling, instrumented requests for
the named models go to a cheaper one. The ladder is the context's ``on_budget_pressure`` hook,
with ``pressure_at`` its lowest rung, so it sees the request before it is measured and reserved:
the reservation is priced at the model that is sent. The node keeps the model asked for
(``requested_model``).
"""

from __future__ import annotations

import contextvars
from collections.abc import Mapping
from typing import Any, Final

from ampmeter.limits import warn_fractions

__all__ = ["META_REQUESTED_MODEL", "DowngradeLadder", "take_requested_model"]

META_REQUESTED_MODEL: Final = "requested_model"
ANY_MODEL: Final = "*"

_REQUESTED: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "ampmeter_requested_model", default=None
)


class DowngradeLadder:
    """The rungs of a ``downgrade=`` mapping, as a budget-pressure hook (see the module)."""

    __slots__ = ("_by_identity", "rungs")

    def __init__(self, ladder: object) -> None:
        if not isinstance(ladder, Mapping) or not ladder:
            raise TypeError(
                "downgrade must map fractions of the cost limit to {model: cheaper model}, "
                f"got {ladder!r}"
            )
        rungs = []
        for fraction, swaps in ladder.items():
            (at,) = warn_fractions((fraction,), "a downgrade fraction")
            if not isinstance(swaps, Mapping) or not swaps:
                raise TypeError(f"downgrade[{fraction!r}] must map model names, got {swaps!r}")
            for source, target in swaps.items():
                if not (isinstance(source, str) and source and isinstance(target, str) and target):
                    raise TypeError(
                        f"downgrade[{fraction!r}] must map model names to model names, "
                        f"got {source!r}: {target!r}"
                    )
            rungs.append((at, dict(swaps)))
        self.rungs = tuple(sorted(rungs, key=lambda rung: rung[0], reverse=True))
        # Each rung's named models by identity, made the first time a request needs it (it
        # reads the price table, which a ladder must not load before a rung is reached).
        self._by_identity: list[dict[str, str] | None] = [None] * len(self.rungs)

    @property
    def lowest(self) -> float:
        """The first fraction at which the ladder acts."""
        return self.rungs[-1][0]

    def swapped(self, request: dict[str, Any], spent: float) -> dict[str, Any]:
        """The request, its model swapped by the highest rung ``spent`` (the largest share of
        a cost ceiling spent) reaches that names it."""
        model = request.get("model")
        if not isinstance(model, str):
            return request
        for index, (at, swaps) in enumerate(self.rungs):
            if spent < at:
                continue
            target = self._target(index, swaps, model)
            if target is not None:
                if target != model:
                    request["model"] = target
                    _REQUESTED.set(model)
                return request
        return request

    def _target(self, index: int, swaps: dict[str, str], model: str) -> str | None:
        """The model rung ``index`` sends ``model`` to: by its exact name, else by the model
        it is priced as, else by ``"*"``; None when the rung does not name it."""
        exact = swaps.get(model)
        if exact is not None:
            return exact
        from ampmeter.pricing.names import model_identity

        named = self._by_identity[index]
        if named is None:
            named = {}
            for source, target in swaps.items():
                if source != ANY_MODEL:
                    named.setdefault(model_identity(source), target)
            self._by_identity[index] = named
        found = named.get(model_identity(model)) if named else None
        return found if found is not None else swaps.get(ANY_MODEL)


def take_requested_model() -> str | None:
    """The model the request about to begin asked for before the ladder swapped it (once)."""
    model = _REQUESTED.get()
    if model is not None:
        _REQUESTED.set(None)
    return model
