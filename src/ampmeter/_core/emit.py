"""Where a context's ended nodes go: its sinks, with their failures kept, never raised mid-call."""

from __future__ import annotations

import warnings
from typing import Protocol

from ampmeter.node import Node

__all__ = ["Emitter", "Sink"]


class Sink(Protocol):
    """Where ended nodes go, as the core sees it (:class:`ampmeter.sinks.base.Sink` is one)."""

    def emit(self, node: Node, chain_id: str) -> None:
        """Take one ended node of chain ``chain_id``."""

    def flush(self) -> None:
        """Write out what is buffered."""


class Emitter:
    """A context's sinks. A sink that fails never fails the call that produced the node: its
    first error is kept (with one warning per context) and every failure is counted."""

    __slots__ = ("chain_id", "errors", "failures", "name", "sinks")

    def __init__(self, name: str, chain_id: str, sinks: tuple[Sink, ...]) -> None:
        self.name = name
        self.chain_id = chain_id
        self.sinks = sinks
        self.errors: list[Exception] = []  # the first error of each failing sink
        self.failures: dict[int, int] = {}  # id(sink) -> how many times it failed

    def emit(self, node: Node) -> None:
        """Hand an ended node to every sink."""
        for sink in self.sinks:
            try:
                sink.emit(node, self.chain_id)
            except Exception as error:
                self.failed(sink, error)

    def flush(self) -> None:
        """Flush every sink (a context closing)."""
        for sink in self.sinks:
            try:
                sink.flush()
            except Exception as error:
                self.failed(sink, error)

    def failed(self, sink: Sink, error: Exception) -> None:
        """Keep a sink's first error (and count the rest); warn once per context."""
        failures = self.failures
        if not failures:
            warnings.warn(
                f"ampmeter: sink {type(sink).__name__} failed ({error}); the call went on and "
                f"was counted; context {self.name!r} raises the error at close()",
                RuntimeWarning,
                stacklevel=5,
            )
        count = failures.get(id(sink))
        if count is None:
            self.errors.append(error)
            failures[id(sink)] = 1
        else:
            failures[id(sink)] = count + 1
