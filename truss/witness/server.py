"""``truss witness serve``: a C2SP tlog-witness over plain HTTP (not MCP).

Endpoints:

- ``POST /add-checkpoint``: the checks of ``truss.ledger.witness.check_submission`` (400, 404,
  403), the per-log rate limit (429 with ``Retry-After``), then the
  check-and-persist transaction of ``state.WitnessState.submit`` (409 with the latest size, 422
  kept as evidence, or 200 with the cosignature lines: Ed25519 type 0x04, plus ML-DSA-44 when
  the witness has that key);
- ``GET /<hex SHA-256 of the origin>/checkpoint``: the latest checkpoint it cosigned for that
  log, with the log's signature and its own cosignatures (404 before the first).

Bounds: a request body is at most ``witness.MAX_REQUEST_BYTES`` and needs a Content-Length
(411, 413); a connection that sends nothing for 10 s is dropped; at most 32 requests are handled
at once (503 beyond). The rate limit is a token bucket per log (``max_per_minute``), spent only by
validly signed requests, so no one but the log can exhaust it. ``WitnessService.handle`` is the
whole behaviour without sockets; ``serve`` binds it to 127.0.0.1 (or the host given) with the
standard library's threading HTTP server.
"""

from __future__ import annotations

import hashlib
import http.server
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from truss._clock import Clock
from truss._errors import StoreError
from truss.ledger.witness import MAX_REQUEST_BYTES, SIZE_CONTENT_TYPE, Refusal, check_submission, format_size
from truss.witness.state import STATE_FILE, WitnessDirConfig, WitnessState, load_dir_config, load_keys

__all__ = ["Answer", "WitnessService", "open_witness", "serve"]

_MAX_IN_FLIGHT = 32
_IDLE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    content_type: str = "text/plain; charset=utf-8"
    headers: tuple[tuple[str, str], ...] = ()


class _Bucket:
    __slots__ = ("stamp", "tokens")

    def __init__(self, tokens: float, stamp: float) -> None:
        self.tokens = tokens
        self.stamp = stamp


class WitnessService:
    """The witness without sockets: ``handle(method, path, body) -> Answer``."""

    def __init__(self, config: WitnessDirConfig, state: WitnessState, clock: Clock) -> None:
        self.config = config
        self.state = state
        self.clock = clock
        self.keys = load_keys(config.directory)
        self._trusted = config.trusted()
        self._by_hash = {hashlib.sha256(origin.encode()).hexdigest(): origin for origin in config.logs}
        self._buckets: dict[str, _Bucket] = {}
        self._bucket_lock = threading.Lock()

    @property
    def name(self) -> str:
        return self.keys[0].name

    def _take(self, origin: str) -> float | None:
        """Spend one request of ``origin``'s budget; the seconds to wait when it is spent."""
        rate = self.config.max_per_minute / 60.0
        now = self.clock.monotonic()
        with self._bucket_lock:
            bucket = self._buckets.get(origin)
            if bucket is None:
                bucket = self._buckets[origin] = _Bucket(float(self.config.max_per_minute), now)
            bucket.tokens = min(float(self.config.max_per_minute), bucket.tokens + (now - bucket.stamp) * rate)
            bucket.stamp = now
            if bucket.tokens >= 1.0:
                bucket.tokens -= 1.0
                return None
            return (1.0 - bucket.tokens) / rate

    def handle(self, method: str, path: str, body: bytes) -> Answer:
        if path == "/add-checkpoint":
            if method != "POST":
                return Answer(405, b"add-checkpoint takes POST\n", headers=(("Allow", "POST"),))
            return self.add_checkpoint(body)
        parts = path.strip("/").split("/")
        if len(parts) == 2 and parts[1] == "checkpoint" and method == "GET":
            origin = self._by_hash.get(parts[0])
            held = None if origin is None else self.state.latest_for(origin)
            if held is None:
                return Answer(404, b"no checkpoint cosigned for that log\n")
            return Answer(200, held.note)
        return Answer(404, b"not found\n")

    def add_checkpoint(self, body: bytes) -> Answer:
        try:
            submission = check_submission(body, self._trusted)
        except Refusal as refusal:
            return Answer(refusal.status, (refusal.message + "\n").encode())
        origin = submission.checkpoint.origin
        wait = self._take(origin)
        if wait is not None:
            seconds = str(max(1, int(wait + 0.999)))
            return Answer(429, b"too many requests for this log\n", headers=(("Retry-After", seconds),))
        try:
            status, lines, refusal, size = self.state.submit(submission, self.keys, self.clock.now_ms)
        except StoreError:
            return Answer(503, b"the witness cannot update its state right now\n")
        if status == 200:
            return Answer(200, b"".join(line.line().encode() for line in lines))
        if status == 409 and size is not None:
            return Answer(409, format_size(size), content_type=SIZE_CONTENT_TYPE)
        assert refusal is not None
        return Answer(status, (refusal.message + "\n").encode())


def _handler(service: WitnessService, slots: threading.BoundedSemaphore) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        server_version = "truss-witness"
        sys_version = ""
        timeout = _IDLE_TIMEOUT_S
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            return  # no access log on stderr; `truss witness show` reports what was cosigned

        def _send(self, answer: Answer) -> None:
            self.send_response(answer.status)
            self.send_header("Content-Type", answer.content_type)
            self.send_header("Content-Length", str(len(answer.body)))
            for name, value in answer.headers:
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(answer.body)

        def _serve(self, method: str) -> None:
            if not slots.acquire(blocking=False):
                self.close_connection = True
                self._send(Answer(503, b"the witness is busy; retry later\n", headers=(("Retry-After", "1"),)))
                return
            try:
                body = b""
                if method == "POST":
                    length = self.headers.get("Content-Length")
                    if length is None or not length.isdigit():
                        self.close_connection = True
                        self._send(Answer(411, b"a Content-Length is required\n"))
                        return
                    if int(length) > MAX_REQUEST_BYTES:
                        self.close_connection = True
                        self._send(Answer(413, b"the request is too large\n"))
                        return
                    body = self.rfile.read(int(length))
                self._send(service.handle(method, self.path.split("?", 1)[0], body))
            finally:
                slots.release()

        def do_POST(self) -> None:
            self._serve("POST")

        def do_GET(self) -> None:
            self._serve("GET")

    return Handler


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True


def serve(
    config: WitnessDirConfig,
    state: WitnessState,
    clock: Clock,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    ready: Callable[[str, int], None] | None = None,
    stop: threading.Event | None = None,
) -> None:
    """Serve until ``stop`` is set (or forever); ``ready(host, port)`` is called once it listens."""
    service = WitnessService(config, state, clock)
    server = _Server((host, port), _handler(service, threading.BoundedSemaphore(_MAX_IN_FLIGHT)))
    try:
        bound_host, bound_port = server.server_address[0], server.server_address[1]
        if ready is not None:
            ready(str(bound_host), int(bound_port))
        if stop is None:
            server.serve_forever(poll_interval=0.5)
            return
        thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
        thread.start()
        stop.wait()
        server.shutdown()
        thread.join(timeout=5)
    finally:
        server.server_close()


def open_witness(directory: Path) -> tuple[WitnessDirConfig, WitnessState]:
    """The config and state of the witness directory ``directory``."""
    return load_dir_config(directory), WitnessState(directory / STATE_FILE)
