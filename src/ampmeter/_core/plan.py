"""``Plan``: what every call of one kind and model in one context needs, compiled on the first
such call (:meth:`~ampmeter._core.steps.Admission.plan`) instead of worked out per call.

A plan holds the admission steps that can act on its kind (a step that never acts on it is not
asked), and per shape of usage (:class:`~ampmeter._core.usage.Shape`, the one shape cache):
where a reservation of that shape is held (each guard with the keys its limits watch), and the
cells a usage of that shape adds to when the call settles (its context and every context above
that is not folded: see :class:`~ampmeter._core.cells.Level`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ampmeter._core.usage import Shape, Usage

if TYPE_CHECKING:
    from ampmeter._core.cells import Cell, Level
    from ampmeter._core.steps import Admission, Step

__all__ = ["HoldPlan", "Plan"]

HoldPlan = tuple[tuple[tuple["Level", tuple[str, ...]], ...], tuple[str, ...], tuple[int, ...]]
"""Where a reservation is held: (each guard level with the keys held there, every key held
anywhere, each key's Usage field)."""


class Plan:
    """The compiled plan of one (kind, model) in one context (see the module docstring)."""

    __slots__ = ("_adds", "_holds", "admission", "admitters", "epoch")

    def __init__(self, admission: Admission, kind: str) -> None:
        self.admission = admission
        self.admitters: tuple[Step, ...] = tuple(
            step for step in admission.admitters if step.kinds is None or kind in step.kinds
        )
        self.epoch = admission.kernel.epoch
        self._holds: dict[Shape, HoldPlan] = {}
        self._adds: dict[Shape, tuple[tuple[Cell, int], ...]] = {}

    def holds(self, reservation: Usage) -> tuple[HoldPlan, dict[str, Any]]:
        """Where ``reservation`` is held, and its amount of each key held."""
        shape = reservation.shape()
        found = self._holds.get(shape)
        if found is None:
            found = self._hold_plan(shape)
        _, keys, fields = found
        return found, dict(zip(keys, map(reservation.__getitem__, fields), strict=True))

    def _hold_plan(self, shape: Shape) -> HoldPlan:
        holds = []
        watched: dict[str, int] = {}
        for frame in self.admission.guards:
            keys = tuple(k for k in shape.keys if any(lim.matches(k) for lim in frame.limits))
            if keys:
                holds.append((frame.level, keys))
                watched.update((k, f) for k, f, _ in shape.entries if k in keys)
        plan = (tuple(holds), tuple(watched), tuple(watched.values()))
        self.admission.kernel.note(plan[0])
        if shape.interned:
            self._holds[shape] = plan
        return plan

    def adds(self, usage: Usage) -> tuple[tuple[Cell, int], ...]:
        """The (cell, Usage field) pairs ``usage`` adds to when the call settles (under the
        kernel's lock; worked out again after a folded level began keeping its totals)."""
        epoch = self.admission.kernel.epoch
        if epoch != self.epoch:
            self._adds.clear()
            self.epoch = epoch
        shape = usage.shape()
        found = self._adds.get(shape)
        if found is None:
            found = self.admission.level.cells(shape.entries)
            if shape.interned:
                self._adds[shape] = found
        return found
