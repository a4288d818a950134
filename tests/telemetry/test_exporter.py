"""The exporter on its own: batches to a real receiver, bounded retries, drops and losses counted exactly.

A blocking sender (a function that waits on an event) makes queue behaviour deterministic: the
first span is in flight while the others are offered.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence

import pytest

from tests.telemetry.conftest import require_otel_extra
from truss._clock import SystemClock
from truss.telemetry.exporter import BatchExporter, ExportFailed, OtlpHttpSender
from truss.telemetry.spans import KIND_INTERNAL, SpanEvent, SpanRecord, span_id, trace_id

require_otel_extra()
from tests.telemetry.receiver import Receiver  # noqa: E402 - after the check that the extra is here

WAIT_S = 10


def span(n: int, **attributes: str) -> SpanRecord:
    return SpanRecord(
        trace_id=trace_id("log.example", "s1"),
        span_id=span_id("log.example", f"s1@0/c{n}.0"),
        parent_id=None,
        name=f"execute_tool t{n}",
        kind=KIND_INTERNAL,
        start_ns=1_000_000 * n,
        end_ns=1_000_000 * (n + 1),
        attributes={"gen_ai.operation.name": "execute_tool", **attributes},
        key=f"s1@0/c{n}.0",
    )


def sender(otlp: Receiver, *, protocol: str = "http/protobuf", timeout_s: float = 5.0) -> OtlpHttpSender:
    return OtlpHttpSender(
        f"{otlp.endpoint}/v1/traces",
        protocol=protocol,
        headers={"x-test": "1"},
        timeout_s=timeout_s,
        compression="none",
        resource={"service.name": "truss"},
        scope_version="test",
        clock=SystemClock(),
    )


class Blocking:
    """A sender that holds its first batch until released."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.batches: list[list[str]] = []

    def __call__(self, batch: Sequence[SpanRecord]) -> int:
        self.entered.set()
        assert self.release.wait(WAIT_S)
        self.batches.append([s.name for s in batch])
        return 0


def test_batches_reach_the_receiver_and_every_span_is_counted_once(otlp: Receiver) -> None:
    exporter = BatchExporter(sender(otlp), clock=SystemClock(), max_batch_spans=2, schedule_delay_s=60)
    for n in range(5):
        exporter.offer(span(n))
    stats = exporter.close(WAIT_S)
    assert (stats.offered, stats.exported, stats.dropped, stats.failed, stats.unsent) == (5, 5, 0, 0, 0)
    assert sorted(s["name"] for s in otlp.spans()) == [f"execute_tool t{n}" for n in range(5)]
    assert [len(r.request.resource_spans[0].scope_spans[0].spans) for r in otlp.requests] == [2, 2, 1]
    assert {r.headers["x-test"] for r in otlp.requests} == {"1"}


def test_a_full_queue_drops_the_spans_that_do_not_fit_and_counts_them(otlp: Receiver) -> None:
    blocking = Blocking()
    exporter = BatchExporter(blocking, clock=SystemClock(), max_queue_spans=3, max_batch_spans=1, schedule_delay_s=60)
    exporter.offer(span(0))
    assert blocking.entered.wait(WAIT_S)  # span 0 is in flight; the queue is empty
    for n in range(1, 6):
        exporter.offer(span(n))  # 1, 2, 3 fit; 4 and 5 do not
    blocking.release.set()
    stats = exporter.close(WAIT_S)
    assert (stats.offered, stats.exported, stats.dropped) == (6, 4, 2)
    assert blocking.batches == [["execute_tool t0"], ["execute_tool t1"], ["execute_tool t2"], ["execute_tool t3"]]


def test_close_waits_no_longer_than_it_is_told_and_counts_what_was_left(otlp: Receiver) -> None:
    blocking = Blocking()
    exporter = BatchExporter(blocking, clock=SystemClock(), max_batch_spans=1, schedule_delay_s=60)
    exporter.offer(span(0))
    assert blocking.entered.wait(WAIT_S)
    exporter.offer(span(1))
    stats = exporter.close(0.05)  # the sender never returns in time
    assert (stats.exported, stats.unsent) == (0, 2)
    blocking.release.set()


def test_a_collector_starting_up_is_retried_and_a_refusal_is_not(otlp: Receiver) -> None:
    otlp.fail_first = 2
    assert sender(otlp)([span(0)]) == 0
    assert otlp.answered_503 == 2 and len(otlp.requests) == 1
    otlp.status = 400
    with pytest.raises(ExportFailed) as failed:
        sender(otlp)([span(1)])
    assert failed.value.reason == "HTTP 400" and len(otlp.requests) == 1


def test_a_failing_collector_fails_batches_without_raising_into_the_caller(otlp: Receiver) -> None:
    otlp.status = 500
    exporter = BatchExporter(sender(otlp), clock=SystemClock(), max_batch_spans=10, schedule_delay_s=60)
    for n in range(3):
        exporter.offer(span(n))
    stats = exporter.close(WAIT_S)
    assert (stats.exported, stats.failed, stats.last_error) == (0, 3, "HTTP 500")


def test_http_json_bodies_are_valid_otlp_for_the_collector(otlp: Receiver) -> None:
    assert sender(otlp, protocol="http/json")([span(0), span(1)]) == 0
    assert not otlp.refused and [r.content_type for r in otlp.requests] == ["application/json"]
    assert [s["span_id"] for s in otlp.spans()] == [span(0).span_id.hex(), span(1).span_id.hex()]


def test_a_remembered_secret_is_scrubbed_from_every_attribute_before_it_is_sent(otlp: Receiver) -> None:
    exporter = BatchExporter(sender(otlp), clock=SystemClock(), schedule_delay_s=60, secrets=["hunter2-secret"])
    exporter.remember(["another-secret-value"])
    exporter.offer(span(0, note="a reason quoting hunter2-secret and another-secret-value"))
    assert exporter.close(WAIT_S).exported == 1
    [received] = otlp.spans()
    assert received["attributes"]["note"] == "a reason quoting [redacted] and [redacted]"
    body = b"".join(r.body for r in otlp.requests)
    assert b"hunter2-secret" not in body and b"another-secret-value" not in body


def test_a_remembered_secret_is_scrubbed_from_span_names_and_span_events_too(otlp: Receiver) -> None:
    # A sandboxed server writes its egress method, a server names its tools: a secret it holds can
    # reach a span's name or a span event's attributes, which the live leg copies from the report.
    exporter = BatchExporter(sender(otlp), clock=SystemClock(), schedule_delay_s=60, secrets=["hunter2-secret"])
    egress = SpanEvent(
        "truss.server.sandbox_egress", 1_000_000, {"truss.method": "GEThunter2-secret", "truss.port": 80}
    )
    leaking = dataclasses.replace(span(0), name="execute_tool hunter2-secret", events=(egress,))
    exporter.offer(leaking)
    assert exporter.close(WAIT_S).exported == 1
    body = b"".join(r.body for r in otlp.requests)
    assert b"hunter2-secret" not in body
    assert b"execute_tool [redacted]" in body and b"GET[redacted]" in body
