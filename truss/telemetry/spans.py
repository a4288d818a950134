"""Spans of a run, following the OpenTelemetry GenAI and MCP conventions, from events or from the record.

One leg of a session (a ``truss run``, or one ``truss resume``) is a tree of three kinds of span
(docs/telemetry.md draws it and lists every attribute):

- ``invoke_agent {contract}`` (INTERNAL): the leg, root of its tree, ``gen_ai.operation.name =
  invoke_agent``, the contract as ``gen_ai.agent.name`` and the session as ``gen_ai.conversation.id``;
- ``chat {model}`` (CLIENT), child of the leg: one model turn, from the turn's start to the model's
  answer (``gen_ai.usage.*``, ``gen_ai.response.finish_reasons``);
- ``execute_tool {tool}`` (INTERNAL), child of the leg: one tool call as the gate settled it, with
  the MCP attributes on the same span (``mcp.method.name = tools/call``), as the MCP conventions
  ask of an instrumentation that already traces the tool's execution.

Calls are children of the leg, beside the turns, not inside them: a ``chat`` span measures the
model's answer only, and the calls it proposed are the agent's next steps (``truss.turn`` names the
turn). Every span carries ``truss.*`` attributes that link it to the signed record: the session,
the seq and log index of its last entry, the policy's decision.

``SpanBuilder`` makes the spans live, as a subscriber of the typed event stream
(``truss.events``); ``spans_from_entries`` makes them after the fact, from one session's entries
alone. Both build attributes with the same functions, and both derive ids from the record: the
trace id hashes the log origin and the session, a span id hashes the event stream's span id
(``<session>@<seq>``, ``.../t<turn>``, ``.../<call>``), so a live span and the exported one have the
same ids and a re-export gives the same ids again.

What never goes into a span: argument or result content unless the operator asked for it (and then
only the bytes the ledger stores, which the gate's redactor already redacted), free text (reasons,
check details, progress messages, the model's words), secret values. Pure: no I/O, no clock; the
store is read by ``truss.telemetry.reading`` only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from truss.events import (
    CallDenied,
    CallEnded,
    CallStarted,
    Event,
    ModelAnswered,
    ServerEvent,
    SessionEnded,
    SessionStarted,
    Suspended,
    TurnEnded,
    TurnStarted,
    VerdictReached,
)
from truss.ledger.entry import StoredEntry

__all__ = [
    "KIND_CLIENT",
    "KIND_INTERNAL",
    "STATUS_ERROR",
    "STATUS_UNSET",
    "AttrValue",
    "Content",
    "ContentRef",
    "SpanBuilder",
    "SpanEvent",
    "SpanRecord",
    "content_attributes",
    "span_id",
    "spans_from_entries",
    "trace_id",
    "with_attributes",
]

KIND_INTERNAL = 1  # OTLP Span.SpanKind
KIND_CLIENT = 3
STATUS_UNSET = 0  # OTLP Status.StatusCode
STATUS_ERROR = 2

AttrValue = str | bool | int | float | tuple[str, ...]
BlobReader = Callable[[str], bytes | None]


@dataclass(frozen=True)
class Content:
    """Which payloads the operator asked to export (both off by default), and how long each may be."""

    arguments: bool = False
    results: bool = False
    max_chars: int = 8192

    @property
    def wanted(self) -> bool:
        return self.arguments or self.results


@dataclass(frozen=True)
class ContentRef:
    """Where a live call span's payloads are: the log index of the call's last entry (read off the hot path)."""

    index: int


@dataclass(frozen=True)
class SpanEvent:
    name: str
    time_ns: int
    attributes: Mapping[str, AttrValue] = field(default_factory=dict[str, AttrValue])


@dataclass(frozen=True)
class SpanRecord:
    """One finished span, in OTLP's terms (ids as bytes, times in Unix nanoseconds)."""

    trace_id: bytes
    span_id: bytes
    parent_id: bytes | None
    name: str
    kind: int
    start_ns: int
    end_ns: int
    attributes: Mapping[str, AttrValue]
    events: tuple[SpanEvent, ...] = ()
    status: int = STATUS_UNSET
    key: str = ""  # the event stream's span id this span was derived from
    content: ContentRef | None = None


# -- ids --------------------------------------------------------------------------------------------


def trace_id(origin: str, session: str) -> bytes:
    """The 16-byte trace id of every span of ``session`` in the log ``origin``."""
    return _nonzero(hashlib.sha256(b"truss.otel.trace.v1\x00" + _b(origin) + b"\x00" + _b(session)).digest()[:16])


def span_id(origin: str, key: str) -> bytes:
    """The 8-byte span id of the event stream's span ``key`` (``<session>@<seq>``, ``.../t1``, ``.../c1.0``)."""
    return _nonzero(hashlib.sha256(b"truss.otel.span.v1\x00" + _b(origin) + b"\x00" + _b(key)).digest()[:8])


def _b(text: str) -> bytes:
    return text.encode("utf-8")


def _nonzero(value: bytes) -> bytes:
    # All-zero ids are invalid in OTLP; a hash that gives one (never, in practice) gets its last bit set.
    return value if any(value) else value[:-1] + b"\x01"


def _ns(ms: int) -> int:
    return ms * 1_000_000


# -- attributes shared by the live and the recorded view ---------------------------------------------


def _put(out: dict[str, AttrValue], key: str, value: AttrValue | None) -> None:
    if value is not None:
        out[key] = value


def _leg_attributes(
    *,
    session: str,
    start_seq: int,
    contract: str,
    contract_hash: str,
    resumed: bool,
    provider: str | None,
    model: str | None,
    status: str,
    verdict: str | None,
    suspend_reason: str | None,
    error: str | None,
    seq: int | None,
    index: int | None,
) -> dict[str, AttrValue]:
    out: dict[str, AttrValue] = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": contract,
        "gen_ai.conversation.id": session,
    }
    _put(out, "gen_ai.provider.name", provider)
    _put(out, "gen_ai.request.model", model)
    _put(out, "error.type", error)
    out.update({
        "truss.session.id": session,
        "truss.leg.start_seq": start_seq,
        "truss.contract.name": contract,
        "truss.contract.hash": contract_hash,
        "truss.resumed": resumed,
        "truss.session.status": status,
    })  # fmt: skip
    _put(out, "truss.verdict.status", verdict)
    _put(out, "truss.suspend.reason", suspend_reason)
    _put(out, "truss.ledger.seq", seq)
    _put(out, "truss.ledger.index", index)
    return out


def _chat_attributes(
    *,
    session: str,
    turn: int,
    provider: str | None,
    model: str | None,
    input_tokens: int | None,
    output_tokens: int | None,
    stop_reason: str | None,
    tool_calls: int | None,
    replayed: bool,
    error: str | None,
    seq: int | None,
    index: int | None,
) -> dict[str, AttrValue]:
    out: dict[str, AttrValue] = {"gen_ai.operation.name": "chat"}
    _put(out, "gen_ai.provider.name", provider)
    _put(out, "gen_ai.request.model", model)
    out["gen_ai.conversation.id"] = session
    _put(out, "gen_ai.usage.input_tokens", input_tokens)
    _put(out, "gen_ai.usage.output_tokens", output_tokens)
    _put(out, "gen_ai.response.finish_reasons", (stop_reason,) if stop_reason else None)
    _put(out, "error.type", error)
    out.update({"truss.session.id": session, "truss.turn": turn})
    _put(out, "truss.turn.tool_calls", tool_calls)
    out["truss.replayed"] = replayed
    _put(out, "truss.ledger.seq", seq)
    _put(out, "truss.ledger.index", index)
    return out


def _tool_attributes(
    *,
    session: str,
    contract: str | None,
    call: str,
    tool: str,
    server: str | None,
    turn: int,
    outcome: str,
    code: str | None,
    decision: str | None,
    rule: int | None,
    limit: str | None,
    replayed: bool,
    seq: int | None,
    index: int | None,
) -> dict[str, AttrValue]:
    own = tool.split(":", 2)[2] if tool.startswith("mcp:") and tool.count(":") >= 2 else tool
    out: dict[str, AttrValue] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": own,
        "gen_ai.tool.call.id": call,
        "gen_ai.tool.type": "extension",
    }
    _put(out, "gen_ai.agent.name", contract)
    if tool.startswith("mcp:"):
        out["mcp.method.name"] = "tools/call"
    _put(out, "error.type", _call_error(outcome, code))
    out.update({"truss.session.id": session, "truss.tool": tool})
    _put(out, "truss.server.name", server)
    out.update({"truss.turn": turn, "truss.call.outcome": outcome})
    _put(out, "truss.policy.decision", decision)
    _put(out, "truss.policy.rule", rule)
    if outcome == "denied":
        _put(out, "truss.deny.code", code)
    elif outcome == "failed":
        _put(out, "truss.failure.cause", code)
    elif outcome == "suspended":
        _put(out, "truss.wait.reason", code)
    _put(out, "truss.budget.limit", limit)
    out["truss.replayed"] = replayed
    _put(out, "truss.ledger.seq", seq)
    _put(out, "truss.ledger.index", index)
    return out


def _call_error(outcome: str, code: str | None) -> str | None:
    """``error.type`` of a call: ``tool_error`` for an isError result (the MCP conventions' value),
    the failure cause below the tool, ``denied``, or the exception that stopped the gate."""
    if outcome == "tool_error":
        return "tool_error"
    if outcome == "failed":
        return code or "_OTHER"
    if outcome == "denied":
        return "denied"
    if outcome == "error":
        return code or "_OTHER"
    return None


def _leg_error(status: str, verdict_error: str | None, reason: str | None) -> str | None:
    if status == "error":
        return verdict_error or reason or "_OTHER"
    if status == "diverged":
        return "diverged"
    return None


def _chat_name(model: str | None) -> str:
    return f"chat {model}" if model else "chat"


def _tool_name(tool: str) -> str:
    own = tool.split(":", 2)[2] if tool.startswith("mcp:") and tool.count(":") >= 2 else tool
    return f"execute_tool {own}"


def _status(attributes: Mapping[str, AttrValue]) -> int:
    return STATUS_ERROR if "error.type" in attributes else STATUS_UNSET


def content_attributes(body: Mapping[str, Any], blob: BlobReader, content: Content) -> dict[str, str]:
    """``gen_ai.tool.call.arguments`` / ``.result`` of a call entry's ``body``, as the ledger stores them.

    The stored bytes are the redacted form (``secret_args`` replaced, known secret values scrubbed
    before hashing); nothing else is ever read. An erased or missing payload is left out.
    """
    out: dict[str, str] = {}
    for wanted, ref_key, attribute in (
        (content.arguments, "args", "gen_ai.tool.call.arguments"),
        (content.results, "result", "gen_ai.tool.call.result"),
    ):
        ref: Any = body.get(ref_key)
        if not wanted or not isinstance(ref, str):
            continue
        data = blob(ref)
        if data is None:
            continue
        text = data.decode("utf-8", errors="replace")
        out[attribute] = text if len(text) <= content.max_chars else text[: content.max_chars]
    return out


# -- live: a subscriber of the event stream ----------------------------------------------------------


@dataclass
class _Leg:
    start: SessionStarted
    suspend_reason: str | None = None
    verdict: str | None = None
    verdict_error: str | None = None
    events: list[SpanEvent] = field(default_factory=list[SpanEvent])


@dataclass
class _Turn:
    start: TurnStarted
    answer: ModelAnswered | None = None


@dataclass
class _Call:
    start: CallStarted
    denied: CallDenied | None = None


class SpanBuilder:
    """Turns a run's events into finished ``SpanRecord``s (see the module docstring).

    ``feed(event)`` returns the spans that event finished (a leg, turn or call ends with its end
    event). It keeps only the spans still open, so a long serve-mcp process holds no history.
    Called on the run's event loop: it does no I/O and reads no payload; a call span that should
    carry content gets a ``ContentRef`` for the exporter to resolve in its own thread.
    """

    def __init__(self, origin: str, content: Content | None = None) -> None:
        self.origin = origin
        self.content = content or Content()
        self._legs: dict[str, _Leg] = {}
        self._turns: dict[str, _Turn] = {}
        self._calls: dict[str, _Call] = {}

    def feed(self, event: Event) -> list[SpanRecord]:
        if isinstance(event, SessionStarted):
            self._legs[event.span] = _Leg(event)
        elif isinstance(event, TurnStarted):
            self._turns[event.span] = _Turn(event)
        elif isinstance(event, CallStarted):
            self._calls[event.span] = _Call(event)
        elif isinstance(event, ModelAnswered):
            turn = self._turns.get(event.span)
            if turn is not None:
                turn.answer = event
        elif isinstance(event, CallDenied):
            call = self._calls.get(event.span)
            if call is not None:
                call.denied = event
        elif isinstance(event, Suspended | VerdictReached | ServerEvent):
            self._leg_point(event)
        elif isinstance(event, TurnEnded):
            return self._turn_ended(event)
        elif isinstance(event, CallEnded):
            return self._call_ended(event)
        elif isinstance(event, SessionEnded):
            return self._leg_ended(event)
        return []

    def _leg_point(self, event: Suspended | VerdictReached | ServerEvent) -> None:
        leg = self._legs.get(event.span)
        if leg is None:
            return
        if isinstance(event, Suspended):
            leg.suspend_reason = event.reason
        elif isinstance(event, VerdictReached):
            leg.verdict, leg.verdict_error = event.status, event.error
        elif len(leg.events) < 128:  # a launcher's reports (a sandbox's egress decisions): names and scalars
            attributes: dict[str, AttrValue] = {"truss.server.name": event.server}
            for key, value in event.attributes.items():
                if isinstance(value, str | bool | int | float):
                    attributes[f"truss.{key}"] = value
            leg.events.append(SpanEvent(f"truss.server.{event.name}", _ns(event.time_ms), attributes))

    def _leg_of(self, span: str) -> _Leg | None:
        return self._legs.get(span.split("/", 1)[0])

    def _turn_ended(self, event: TurnEnded) -> list[SpanRecord]:
        turn = self._turns.pop(event.span, None)
        leg = self._leg_of(event.span)
        if turn is None or leg is None:
            return []
        answer = turn.answer
        error = None if answer is not None or event.outcome in ("ok", "done", "suspended") else event.outcome
        attributes = _chat_attributes(
            session=event.session,
            turn=event.turn,
            provider=answer.provider if answer is not None else leg.start.provider,
            model=leg.start.model,
            input_tokens=answer.input_tokens if answer is not None else None,
            output_tokens=answer.output_tokens if answer is not None else None,
            stop_reason=answer.stop_reason if answer is not None else None,
            tool_calls=answer.tool_calls if answer is not None else None,
            replayed=answer.replayed if answer is not None else False,
            error=error,
            seq=answer.seq if answer is not None else None,
            index=answer.index if answer is not None else None,
        )
        end_ms = answer.time_ms if answer is not None else event.time_ms
        name = _chat_name(leg.start.model)
        return [self._span(event.session, event.span, leg.start.span, name, kind=KIND_CLIENT,
                           start_ms=event.start_ms, end_ms=end_ms, attributes=attributes)]  # fmt: skip

    def _call_ended(self, event: CallEnded) -> list[SpanRecord]:
        call = self._calls.pop(event.span, None)
        leg = self._leg_of(event.span)
        if leg is None:
            return []
        denied = call.denied if call is not None else None
        attributes = _tool_attributes(
            session=event.session,
            contract=leg.start.contract,
            call=event.call,
            tool=event.tool,
            server=event.server,
            turn=event.turn,
            outcome=event.outcome,
            code=event.code,
            decision=event.decision,
            rule=denied.rule if denied is not None else None,
            limit=event.limit,
            replayed=event.replayed,
            seq=event.seq,
            index=event.index,
        )
        ref = ContentRef(event.index) if self.content.wanted and event.index is not None else None
        return [self._span(event.session, event.span, leg.start.span, _tool_name(event.tool), kind=KIND_INTERNAL,
                           start_ms=event.start_ms, end_ms=event.time_ms, attributes=attributes,
                           content=ref)]  # fmt: skip

    def _leg_ended(self, event: SessionEnded) -> list[SpanRecord]:
        leg = self._legs.pop(event.span, None)
        if leg is None:
            return []
        start = leg.start
        attributes = _leg_attributes(
            session=event.session,
            start_seq=_start_seq(event.span),
            contract=start.contract,
            contract_hash=start.contract_hash,
            resumed=start.resumed,
            provider=start.provider,
            model=start.model,
            status=event.status,
            verdict=leg.verdict,
            suspend_reason=leg.suspend_reason,
            error=_leg_error(event.status, leg.verdict_error, _exception_name(event.reason)),
            seq=event.seq,
            index=event.index,
        )
        return [self._span(event.session, event.span, None, f"invoke_agent {start.contract}", kind=KIND_INTERNAL,
                           start_ms=event.start_ms, end_ms=event.time_ms, attributes=attributes,
                           events=tuple(leg.events))]  # fmt: skip

    def _span(
        self,
        session: str,
        key: str,
        parent: str | None,
        name: str,
        *,
        kind: int,
        start_ms: int,
        end_ms: int,
        attributes: dict[str, AttrValue],
        events: tuple[SpanEvent, ...] = (),
        content: ContentRef | None = None,
    ) -> SpanRecord:
        return SpanRecord(
            trace_id=trace_id(self.origin, session),
            span_id=span_id(self.origin, key),
            parent_id=span_id(self.origin, parent) if parent is not None else None,
            name=name,
            kind=kind,
            start_ns=_ns(start_ms),
            end_ns=_ns(max(end_ms, start_ms)),
            attributes=attributes,
            events=events,
            status=_status(attributes),
            key=key,
            content=content,
        )


def _start_seq(leg_span: str) -> int:
    tail = leg_span.rsplit("@", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def _exception_name(reason: str | None) -> str | None:
    # A leg that raised ends with the exception's type as its reason; any other reason is free text.
    if reason and reason.isidentifier() and reason[:1].isupper():
        return reason
    return None


# -- after the fact: from the record -----------------------------------------------------------------

_POLICY_FREE_DENIALS = frozenset({"not_mounted"})


def spans_from_entries(
    entries: Sequence[StoredEntry],
    *,
    origin: str,
    blob: Callable[[str], bytes | None] | None = None,
    content: Content | None = None,
) -> list[SpanRecord]:
    """The spans of one session's entries (in seq order), as the live run emitted them.

    Times come from the entries' timestamps: a leg spans its first to its last entry; a turn
    starts at the entry before its ``model_turn`` and ends there; a call spans its first to its
    last entry. A step a resumed leg replayed from the record is not repeated (the live run shows
    it again with ``truss.replayed = true``); a turn whose model call failed left no entry and so
    has no span. ``blob`` and ``content`` add the payloads the operator asked for.
    """
    content = content or Content()
    if not entries:
        return []
    started = entries[0].body if entries[0].kind == "session_started" else {}
    session = entries[0].session
    contract = str(started.get("contract") or "")
    contract_hash = str(started.get("contract_hash") or "")
    provider = _str(started.get("provider"))
    effective: Mapping[str, Any] = _map(started.get("effective"))
    model = _str(_map(effective.get("agent")).get("model"))
    asked = {str(e.body.get("call")) for e in entries if e.kind == "approval_requested"}
    out: list[SpanRecord] = []
    for leg in _legs(entries):
        out.extend(
            _leg_spans(
                leg,
                origin=origin,
                session=session,
                contract=contract,
                contract_hash=contract_hash,
                provider=provider,
                model=model,
                asked=asked,
                blob=blob,
                content=content,
            )
        )
    return out


def _legs(entries: Sequence[StoredEntry]) -> list[list[StoredEntry]]:
    legs: list[list[StoredEntry]] = []
    for entry in entries:
        if entry.kind in ("session_started", "session_resumed") or not legs:
            legs.append([])
        legs[-1].append(entry)
    return legs


def _leg_spans(
    leg: list[StoredEntry],
    *,
    origin: str,
    session: str,
    contract: str,
    contract_hash: str,
    provider: str | None,
    model: str | None,
    asked: set[str],
    blob: Callable[[str], bytes | None] | None,
    content: Content,
) -> list[SpanRecord]:
    first = leg[0]
    # What `truss approve`, `resolve` and `signal` append between legs belongs to no run leg.
    last = next((e for e in reversed(leg) if e.kind not in _BETWEEN_LEGS), first)
    key = f"{session}@{first.seq}"
    tid = trace_id(origin, session)
    leg_id = span_id(origin, key)
    out: list[SpanRecord] = []
    previous = first
    calls: dict[str, list[StoredEntry]] = {}
    for entry in leg:
        if entry.kind == "model_turn":
            out.append(_turn_span(entry, previous, origin=origin, trace=tid, leg_key=key, leg_id=leg_id,
                                  provider=provider, model=model))  # fmt: skip
        call: Any = entry.body.get("call")
        if entry.kind in _CALL_KINDS and isinstance(call, str):
            calls.setdefault(call, []).append(entry)
        previous = entry
    for call, steps in calls.items():
        span = _call_span(call, steps, origin=origin, trace=tid, leg_key=key, leg_id=leg_id, contract=contract,
                          asked=call in asked)  # fmt: skip
        if span is None:
            continue
        if blob is not None and content.wanted:
            extra = content_attributes(steps[-1].body, blob, content)
            span = _with(span, extra)
        out.append(span)
    verdict = next((e for e in leg if e.kind == "verdict"), None)
    suspended = next((e for e in leg if e.kind == "session_suspended"), None)
    status, suspend_reason = _leg_status(verdict, suspended)
    verdict_body: Mapping[str, Any] = verdict.body if verdict is not None else {}
    verdict_error = _str(_map(verdict_body.get("error")).get("cause"))
    attributes = _leg_attributes(
        session=session,
        start_seq=first.seq,
        contract=contract,
        contract_hash=contract_hash,
        resumed=first.kind == "session_resumed",
        provider=provider,
        model=model,
        status=status,
        verdict=_str(verdict_body.get("status")) if verdict is not None else None,
        suspend_reason=suspend_reason,
        error=_leg_error(status, verdict_error, None),
        seq=last.seq,
        index=last.index,
    )
    root = SpanRecord(tid, leg_id, None, f"invoke_agent {contract}", KIND_INTERNAL, _ns(first.ts), _ns(last.ts),
                      attributes, status=_status(attributes), key=key)  # fmt: skip
    return [root, *out]


_BETWEEN_LEGS = frozenset({"approval_decided", "in_doubt_resolved", "signal_received"})
_CALL_KINDS = frozenset({
    "mcp_tool_intent", "mcp_tool_call", "mcp_tool_denied", "mcp_tool_pending", "approval_requested", "in_doubt",
})  # fmt: skip


def _leg_status(verdict: StoredEntry | None, suspended: StoredEntry | None) -> tuple[str, str | None]:
    if verdict is not None:
        return str(verdict.body.get("status")), None
    if suspended is not None:
        reason = str(suspended.body.get("reason"))
        if reason == "diverged":
            return "diverged", None
        return ("interrupted" if reason == "interrupted" else "suspended"), reason
    return "incomplete", None


def _turn_span(
    entry: StoredEntry,
    previous: StoredEntry,
    *,
    origin: str,
    trace: bytes,
    leg_key: str,
    leg_id: bytes,
    provider: str | None,
    model: str | None,
) -> SpanRecord:
    body: Mapping[str, Any] = entry.body
    turn = _int(body.get("turn")) or 0
    usage = _map(body.get("usage"))
    attributes = _chat_attributes(
        session=entry.session,
        turn=turn,
        provider=_str(body.get("provider")) or provider,
        model=model,
        input_tokens=_int(usage.get("input_tokens")) or 0,
        output_tokens=_int(usage.get("output_tokens")) or 0,
        stop_reason=_str(body.get("stop_reason")),
        tool_calls=_int(body.get("tool_calls")) or 0,
        replayed=False,
        error=None,
        seq=entry.seq,
        index=entry.index,
    )
    key = f"{leg_key}/t{turn}"
    return SpanRecord(trace, span_id(origin, key), leg_id, _chat_name(model), KIND_CLIENT, _ns(previous.ts),
                      _ns(entry.ts), attributes, status=_status(attributes), key=key)  # fmt: skip


def _call_span(
    call: str,
    steps: list[StoredEntry],
    *,
    origin: str,
    trace: bytes,
    leg_key: str,
    leg_id: bytes,
    contract: str,
    asked: bool,
) -> SpanRecord | None:
    by_kind = {e.kind: e for e in steps}
    last = steps[-1]
    body: Mapping[str, Any] = last.body
    tool = str(body.get("tool") or "")
    outcome, code, decision = _call_outcome(by_kind, asked=asked)
    if outcome is None:  # an intent with no result: the process stopped mid-call (in doubt on resume)
        return None
    denied = by_kind.get("mcp_tool_denied")
    rule = _int(denied.body.get("rule")) if denied is not None else None
    limit = _str(denied.body.get("limit")) if denied is not None else None
    attributes = _tool_attributes(
        session=last.session,
        contract=contract,
        call=call,
        tool=tool,
        server=tool.split(":", 2)[1] if tool.startswith("mcp:") and tool.count(":") >= 2 else None,
        turn=_int(body.get("turn")) or _int(steps[0].body.get("turn")) or 0,
        outcome=outcome,
        code=code,
        decision=decision,
        rule=rule,
        limit=limit,
        replayed=False,
        seq=last.seq,
        index=last.index,
    )
    key = f"{leg_key}/{call}"
    return SpanRecord(trace, span_id(origin, key), leg_id, _tool_name(tool), KIND_INTERNAL, _ns(steps[0].ts),
                      _ns(last.ts), attributes, status=_status(attributes), key=key)  # fmt: skip


def _call_outcome(by_kind: Mapping[str, StoredEntry], *, asked: bool) -> tuple[str | None, str | None, str | None]:
    """(outcome, code, the policy's decision) of one call's entries in one leg, as the gate reported them."""
    allowed = "ask" if asked else "allow"
    if (result := by_kind.get("mcp_tool_call")) is not None:
        body: Mapping[str, Any] = result.body
        failure = _map(body.get("failure"))
        if failure:
            outcome, code = "failed", _str(failure.get("cause"))
        else:
            outcome, code = ("tool_error" if body.get("is_error") else "ok"), None
        # A signal's payload or a task's result settles a call the policy passed in an earlier leg.
        decision = None if ("signal" in body and "mcp_tool_intent" not in by_kind) else allowed
        return outcome, code, decision
    if (denied := by_kind.get("mcp_tool_denied")) is not None:
        code = str(denied.body.get("code"))
        return "denied", code, _denial_decision(code, denied.body.get("rule"))
    if (pending := by_kind.get("mcp_tool_pending")) is not None:
        return "suspended", _str(pending.body.get("kind")), allowed
    if "approval_requested" in by_kind:
        return "suspended", "approval", "ask"
    if "in_doubt" in by_kind:
        return "error", "InDoubtError", allowed
    return None, None, None


def _denial_decision(code: str, rule: Any) -> str | None:
    if code in _POLICY_FREE_DENIALS:
        return None
    if code == "bad_arguments":
        return "deny" if isinstance(rule, int) else None  # the gate's own schema check asks no policy
    if code == "budget":
        return "allow"
    if code == "approval_denied":
        return "ask"
    return "deny"


def _with(span: SpanRecord, extra: Mapping[str, AttrValue]) -> SpanRecord:
    if not extra:
        return span
    return SpanRecord(span.trace_id, span.span_id, span.parent_id, span.name, span.kind, span.start_ns, span.end_ns,
                      {**span.attributes, **extra}, span.events, span.status, span.key)  # fmt: skip


def with_attributes(span: SpanRecord, extra: Mapping[str, AttrValue]) -> SpanRecord:
    """``span`` with ``extra`` attributes added and its content reference dropped."""
    return _with(span, extra)


def _map(value: Any) -> Mapping[str, Any]:
    return cast(Mapping[str, Any], value) if isinstance(value, Mapping) else {}


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
