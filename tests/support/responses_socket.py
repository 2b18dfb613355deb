"""A loopback server speaking the Responses API's WebSocket protocol with recorded bodies.

It answers each ``response.create`` with the documented event sequence (``response.created``, an
output text delta, ``response.completed``) around the recorded Responses object, so the usage a
metered node must end with is known exactly. ``error_mid_response``: an ``error`` event
(a server error mid-generation) comes where ``response.completed`` would have.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from websockets.sync.server import ServerConnection, serve

from ampmeter.testing import recorded

_SERVER_ERROR = {
    "type": "error",
    "sequence_number": 2,
    "code": "server_error",
    "message": "The server had an error while processing your request.",
    "param": None,
}


class ResponsesSocket:
    """A loopback server speaking the Responses WebSocket protocol with recorded bodies."""

    def __init__(self, *, error_mid_response: bool = False) -> None:
        self.creates: list[dict[str, Any]] = []
        self.error_mid_response = error_mid_response
        self._server = serve(self._handle, "127.0.0.1", 0)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def _handle(self, socket: ServerConnection) -> None:
        for message in socket:
            event = json.loads(message)
            if event.get("type") != "response.create":
                continue
            self.creates.append(event)
            number = len(self.creates)
            response = recorded.load("openai_responses_usage")
            response["id"] = f"resp_ws{number}"
            started = {**response, "status": "in_progress", "usage": None, "output": []}
            for out in (
                {"type": "response.created", "sequence_number": 0, "response": started},
                {
                    "type": "response.output_text.delta",
                    "sequence_number": 1,
                    "item_id": "m",
                    "output_index": 0,
                    "content_index": 0,
                    "delta": "Looking",
                    "logprobs": [],
                },
                _SERVER_ERROR
                if self.error_mid_response
                else {"type": "response.completed", "sequence_number": 2, "response": response},
            ):
                socket.send(json.dumps(out))

    def __enter__(self) -> ResponsesSocket:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._thread.join()

    @property
    def base_url(self) -> str:
        host, port = self._server.socket.getsockname()[:2]
        return f"http://{host}:{port}/v1"
