"""OpenTelemetry for operators: a run's spans, live over OTLP/HTTP, or after the fact from the ledger.

- ``resolve_settings(config, environ)``: the operator's ``[telemetry]`` over the ``OTEL_*``
  variables (``truss.telemetry.settings``), None when telemetry is off;
- ``Telemetry``: one process's exporter; it *is* an event subscriber (pass it with a run's other
  subscribers), and ``close()`` sends what is queued and reports what was lost;
- ``export_session``: a recorded session's spans as an OTLP/JSON document, from the ledger alone.

The span tree and every attribute: ``truss.telemetry.spans`` and docs/telemetry.md. Nothing here
imports ``opentelemetry``: the protobuf definitions of the ``otel`` extra are loaded by the
exporter's thread when it starts (only when telemetry is on), so ``import truss``, ``import truss.telemetry`` and a run
without telemetry never load them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from truss._clock import Clock
from truss.events import Event
from truss.ledger.keys import TrustedKeys
from truss.telemetry.exporter import BatchExporter, ExportStats, OtlpHttpSender
from truss.telemetry.otlp_json import encode_request, request_json
from truss.telemetry.reading import call_content, recorded_session
from truss.telemetry.settings import ENV_NAMES, EXTRA, TelemetrySettings, require_extra, resolve_settings
from truss.telemetry.spans import Content, SpanBuilder, SpanRecord, spans_from_entries, with_attributes

__all__ = [
    "ENV_NAMES",
    "EXTRA",
    "Content",
    "ExportStats",
    "SpanBuilder",
    "SpanRecord",
    "Telemetry",
    "TelemetrySettings",
    "encode_request",
    "export_session",
    "require_extra",
    "resolve_settings",
    "session_spans",
    "spans_from_entries",
]


class Telemetry:
    """One process's live span export: an event subscriber in front of a ``BatchExporter``.

    ``store`` is read (in the exporter's thread) only for the payloads the settings opt into. A
    subscriber call never blocks: it builds the spans an event finishes and queues them.
    """

    def __init__(self, settings: TelemetrySettings, *, origin: str, clock: Clock, store: Any = None) -> None:
        import truss

        self.settings = settings
        self._builder = SpanBuilder(origin, settings.content if store is not None else Content())
        self._sender = OtlpHttpSender(
            settings.traces_url,
            protocol=settings.protocol,
            headers=dict(settings.headers),
            timeout_s=settings.timeout_s,
            compression=settings.compression,
            resource=dict(settings.resource),
            scope_version=truss.__version__,
            clock=clock,
        )
        content = settings.content

        def resolve(span: SpanRecord) -> SpanRecord:
            assert span.content is not None
            return with_attributes(span, call_content(store, span.content.index, content))

        self._exporter = BatchExporter(
            self._sender,
            clock=clock,
            max_queue_spans=settings.max_queue_spans,
            max_batch_spans=settings.max_batch_spans,
            schedule_delay_s=settings.schedule_delay_s,
            resolve=resolve if store is not None and content.wanted else None,
            secrets=settings.secret_values,
            prepare=self._sender.prepare,
        )
        self._sender.attach(self._exporter.stopping)
        self._closed: ExportStats | None = None

    def __call__(self, event: Event) -> None:
        for span in self._builder.feed(event):
            self._exporter.offer(span)

    def remember(self, values: Iterable[str]) -> None:
        """Secret values (a run's ``secret_env`` and secret headers) to scrub from every span sent."""
        self._exporter.remember(values)

    @property
    def stats(self) -> ExportStats:
        return self._closed or self._exporter.stats

    def close(self, timeout_s: float | None = None) -> ExportStats:
        """Send what is queued (waiting at most ``timeout_s``, default the settings'); idempotent."""
        if self._closed is None:
            wait = self.settings.shutdown_timeout_s if timeout_s is None else timeout_s
            self._closed = self._exporter.close(wait)
            if self._exporter.finished:
                self._sender.close()
        return self._closed


def session_spans(
    store: Any,
    session: str,
    trusted: TrustedKeys,
    *,
    content: Content | None = None,
) -> tuple[list[SpanRecord], str]:
    """The spans of a recorded ``session`` (after it verifies) and the truss version that recorded it."""
    content = content or Content()
    recorded = recorded_session(store, session, trusted, payloads=content.wanted)
    started = recorded.entries[0].body if recorded.entries else {}
    version = str(started.get("truss_version") or "")
    spans = spans_from_entries(recorded.entries, origin=recorded.origin, blob=recorded.blob, content=content)
    return spans, version


def export_session(
    store: Any,
    session: str,
    trusted: TrustedKeys,
    *,
    content: Content | None = None,
    service_name: str = "truss",
) -> bytes:
    """A recorded session's spans as one OTLP/JSON ``ExportTraceServiceRequest`` (UTF-8 bytes)."""
    spans, version = session_spans(store, session, trusted, content=content)
    resource: dict[str, Any] = {"service.name": service_name, "service.version": version}
    return request_json(spans, resource=resource, scope_version=version)
