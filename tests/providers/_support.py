"""Support of the provider tests: a loopback HTTP server, a recording sleep, wire files, contracts.

``LoopbackServer`` is a real HTTP server on 127.0.0.1 (``http.server`` in a thread) that answers
with scripted replies and records every request, so the bytes on the wire, the headers, retries
and connection handling are the real ones.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from truss.contract import Contract

WIRE = Path(__file__).parent / "wire"


def wire(name: str) -> Any:
    """A recorded wire-format answer from ``wire/``."""
    return json.loads((WIRE / name).read_text())


def make_contract(**agent: Any) -> Contract:
    """A minimal contract whose ``[agent]`` table is ``agent``."""
    return Contract.model_validate({"contract": {"name": "provider-test", "intent": "test"}, "agent": agent})


@dataclass(frozen=True)
class Reply:
    """One scripted answer. ``body`` is JSON-encoded unless it is bytes; ``drop`` closes the
    connection without answering."""

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict[str, str])
    drop: bool = False


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


class _QuietServer(ThreadingHTTPServer):
    """A client that went away mid-answer (a run killed on purpose) is not an error of the server."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], BrokenPipeError | ConnectionResetError):
            return
        super().handle_error(request, client_address)


class LoopbackServer:
    """Answers requests in order from the replies given to ``reply`` (or, given ``respond``, with what
    it returns for each request: for clients that send several requests at once); records what it
    received."""

    def __init__(self, respond: Callable[[Recorded], Reply] | None = None) -> None:
        self._respond = respond
        self._replies: deque[Reply] = deque()
        self.requests: list[Recorded] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length)
                try:
                    body: Any = json.loads(raw)
                except ValueError:
                    body = raw
                recorded = Recorded("POST", self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                with server._lock:
                    server.requests.append(recorded)
                    if server._respond is not None:
                        reply = server._respond(recorded)
                    else:
                        reply = server._replies.popleft() if server._replies else Reply(599, {"error": "no reply"})
                if reply.drop:
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                payload = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
                self.send_response(reply.status)
                headers = {"content-type": "application/json", "content-length": str(len(payload)), **reply.headers}
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self._httpd = _QuietServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        # A short poll interval only bounds how long ``close`` waits for the serving thread.
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def reply(self, *replies: Reply) -> None:
        with self._lock:
            self._replies.extend(replies)

    def start(self) -> LoopbackServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


def closed_port_url() -> str:
    """An http URL on 127.0.0.1 where nothing listens (connections are refused)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


class RecordingSleep:
    """A ``sleep`` that records the delays asked for and returns at once."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)
