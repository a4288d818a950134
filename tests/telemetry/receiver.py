"""A real OTLP/HTTP trace receiver on 127.0.0.1, built on the official OTLP protobuf definitions.

The OpenTelemetry Collector itself is not installable here from a package registry we can trust
(the only PyPI wheel that carries an ``otelcol`` binary is an anonymous repackaging with no
provenance to check), so the tests receive spans with the next best thing: an HTTP server that
accepts ``POST /v1/traces`` exactly as a collector's ``otlphttp`` receiver does and decodes each
body with ``opentelemetry-proto``'s ``ExportTraceServiceRequest``:

- ``application/x-protobuf``: ``ExportTraceServiceRequest.FromString``;
- ``application/json``: the OTLP/JSON encoding (hex trace and span ids), parsed into the same
  message with ``google.protobuf.json_format`` after the ids are turned into the bytes the message
  holds, so a document that is not a valid request is refused (400) like a collector refuses it;
- ``Content-Encoding: gzip`` bodies are inflated first.

Anything that does not decode gets 400 and is kept in ``refused``. The receiver answers with an
``ExportTraceServiceResponse`` (or its JSON), can be told to answer with another status, to hold
every request until released (a collector that hangs), to refuse the first requests with 503, or
to require a header. ``spans()`` flattens
every received span into plain values (hex ids, Python attribute values) for assertions.
"""

from __future__ import annotations

import base64
import gzip
import json
import threading
from collections.abc import Generator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, cast

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

__all__ = ["Received", "Receiver", "decode_json_request", "flatten", "receiver"]

_ID_FIELDS = ("traceId", "spanId", "parentSpanId")


@dataclass
class Received:
    """One request the receiver took: its headers (lower-case names), raw body and decoded message."""

    path: str
    headers: dict[str, str]
    body: bytes
    request: ExportTraceServiceRequest
    content_type: str


@dataclass
class Receiver:
    host: str = "127.0.0.1"
    port: int = 0
    requests: list[Received] = field(default_factory=list[Received])
    refused: list[tuple[str, str]] = field(default_factory=list[tuple[str, str]])  # (content type, why)
    status: int = 200  # what to answer
    fail_first: int = 0  # answer this many requests with 503 first (a collector that is starting up)
    answered_503: int = 0
    require_header: tuple[str, str] | None = None
    hold: threading.Event | None = None  # set: requests wait until it is set (bounded by hold_s)
    hold_s: float = 30.0
    lock: threading.Lock = field(default_factory=threading.Lock)
    arrived: threading.Condition = field(default_factory=threading.Condition)

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def spans(self) -> list[dict[str, Any]]:
        with self.lock:
            return [s for r in self.requests for s in flatten(r.request)]

    def wait_for(self, count: int, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """The received spans once there are at least ``count`` (fails after ``timeout_s``)."""
        with self.arrived:
            ok = self.arrived.wait_for(lambda: len(self.spans()) >= count, timeout=timeout_s)
        if not ok:
            raise AssertionError(f"the receiver got {len(self.spans())} span(s), not {count}, in {timeout_s}s")
        return self.spans()


def _ids_to_base64(value: Any) -> Any:
    """OTLP/JSON ids are hex; the protobuf JSON mapping of a ``bytes`` field is base64."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in cast(dict[str, Any], value).items():
            if key in _ID_FIELDS and isinstance(item, str):
                out[key] = base64.b64encode(bytes.fromhex(item)).decode("ascii")
            else:
                out[key] = _ids_to_base64(item)
        return out
    if isinstance(value, list):
        return [_ids_to_base64(v) for v in cast(list[Any], value)]
    return value


def decode_json_request(body: bytes) -> ExportTraceServiceRequest:
    """An OTLP/JSON body as the ``ExportTraceServiceRequest`` it encodes (``ValueError`` when it is not one)."""
    value = json.loads(body)
    request = ExportTraceServiceRequest()
    try:
        json_format.ParseDict(_ids_to_base64(value), request, ignore_unknown_fields=False)
    except json_format.ParseError as exc:
        raise ValueError(str(exc)) from exc
    return request


def _any(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_any(v) for v in value.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _any(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, which) if which else None


def flatten(request: ExportTraceServiceRequest) -> list[dict[str, Any]]:
    """Every span of ``request`` as plain values: hex ids, attributes as a dict, resource and scope."""
    out: list[dict[str, Any]] = []
    for rs in request.resource_spans:
        resource = {kv.key: _any(kv.value) for kv in rs.resource.attributes}
        for ss in rs.scope_spans:
            for span in ss.spans:
                out.append({
                    "trace_id": span.trace_id.hex(),
                    "span_id": span.span_id.hex(),
                    "parent_span_id": span.parent_span_id.hex() or None,
                    "name": span.name,
                    "kind": int(span.kind),
                    "start_ns": int(span.start_time_unix_nano),
                    "end_ns": int(span.end_time_unix_nano),
                    "attributes": {kv.key: _any(kv.value) for kv in span.attributes},
                    "events": [
                        {"name": e.name, "attributes": {kv.key: _any(kv.value) for kv in e.attributes}}
                        for e in span.events
                    ],
                    "status": int(span.status.code),
                    "resource": resource,
                    "scope": {"name": ss.scope.name, "version": ss.scope.version},
                })  # fmt: skip
    return out


def _handler(state: Receiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            if state.hold is not None:
                state.hold.wait(state.hold_s)
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            headers = {k.lower(): v for k, v in self.headers.items()}
            content_type = headers.get("content-type", "").split(";")[0].strip()
            if self.path != "/v1/traces":
                return self._answer(404, b"", "text/plain")
            if state.require_header is not None and headers.get(state.require_header[0]) != state.require_header[1]:
                return self._answer(401, b"", "text/plain")
            try:
                data = gzip.decompress(body) if headers.get("content-encoding") == "gzip" else body
                if content_type == "application/x-protobuf":
                    request = ExportTraceServiceRequest.FromString(data)
                elif content_type == "application/json":
                    request = decode_json_request(data)
                else:
                    raise ValueError(f"unsupported content type {content_type!r}")
            except Exception as exc:
                with state.lock:
                    state.refused.append((content_type, str(exc)))
                return self._answer(400, b"", "text/plain")
            if state.status != 200:
                return self._answer(state.status, b"", "text/plain")
            with state.lock:
                unavailable = state.answered_503 < state.fail_first
                state.answered_503 += unavailable
            if unavailable:
                return self._answer(503, b"", "text/plain")
            with state.lock:
                state.requests.append(Received(self.path, headers, data, request, content_type))
            with state.arrived:
                state.arrived.notify_all()
            answer = ExportTraceServiceResponse()
            if content_type == "application/json":
                self._answer(200, json_format.MessageToJson(answer).encode(), "application/json")
            else:
                self._answer(200, answer.SerializeToString(), "application/x-protobuf")

        def _answer(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return Handler


@contextmanager
def receiver(**options: Any) -> Generator[Receiver]:
    """A running receiver on a free port of 127.0.0.1, stopped on exit."""
    state = Receiver(**options)
    server = ThreadingHTTPServer((state.host, 0), _handler(state))
    server.daemon_threads = True
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, name="otlp-receiver", daemon=True)
    thread.start()
    try:
        yield state
    finally:
        if state.hold is not None:
            state.hold.set()
        server.shutdown()
        server.server_close()
        thread.join(10)
