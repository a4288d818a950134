"""Sending spans: a bounded queue, one background thread, OTLP over HTTP, and counts of what was lost.

A run's event subscriber only builds a span and offers it (``BatchExporter.offer``): a lock, an
append, never a wait. When the queue holds ``max_queue_spans`` the span is dropped and counted.
One daemon thread takes batches of up to ``max_batch_spans`` when a batch is full or
``schedule_delay_s`` has passed, reads the payloads the operator opted into (``truss.telemetry.reading``),
encodes the batch (``truss.telemetry._proto`` or ``otlp_json``) and POSTs it with httpx2, the one
HTTP stack Truss uses. Each POST is bounded by ``timeout_s`` in total: a connection error, a
timeout, 429, 502, 503 or 504 is retried with backoff (honouring ``Retry-After``) while time is
left, anything else fails the batch at once. A failed batch is counted, never retried later, and
never raised: an unreachable collector cannot change a run's outcome.

``close(timeout)`` sends what is queued and waits at most ``timeout`` (the settings'
``shutdown_timeout_s``); spans still queued then are counted as unsent. ``ExportStats`` reports
every span: exported, dropped (queue full), failed (the collector refused or was unreachable),
rejected (the collector's partial success), unsent (still queued at close).

Before a batch is encoded, every string attribute, span name and span event (name and attributes)
is scrubbed of the known secret values (the telemetry headers' values and any the caller adds with
``remember``): spans hold no secrets by construction, and this keeps it so if a secret ever reached
a reason, a payload, a tool's name or a server's report.
"""

from __future__ import annotations

import dataclasses
import gzip
import importlib
import logging
import re
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from truss._clock import Clock
from truss.telemetry.spans import AttrValue, SpanEvent, SpanRecord, with_attributes

__all__ = ["REDACTED", "BatchExporter", "ExportStats", "OtlpHttpSender", "Sender"]

_log = logging.getLogger("truss.telemetry")

REDACTED = "[redacted]"
_RETRY_STATUS = frozenset({429, 502, 503, 504})
_MIN_SECRET = 4


class ExportFailed(Exception):
    """A batch the collector did not take (``reason`` is short and holds no header or secret)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


Sender = Callable[[Sequence[SpanRecord]], int]
"""Sends one batch; returns how many spans the collector rejected (partial success); raises ``ExportFailed``."""


@dataclass
class ExportStats:
    """What became of every span offered (see the module docstring)."""

    offered: int = 0
    exported: int = 0
    dropped: int = 0
    failed: int = 0
    rejected: int = 0
    unsent: int = 0
    batches: int = 0
    last_error: str | None = None
    errors: int = 0

    @property
    def lost(self) -> int:
        return self.dropped + self.failed + self.rejected + self.unsent

    def to_json(self) -> dict[str, Any]:
        return {
            "offered": self.offered,
            "exported": self.exported,
            "dropped": self.dropped,
            "failed": self.failed,
            "rejected": self.rejected,
            "unsent": self.unsent,
            "batches": self.batches,
            "last_error": self.last_error,
        }


@dataclass
class _Secrets:
    values: set[str] = field(default_factory=set[str])
    pattern: re.Pattern[str] | None = None

    def add(self, values: Iterable[str]) -> None:
        for value in values:
            if len(value) >= _MIN_SECRET and value not in self.values:
                self.values.add(value)
                self.pattern = None

    def scrub(self, span: SpanRecord) -> SpanRecord:
        if not self.values:
            return span
        if self.pattern is None:
            ordered = sorted(self.values, key=len, reverse=True)
            self.pattern = re.compile("|".join(re.escape(v) for v in ordered))
        pattern = self.pattern
        changed = _scrubbed(span.attributes, pattern)
        # The name holds a server's tool name; a span event's attributes are a server's report,
        # copied as it came (a sandbox's egress method, say): both are scrubbed as attributes are.
        name = pattern.sub(REDACTED, span.name)
        events: list[SpanEvent] = []
        for event in span.events:
            found = _scrubbed(event.attributes, pattern)
            event_name = pattern.sub(REDACTED, event.name)
            if found or event_name != event.name:
                events.append(dataclasses.replace(event, name=event_name, attributes={**event.attributes, **found}))
            else:
                events.append(event)
        if not changed and name == span.name and events == list(span.events):
            return span
        return dataclasses.replace(with_attributes(span, changed), name=name, events=tuple(events))


def _scrubbed(attributes: Mapping[str, AttrValue], pattern: re.Pattern[str]) -> dict[str, AttrValue]:
    """The attributes of ``attributes`` that hold a secret, with each secret replaced."""
    changed: dict[str, AttrValue] = {}
    for key, value in attributes.items():
        if isinstance(value, str) and pattern.search(value):
            changed[key] = pattern.sub(REDACTED, value)
        elif isinstance(value, tuple) and any(pattern.search(v) for v in value):
            changed[key] = tuple(pattern.sub(REDACTED, v) for v in value)
    return changed


class BatchExporter:
    """The bounded queue and the thread that drains it (see the module docstring)."""

    def __init__(
        self,
        send: Sender,
        *,
        clock: Clock,
        max_queue_spans: int = 2048,
        max_batch_spans: int = 512,
        schedule_delay_s: float = 5.0,
        resolve: Callable[[SpanRecord], SpanRecord] | None = None,
        secrets: Iterable[str] = (),
        prepare: Callable[[], None] | None = None,
    ) -> None:
        self._send = send
        self._prepare = prepare
        self._clock = clock
        self._max_queue = max(1, max_queue_spans)
        self._max_batch = max(1, min(max_batch_spans, self._max_queue))
        self._delay_s = max(0.0, schedule_delay_s)
        self._resolve = resolve
        self._secrets = _Secrets()
        self._secrets.add(secrets)
        self._queue: deque[SpanRecord] = deque()
        self._cond = threading.Condition(threading.Lock())
        self._closing = False
        self._in_flight = 0
        self.stopping = threading.Event()  # set by close: a sender stops retrying and gives up at once
        self.stats = ExportStats()
        self._thread = threading.Thread(target=self._run, name="truss-telemetry", daemon=True)
        self._thread.start()

    def remember(self, values: Iterable[str]) -> None:
        """More secret values to scrub from every span sent from now on."""
        with self._cond:
            self._secrets.add(values)

    def offer(self, span: SpanRecord) -> None:
        """Queue ``span``; never blocks. A full queue (or a closed exporter) drops it and counts the drop."""
        with self._cond:
            self.stats.offered += 1
            if self._closing or len(self._queue) >= self._max_queue:
                self.stats.dropped += 1
                return
            self._queue.append(span)
            if len(self._queue) >= self._max_batch:
                self._cond.notify()

    def close(self, timeout_s: float) -> ExportStats:
        """Send what is queued, waiting at most ``timeout_s``; the stats of the exporter's whole life."""
        with self._cond:
            self._closing = True
            self._cond.notify()
        self.stopping.set()
        self._thread.join(max(0.0, timeout_s))
        with self._cond:
            stats = dataclasses.replace(self.stats)
            stats.unsent += len(self._queue) + self._in_flight
            return stats

    @property
    def finished(self) -> bool:
        """True once the thread has ended (everything queued was sent or given up)."""
        return not self._thread.is_alive()

    # -- the thread --

    def _run(self) -> None:
        if self._prepare is not None:
            # Imports and the HTTP client, while the run is still starting its servers: otherwise
            # the first send (often the last batch, at the end of a short run) pays for them.
            try:
                self._prepare()
            except Exception:  # the first send meets the same problem, and counts it
                _log.debug("telemetry: preparing the sender failed", exc_info=True)
        while True:
            with self._cond:
                deadline = self._clock.monotonic() + self._delay_s
                while not self._closing and len(self._queue) < self._max_batch:
                    left = deadline - self._clock.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                if not self._queue:
                    if self._closing:
                        return
                    continue
                batch = [self._queue.popleft() for _ in range(min(self._max_batch, len(self._queue)))]
                self._in_flight = len(batch)
                secrets = self._secrets
            self._export(batch, secrets)

    def _export(self, batch: list[SpanRecord], secrets: _Secrets) -> None:
        exported = rejected = failed = 0
        reason: str | None = None
        try:
            ready = [secrets.scrub(self._with_content(s)) for s in batch]
            rejected = min(self._send(ready), len(batch))
            exported = len(batch) - rejected
        except ExportFailed as exc:
            failed, reason = len(batch), exc.reason
        except Exception as exc:  # an exporter bug must not reach the run: count it, log it
            _log.debug("telemetry export raised", exc_info=True)
            failed, reason = len(batch), type(exc).__name__
        with self._cond:
            self._in_flight = 0
            self.stats.batches += 1
            self.stats.exported += exported
            self.stats.rejected += rejected
            self.stats.failed += failed
            if reason is not None:
                self.stats.errors += 1
                self.stats.last_error = reason
        if reason is not None:
            _log.debug("telemetry: a batch of %d span(s) was not delivered: %s", failed, reason)

    def _with_content(self, span: SpanRecord) -> SpanRecord:
        if span.content is None or self._resolve is None:
            return span
        try:
            return self._resolve(span)
        except Exception:  # a payload that cannot be read is left out, the span still goes
            _log.debug("telemetry: the payloads of %s could not be read", span.key, exc_info=True)
            return with_attributes(span, {})


class OtlpHttpSender:
    """POSTs batches to an OTLP/HTTP traces endpoint (protobuf or JSON), with bounded retries.

    Built and used in the exporter's thread only: ``prepare`` (the exporter's thread calls it when it
    starts) imports the encoder and httpx2 and opens the client, so a run without telemetry never
    loads the protobuf definitions and a run with it does not wait for them at its end.
    """

    def __init__(
        self,
        url: str,
        *,
        protocol: str,
        headers: dict[str, str],
        timeout_s: float,
        compression: str,
        resource: Mapping[str, AttrValue],
        scope_version: str,
        clock: Clock,
        stopping: threading.Event | None = None,
    ) -> None:
        self.url = url
        self.protocol = protocol
        self._headers = dict(headers)
        self._timeout_s = timeout_s
        self._gzip = compression == "gzip"
        self._resource = resource
        self._scope_version = scope_version
        self._clock = clock
        self._stopping = stopping or threading.Event()
        self._client: Any = None

    def prepare(self) -> None:
        """Load what sending needs (the encoder, httpx2) and open the HTTP client, ahead of the first batch."""
        encoder = "otlp_json" if self.protocol == "http/json" else "_proto"
        importlib.import_module(f"truss.telemetry.{encoder}")
        self._connect()

    def _connect(self) -> Any:
        import httpx2

        if self._client is None:
            # Loading the CA store costs ~100 ms of CPU; a plain-http collector (a local agent)
            # never uses TLS, so its client skips it. Redirects are never followed, so the URL
            # cannot turn into an unverified https one; an https collector is always verified.
            tls = not self.url.lower().startswith("http://")
            self._client = httpx2.Client(timeout=self._timeout_s, follow_redirects=False, trust_env=False, verify=tls)
        return self._client

    def attach(self, stopping: threading.Event) -> None:
        """Stop retrying once ``stopping`` is set (the exporter's close)."""
        self._stopping = stopping

    def __call__(self, batch: Sequence[SpanRecord]) -> int:
        body, content_type = self._encode(batch)
        headers = {**self._headers, "Content-Type": content_type}
        if self._gzip:
            body = gzip.compress(body)
            headers["Content-Encoding"] = "gzip"
        return self._post(body, headers)

    def _encode(self, batch: Sequence[SpanRecord]) -> tuple[bytes, str]:
        if self.protocol == "http/json":
            from truss.telemetry.otlp_json import request_json

            return request_json(batch, resource=self._resource, scope_version=self._scope_version), "application/json"
        from truss.telemetry._proto import encode_request

        data = encode_request(batch, resource=self._resource, scope_version=self._scope_version)
        return data, "application/x-protobuf"

    def _post(self, body: bytes, headers: dict[str, str]) -> int:
        import httpx2

        client = self._connect()
        deadline = self._clock.monotonic() + self._timeout_s
        attempt = 0
        while True:
            attempt += 1
            left = deadline - self._clock.monotonic()
            if left <= 0:
                raise ExportFailed(f"no answer within {self._timeout_s:g}s")
            try:
                response = client.post(self.url, content=body, headers=headers, timeout=left)
            except httpx2.TimeoutException:
                reason = "timeout"
            except httpx2.TransportError as exc:
                reason = f"unreachable ({type(exc).__name__})"
            else:
                status = response.status_code
                if 200 <= status < 300:
                    return self._rejected(response.content)
                if status not in _RETRY_STATUS:
                    raise ExportFailed(f"HTTP {status}")
                reason = f"HTTP {status}"
                wait = _retry_after(response.headers.get("retry-after"))
                if wait is not None:
                    if wait > deadline - self._clock.monotonic():
                        raise ExportFailed(f"{reason}, and its Retry-After is past the timeout")
                    self._pause(wait, reason)
                    continue
            pause = min(0.05 * 2 ** (attempt - 1), 2.0)
            if pause >= deadline - self._clock.monotonic():
                raise ExportFailed(reason)
            self._pause(pause, reason)

    def _pause(self, seconds: float, reason: str) -> None:
        # Shutting down: no more retries, so a dead collector cannot hold up the end of a run.
        if self._stopping.is_set() or self._stopping.wait(seconds):
            raise ExportFailed(reason)

    def _rejected(self, content: bytes) -> int:
        """``partial_success.rejected_spans`` of the collector's answer (0 when it has none or cannot be read)."""
        if not content:
            return 0
        try:
            if self.protocol == "http/json":
                import json

                value: Any = json.loads(content)
                partial: Any = cast(dict[str, Any], value).get("partialSuccess") if isinstance(value, dict) else None
                count: Any = cast(dict[str, Any], partial).get("rejectedSpans") if isinstance(partial, dict) else 0
                return int(count or 0)
            from truss.telemetry._proto import rejected_spans

            return rejected_spans(content)
        except Exception:
            return 0

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


def _retry_after(value: str | None) -> float | None:
    if value is None or not value.strip().isdigit():
        return None
    return float(value.strip())
