"""OTLP/protobuf: spans as the bytes of an ``ExportTraceServiceRequest``, built on the official definitions.

The only module that imports ``opentelemetry`` (the ``opentelemetry-proto`` package of the
``otel`` extra): the exporter imports it in its own thread, the first time it sends, so neither
``import truss`` nor a run without telemetry ever loads it. The message is the same document
``truss.telemetry.otlp_json`` writes, in the binary encoding.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, ArrayValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span, Status

from truss.telemetry.otlp_json import SCOPE_NAME
from truss.telemetry.spans import AttrValue, SpanRecord

__all__ = ["encode_request", "rejected_spans"]


def _value(value: AttrValue) -> AnyValue:
    if isinstance(value, bool):
        return AnyValue(bool_value=value)
    if isinstance(value, int):
        return AnyValue(int_value=value)
    if isinstance(value, float):
        return AnyValue(double_value=value)
    if isinstance(value, tuple):
        return AnyValue(array_value=ArrayValue(values=[AnyValue(string_value=v) for v in value]))
    return AnyValue(string_value=value)


def _attributes(attributes: Mapping[str, AttrValue]) -> list[KeyValue]:
    return [KeyValue(key=key, value=_value(value)) for key, value in attributes.items()]


def _span(span: SpanRecord) -> Span:
    out = Span(
        trace_id=span.trace_id,
        span_id=span.span_id,
        name=span.name,
        kind=span.kind,  # pyright: ignore[reportArgumentType] - the enum's values are the OTLP integers
        start_time_unix_nano=span.start_ns,
        end_time_unix_nano=span.end_ns,
        attributes=_attributes(span.attributes),
        events=[
            Span.Event(time_unix_nano=e.time_ns, name=e.name, attributes=_attributes(e.attributes)) for e in span.events
        ],
        status=Status(code=span.status),  # pyright: ignore[reportArgumentType]
    )
    if span.parent_id is not None:
        out.parent_span_id = span.parent_id
    return out


def encode_request(spans: Sequence[SpanRecord], *, resource: Mapping[str, AttrValue], scope_version: str) -> bytes:
    """The serialized ``ExportTraceServiceRequest`` of ``spans`` (one resource, one scope)."""
    request = ExportTraceServiceRequest(
        resource_spans=[
            ResourceSpans(
                resource=Resource(attributes=_attributes(resource)),
                scope_spans=[
                    ScopeSpans(
                        scope=InstrumentationScope(name=SCOPE_NAME, version=scope_version),
                        spans=[_span(s) for s in spans],
                    )
                ],
            )
        ]
    )
    return request.SerializeToString()


def rejected_spans(content: bytes) -> int:
    """``partial_success.rejected_spans`` of a collector's ``ExportTraceServiceResponse`` body."""
    answer = ExportTraceServiceResponse()
    answer.ParseFromString(content)
    return int(answer.partial_success.rejected_spans)
