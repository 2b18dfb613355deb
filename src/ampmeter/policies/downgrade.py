"""A downgrade ladder (``downgrade={0.8: {"gpt-4o": "gpt-4o-mini"}}``; ``docs/containment.md``
says how rungs name models): past each fraction of the cost ceiling, instrumented requests for
the named models go to a cheaper one. The ladder relieves budget pressure as a hook would, so it
sees the request before it is measured and reserved: the reservation is priced at the model
that is sent. The node keeps the model asked for (``requested_model``). A context has one hook
or one ladder: its own replaces the one it inherits.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from ampmeter.limits import ExceededLimit, warn_fractions
from ampmeter.policies.options import Option, Policy
from ampmeter.policies.step import Relief

if TYPE_CHECKING:
    from ampmeter._core.steps import Admission
    from ampmeter.policies.configured import ConfiguredPolicies

__all__ = ["META_REQUESTED_MODEL", "POLICY", "Downgrade", "DowngradeLadder"]

META_REQUESTED_MODEL: Final = "requested_model"
ANY_MODEL: Final = "*"


class DowngradeLadder:
    """The rungs of a ``downgrade=`` mapping, checked (see the module)."""

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

    def target(self, model: str, spent: float) -> str | None:
        """The model the highest rung ``spent`` (the largest share of a cost ceiling spent)
        reaches that names ``model`` sends it to; None when no such rung names it."""
        for index, (at, swaps) in enumerate(self.rungs):
            if spent >= at:
                found = self._target(index, swaps, model)
                if found is not None:
                    return found
        return None

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


class Downgrade(Relief):
    """The downgrade ladder of one context's calls (see the module docstring)."""

    __slots__ = ("ladder",)

    def __init__(self, admission: Admission, ladder: DowngradeLadder) -> None:
        super().__init__(admission)
        self.ladder = ladder

    def relieve(
        self, ctx: Any, request: dict[str, Any], notes: dict[str, Any]
    ) -> ExceededLimit | None:
        """Send ``request`` to the cheaper model its rung names, the model asked for noted."""
        model = request.get("model")
        if isinstance(model, str):
            target = self.ladder.target(model, self.spent())
            if target is not None and target != model:
                request["model"] = target
                notes[META_REQUESTED_MODEL] = model
        return None  # a ladder never refuses


def _make(admission: Admission, configured: ConfiguredPolicies) -> Downgrade | None:
    ladder = configured.values.downgrade
    if ladder is None:
        return None
    step = Downgrade(admission, ladder)
    return step if step.ceilings else None


def _one_relief(values: dict[str, Any]) -> None:
    """A context's own ladder or hook replaces the other one it would inherit (None set here
    overrides it); giving both is a mistake."""
    if "downgrade" in values:
        if "on_budget_pressure" in values:
            raise ValueError(
                "give downgrade= or on_budget_pressure=, not both (the ladder is a pressure hook)"
            )
        values["on_budget_pressure"] = None
    elif "on_budget_pressure" in values:
        values["downgrade"] = None


POLICY = Policy(
    "downgrade",
    (Option("downgrade", DowngradeLadder, inherited=True),),
    _make,
    translate=_one_relief,
)
"""``downgrade``, inherited."""
