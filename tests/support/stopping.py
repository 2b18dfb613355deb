"""Stopping a test server while it is still answering a request."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from ampmeter.testing import ReplayServer


def stop_while_answering(
    server: ReplayServer,
    ask: Callable[[], object],
    received: Callable[[], bool],
    before: set[threading.Thread],
) -> list[BaseException]:
    """Send one request (``ask``) from another thread, stop ``server`` once ``received`` says
    the request arrived, and check that no thread the server started (``before``: the threads
    alive before it started) outlives the stop. The errors the request ended with."""
    errors: list[BaseException] = []

    def asking() -> None:
        try:
            ask()
        except BaseException as error:  # the connection ends without an answer
            errors.append(error)

    thread = threading.Thread(target=asking)
    thread.start()
    deadline = time.monotonic() + 10
    while not received() and time.monotonic() < deadline:
        time.sleep(0.01)
    serving = set(threading.enumerate()) - before - {thread}  # the server's and the handler's
    server.stop()
    thread.join(10)
    for started in serving:  # none waits out the answer's delay
        started.join(5)
        assert not started.is_alive(), started
    return errors
