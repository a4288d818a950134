"""OTLP/JSON: spans as the JSON form of an ``ExportTraceServiceRequest`` (OTLP 1.x, "JSON Protobuf Encoding").

The encoding the OTLP specification gives for JSON bodies: field names in lowerCamelCase, trace and
span ids as lower-case hex (not base64), enums as integers, 64-bit integers (times, ``intValue``) as
decimal strings, attributes as ``{"key", "value": {"stringValue" | "boolValue" | "intValue" |
"doubleValue" | "arrayValue"}}``. The document can be POSTed as is to a collector's ``/v1/traces``
with ``Content-Type: application/json``. Pure and dependency-free: ``truss ledger export --format
otlp-json`` works without the ``otel`` extra.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

from truss.telemetry.spans import AttrValue, SpanRecord

__all__ = ["SCOPE_NAME", "attribute_value", "encode_request", "request_json"]

SCOPE_NAME = "truss"
"""The instrumentation scope every Truss span is reported under."""


def attribute_value(value: AttrValue) -> dict[str, Any]:
    """One ``AnyValue`` in OTLP/JSON."""
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        if math.isfinite(value):
            return {"doubleValue": value}
        return {"doubleValue": "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")}
    if isinstance(value, tuple):
        return {"arrayValue": {"values": [{"stringValue": item} for item in value]}}
    return {"stringValue": value}


def _attributes(attributes: Mapping[str, AttrValue]) -> list[dict[str, Any]]:
    return [{"key": key, "value": attribute_value(value)} for key, value in attributes.items()]


def _span(span: SpanRecord) -> dict[str, Any]:
    out: dict[str, Any] = {"traceId": span.trace_id.hex(), "spanId": span.span_id.hex()}
    if span.parent_id is not None:
        out["parentSpanId"] = span.parent_id.hex()
    out.update({
        "name": span.name,
        "kind": span.kind,
        "startTimeUnixNano": str(span.start_ns),
        "endTimeUnixNano": str(span.end_ns),
        "attributes": _attributes(span.attributes),
    })  # fmt: skip
    if span.events:
        out["events"] = [
            {"timeUnixNano": str(e.time_ns), "name": e.name, "attributes": _attributes(e.attributes)}
            for e in span.events
        ]
    out["status"] = {"code": span.status} if span.status else {}
    return out


def encode_request(
    spans: Sequence[SpanRecord], *, resource: Mapping[str, AttrValue], scope_version: str
) -> dict[str, Any]:
    """The ``ExportTraceServiceRequest`` of ``spans`` (one resource, one scope) as a JSON value."""
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": _attributes(resource)},
                "scopeSpans": [
                    {
                        "scope": {"name": SCOPE_NAME, "version": scope_version},
                        "spans": [_span(s) for s in spans],
                    }
                ],
            }
        ]
    }


def request_json(spans: Sequence[SpanRecord], *, resource: Mapping[str, AttrValue], scope_version: str) -> bytes:
    """``encode_request`` as UTF-8 JSON bytes (compact, keys in the order above)."""
    value = encode_request(spans, resource=resource, scope_version=scope_version)
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
