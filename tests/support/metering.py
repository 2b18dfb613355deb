"""Fixtures of metered calls: SDKs and HTTP clients instrumented for one test, and a replay
server answering with recorded provider bodies. A folder whose tests use them imports them into
its conftest.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ampmeter.testing.replay import ReplayServer


@pytest.fixture
def instrumented() -> Iterator[None]:
    """SDKs and HTTP clients metered for the test (priced by the real table), unpatched after;
    a test module asks for it with ``pytestmark = pytest.mark.usefixtures("instrumented")``."""
    from ampmeter.integrations import instrument, uninstrument

    instrument()
    yield
    uninstrument()


@pytest.fixture
def replay() -> Iterator[ReplayServer]:
    """A replay server (recorded provider wire bodies) on loopback for the test."""
    with ReplayServer() as server:
        yield server
