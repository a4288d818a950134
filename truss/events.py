"""The run's event stream: typed events with span ids, parents and times, for any number of subscribers.

A run leg (one ``truss run``, or one ``truss resume`` of a session) is a tree of spans:

- the **session** span (``SessionStarted`` .. ``SessionEnded``), no parent;
- one **turn** span per model turn (``TurnStarted`` .. ``TurnEnded``), parent the session span;
  a turn spans the model's answer and the calls it proposed;
- one **call** span per tool call the gate handled (``CallStarted`` .. ``CallEnded``), parent its
  turn's span.

Point events happen inside a span (``span`` names it): ``ModelAnswered`` (in its turn: the
recorded ``model_turn``), ``CallDenied`` and ``ToolProgress`` (in their call), and in the
session ``Suspended``, ``CheckpointSigned``, ``VerdictReached``, ``PanelReviewed`` (a reviewer of a
panel check answered, failed, or was found in the record), ``CheckpointWitnessed`` (after the
verdict, when the home configures witnesses) and ``ServerEvent`` (what a
launcher or auth flow reports about a server, e.g. a sandbox's egress decision). Every event
carries ``session``, ``span``, ``parent`` (the parent of ``span``) and ``time_ms`` from the run's
injected clock; an ended span also carries ``start_ms``. Events that follow a ledger entry name it
(``seq``, ``index``), so an exporter can link a span to the signed record.

Span ids are derived, not random: ``<session>@<seq>`` for a leg that starts at entry ``seq`` (0
for a new run, the next seq for a resume), ``<leg>/t<turn>`` and ``<leg>/<call>``. They are
unique within a store and the same on every replay of the record; an exporter maps them to the
ids its format wants (OpenTelemetry's 16-byte trace and 8-byte span ids, say, by hashing).

``EventBus`` delivers each event to every subscriber in order, synchronously, on the run's event
loop. A subscriber must be quick (an exporter hands events to its own queue or thread); one that
raises is counted (``EventBus.failures``) and logged at debug level on the ``truss.events``
logger, and never breaks the run or the other subscribers. Events never carry arguments, results
or secret values: only names, ids, outcomes, counts and the (scrubbed) reasons the ledger holds.

``ProgressEvent`` is the older, flat view that serve-mcp's progress notifications use;
``progress_subscriber(sink)`` derives it from the typed events for a callback that wants it.

This module is a leaf: no I/O, no clock of its own, nothing above it imported.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar, cast

from truss._clock import Clock
from truss.ledger.entry import StoredEntry

__all__ = [
    "CallDenied",
    "CallEnded",
    "CallStarted",
    "CheckpointSigned",
    "CheckpointWitnessed",
    "Event",
    "EventBus",
    "ModelAnswered",
    "PanelReviewed",
    "ProgressEvent",
    "ProgressSink",
    "RunEvents",
    "ServerEvent",
    "SessionEnded",
    "SessionStarted",
    "Subscriber",
    "Suspended",
    "ToolProgress",
    "TurnEnded",
    "TurnStarted",
    "VerdictReached",
    "progress_subscriber",
]

_log = logging.getLogger("truss.events")

_E = TypeVar("_E")


class _Factory:
    """A field with a default factory that the caller left out (shown as dataclasses shows it)."""

    def __repr__(self) -> str:
        return "<factory>"


_NOT_GIVEN: Any = _Factory()


def _filled(cls: type[_E]) -> type[_E]:
    """``cls`` (a frozen, keyword-only dataclass) with an ``__init__`` that fills the new instance's
    ``__dict__`` directly instead of calling ``object.__setattr__`` once per field, as a frozen
    dataclass's own does: the same signature, defaults, factories and resulting object, at about a
    third of the cost (a replayed turn builds five events; bench/long_run.py's resume). The instance
    stays frozen: only ``__init__`` writes past ``__setattr__``."""
    assert "__slots__" not in cls.__dict__ and not hasattr(cls, "__post_init__")
    fields = dataclasses.fields(cast(Any, cls))
    taken = {spec.name for spec in fields}

    def own(name: str) -> str:  # a name of the generated code's own that no field (parameter) shadows
        while name in taken:
            name = f"_{name}"
        return name

    me, state, missing = own("self"), own("state"), own("_NOT_GIVEN")
    namespace: dict[str, Any] = {missing: _NOT_GIVEN}
    params: list[str] = []
    lines: list[str] = []
    for spec in fields:
        name = spec.name
        assert spec.init and spec.kw_only and name.isidentifier()
        if spec.default is not dataclasses.MISSING:
            namespace[f"_default_{name}"] = spec.default  # read where the signature is made, not in the body
            params.append(f"{name}=_default_{name}")
            lines.append(f"    {state}[{name!r}] = {name}")
        elif spec.default_factory is not dataclasses.MISSING:
            factory = own(f"_factory_{name}")
            namespace[factory] = spec.default_factory
            params.append(f"{name}={missing}")
            lines.append(f"    {state}[{name!r}] = {factory}() if {name} is {missing} else {name}")
        else:
            params.append(name)
            lines.append(f"    {state}[{name!r}] = {name}")
    head = f"def __init__({me}, *, {', '.join(params)}):\n    {state} = {me}.__dict__\n"
    source = head + "\n".join(lines) + "\n"
    exec(source, namespace)  # noqa: S102 - built from the class's own field names, as dataclasses does
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    cls.__init__ = init  # pyright: ignore[reportAttributeAccessIssue]
    return cls


# -- the events -----------------------------------------------------------------------------------


@_filled
@dataclass(frozen=True, kw_only=True)
class Event:
    """What every event carries. ``kind`` names the event type (``call_ended`` ...)."""

    kind: ClassVar[str] = "event"
    session: str
    span: str  # the span this event starts or ends, or (point events) happened in
    parent: str | None  # the parent of ``span``
    time_ms: int  # when, on the run's clock (Unix milliseconds)


@_filled
@dataclass(frozen=True, kw_only=True)
class SessionStarted(Event):
    kind: ClassVar[str] = "session_started"
    contract: str
    contract_hash: str
    resumed: bool
    provider: str | None = None  # the contract's agent.provider and agent.model
    model: str | None = None


@_filled
@dataclass(frozen=True, kw_only=True)
class SessionEnded(Event):
    """The leg ended: ``status`` as the run returned it (pass, fail, error, suspended, interrupted,
    diverged), or ``error`` with ``reason`` the exception's type when it raised."""

    kind: ClassVar[str] = "session_ended"
    start_ms: int
    status: str
    reason: str | None = None
    seq: int | None = None  # the leg's last entry
    index: int | None = None


@_filled
@dataclass(frozen=True, kw_only=True)
class TurnStarted(Event):
    kind: ClassVar[str] = "turn_started"
    turn: int


@_filled
@dataclass(frozen=True, kw_only=True)
class TurnEnded(Event):
    """``outcome``: ``ok`` (the run goes on), or why the loop stopped in this turn (``done``,
    ``suspended``, ``budget``, ``deadline``, ``provider_error``, ``error``)."""

    kind: ClassVar[str] = "turn_ended"
    start_ms: int
    turn: int
    outcome: str
    calls: int = 0


@_filled
@dataclass(frozen=True, kw_only=True)
class ModelAnswered(Event):
    """The turn's ``model_turn`` entry was recorded (or, ``replayed``, found in the record)."""

    kind: ClassVar[str] = "model_answered"
    turn: int
    provider: str
    replayed: bool
    tool_calls: int
    input_tokens: int
    output_tokens: int
    stop_reason: str | None
    seq: int
    index: int


@_filled
@dataclass(frozen=True, kw_only=True)
class CallStarted(Event):
    kind: ClassVar[str] = "call_started"
    call: str
    tool: str
    server: str | None
    turn: int


@_filled
@dataclass(frozen=True, kw_only=True)
class CallEnded(Event):
    """How the gate settled the call. ``outcome``: ok, tool_error, failed, denied, suspended, or
    ``error`` when the gate raised (in doubt, divergence; ``code`` is the exception's type).
    ``decision``: the policy's (allow, deny, ask) when it was asked in this leg. ``seq``/``index``:
    the last entry recorded for the call."""

    kind: ClassVar[str] = "call_ended"
    start_ms: int
    call: str
    tool: str
    server: str | None
    turn: int
    outcome: str
    code: str | None = None
    reason: str | None = None
    limit: str | None = None
    decision: str | None = None
    duration_ms: float = 0.0
    replayed: bool = False
    seq: int | None = None
    index: int | None = None
    budget_left: Mapping[str, Any] = field(default_factory=dict[str, Any])
    memo_from: str | None = None  # a memo hit: the session whose recorded result answered the call


@_filled
@dataclass(frozen=True, kw_only=True)
class CallDenied(Event):
    kind: ClassVar[str] = "call_denied"
    call: str
    tool: str
    code: str
    reason: str
    rule: int | None
    limit: str | None
    seq: int
    index: int


@_filled
@dataclass(frozen=True, kw_only=True)
class ToolProgress(Event):
    kind: ClassVar[str] = "tool_progress"
    call: str
    tool: str
    detail: str


@_filled
@dataclass(frozen=True, kw_only=True)
class Suspended(Event):
    kind: ClassVar[str] = "suspended"
    reason: str
    calls: tuple[str, ...]
    detail: str | None
    seq: int | None
    index: int | None


@_filled
@dataclass(frozen=True, kw_only=True)
class CheckpointSigned(Event):
    kind: ClassVar[str] = "checkpoint_signed"
    size: int | None  # the tree size the checkpoint covers


@_filled
@dataclass(frozen=True, kw_only=True)
class CheckpointWitnessed(Event):
    """What the witnesses did with the end-of-session checkpoint (``truss.witness.submit``):
    ``witnessed`` when their cosignatures meet the policy's quorum; ``outcomes`` per witness."""

    kind: ClassVar[str] = "checkpoint_witnessed"
    size: int
    witnessed: bool
    summary: str
    outcomes: tuple[tuple[str, str], ...] = ()


@_filled
@dataclass(frozen=True, kw_only=True)
class VerdictReached(Event):
    kind: ClassVar[str] = "verdict"
    status: str
    reason: str | None
    seq: int
    index: int
    error: str | None = None  # for an ``error`` verdict, its cause (budget, deadline, provider, server, input)


@_filled
@dataclass(frozen=True, kw_only=True)
class PanelReviewed(Event):
    """A reviewer's ``panel_review`` entry was recorded (or, ``replayed``, found in the record).
    ``outcome``: approve, reject or failed; ``reason`` is the recorded one-line reason."""

    kind: ClassVar[str] = "panel_reviewed"
    check: int
    reviewer: str
    provider: str
    outcome: str
    reason: str
    replayed: bool
    input_tokens: int
    output_tokens: int
    seq: int
    index: int


@_filled
@dataclass(frozen=True, kw_only=True)
class ServerEvent(Event):
    """Something a launcher or an auth flow reports about one server (``name``: what happened)."""

    kind: ClassVar[str] = "server_event"
    server: str
    name: str
    attributes: Mapping[str, Any] = field(default_factory=dict[str, Any])


Subscriber = Callable[[Event], None]


# -- delivery -------------------------------------------------------------------------------------


class EventBus:
    """Subscribers of a run's events (any number); ``emit`` delivers to each, isolating failures."""

    def __init__(self, subscribers: Iterable[Subscriber] = ()) -> None:
        # A tuple, replaced when a subscriber comes or goes: an event is delivered to the subscribers
        # there were when it was emitted, even when one of them (un)subscribes meanwhile.
        self._subscribers: tuple[Subscriber, ...] = tuple(subscribers)
        self.failures = 0

    def subscribe(self, subscriber: Subscriber) -> Callable[[], None]:
        """Add ``subscriber``; returns a function that removes it again."""
        self._subscribers = (*self._subscribers, subscriber)

        def unsubscribe() -> None:
            held = list(self._subscribers)
            if subscriber in held:
                held.remove(subscriber)
                self._subscribers = tuple(held)

        return unsubscribe

    def __bool__(self) -> bool:
        return bool(self._subscribers)

    def emit(self, event: Event) -> None:
        for subscriber in self._subscribers:
            try:
                subscriber(event)
            except Exception:
                self.failures += 1
                _log.debug("event subscriber %r failed on %s", subscriber, event.kind, exc_info=True)


class RunEvents:
    """Builds one run leg's events (ids, parents, times) and emits them on a bus.

    The gate, the loop and the session call it; with no subscriber every method returns at once,
    so a run that nobody watches pays nothing.
    """

    def __init__(self, bus: EventBus, clock: Clock, session: str, *, start_seq: int = 0) -> None:
        self.bus = bus
        self._clock = clock
        self.session = session
        self.span = f"{session}@{start_seq}"
        self._starts: dict[str, int] = {}
        self._turn_span: tuple[int, str] = (-1, "")

    @property
    def active(self) -> bool:
        return bool(self.bus)

    def _now(self) -> int:
        return self._clock.now_ms()

    def turn_span(self, turn: int) -> str:
        held = self._turn_span
        if held[0] != turn:  # a turn's events name its span about five times: built once
            held = self._turn_span = (turn, f"{self.span}/t{turn}")
        return held[1]

    def call_span(self, call: str) -> str:
        return f"{self.span}/{call}"

    def _start(self, span: str) -> int:
        now = self._now()
        self._starts[span] = now
        return now

    def _end(self, span: str) -> tuple[int, int]:
        now = self._now()
        return self._starts.pop(span, now), now

    # -- session --

    def session_started(
        self, *, contract: str, contract_hash: str, resumed: bool, provider: str | None = None, model: str | None = None
    ) -> None:
        if self.bus:
            now = self._start(self.span)
            self.bus.emit(SessionStarted(session=self.session, span=self.span, parent=None, time_ms=now,
                                         contract=contract, contract_hash=contract_hash, resumed=resumed,
                                         provider=provider, model=model))  # fmt: skip

    def session_ended(self, status: str, reason: str | None, last: StoredEntry | None = None) -> None:
        if self.bus:
            start, now = self._end(self.span)
            self.bus.emit(SessionEnded(session=self.session, span=self.span, parent=None, time_ms=now,
                                       start_ms=start, status=status, reason=reason, seq=_seq(last),
                                       index=_index(last)))  # fmt: skip

    def suspended(self, reason: str, calls: tuple[str, ...], detail: str | None, entry: StoredEntry | None) -> None:
        if self.bus:
            self.bus.emit(Suspended(session=self.session, span=self.span, parent=None, time_ms=self._now(),
                                    reason=reason, calls=calls, detail=detail, seq=_seq(entry),
                                    index=_index(entry)))  # fmt: skip

    def checkpoint_signed(self, note: str | None) -> None:
        if self.bus:
            size = _checkpoint_size(note)
            self.bus.emit(CheckpointSigned(session=self.session, span=self.span, parent=None, time_ms=self._now(),
                                           size=size))  # fmt: skip

    def verdict(self, status: str, reason: str | None, entry: StoredEntry) -> None:
        if self.bus:
            error: Any = entry.body.get("error")
            cause: Any = cast(Mapping[str, Any], error).get("cause") if isinstance(error, Mapping) else None
            self.bus.emit(VerdictReached(session=self.session, span=self.span, parent=None, time_ms=self._now(),
                                         status=status, reason=reason, seq=entry.seq, index=entry.index,
                                         error=cause if isinstance(cause, str) else None))  # fmt: skip

    def panel_reviewed(self, entry: StoredEntry, *, replayed: bool) -> None:
        if self.bus:
            body: Mapping[str, Any] = entry.body
            usage: Mapping[str, Any] = body.get("usage") or {}
            self.bus.emit(PanelReviewed(
                session=self.session, span=self.span, parent=None, time_ms=self._now(), check=int(body["check"]),
                reviewer=str(body.get("name")), provider=str(body.get("provider")), outcome=str(body.get("outcome")),
                reason=str(body.get("reason") or ""), replayed=replayed,
                input_tokens=int(usage.get("input_tokens") or 0), output_tokens=int(usage.get("output_tokens") or 0),
                seq=entry.seq, index=entry.index,
            ))  # fmt: skip

    def checkpoint_witnessed(
        self, size: int, witnessed: bool, summary: str, outcomes: tuple[tuple[str, str], ...]
    ) -> None:
        if self.bus:
            self.bus.emit(CheckpointWitnessed(session=self.session, span=self.span, parent=None, time_ms=self._now(),
                                              size=size, witnessed=witnessed, summary=summary,
                                              outcomes=outcomes))  # fmt: skip

    def server_event(self, server: str, name: str, attributes: Mapping[str, Any]) -> None:
        if self.bus:
            self.bus.emit(ServerEvent(session=self.session, span=self.span, parent=None, time_ms=self._now(),
                                      server=server, name=name, attributes=dict(attributes)))  # fmt: skip

    # -- turns --

    def turn_started(self, turn: int) -> None:
        if self.bus:
            span = self.turn_span(turn)
            self.bus.emit(TurnStarted(session=self.session, span=span, parent=self.span, time_ms=self._start(span),
                                      turn=turn))  # fmt: skip

    def turn_ended(self, turn: int, outcome: str, calls: int = 0) -> None:
        if self.bus:
            span = self.turn_span(turn)
            start, now = self._end(span)
            self.bus.emit(TurnEnded(session=self.session, span=span, parent=self.span, time_ms=now, start_ms=start,
                                    turn=turn, outcome=outcome, calls=calls))  # fmt: skip

    def model_answered(self, turn: int, entry: StoredEntry, *, replayed: bool) -> None:
        if self.bus:
            body: Mapping[str, Any] = entry.body
            usage: Mapping[str, Any] = body.get("usage") or {}
            stop: Any = body.get("stop_reason")
            self.bus.emit(ModelAnswered(
                session=self.session, span=self.turn_span(turn), parent=self.span, time_ms=self._now(), turn=turn,
                provider=str(body.get("provider")), replayed=replayed, tool_calls=int(body.get("tool_calls") or 0),
                input_tokens=int(usage.get("input_tokens") or 0), output_tokens=int(usage.get("output_tokens") or 0),
                stop_reason=stop if isinstance(stop, str) else None, seq=entry.seq, index=entry.index,
            ))  # fmt: skip

    # -- calls --

    def call_started(self, call: str, tool: str, server: str | None, turn: int) -> None:
        if self.bus:
            span = self.call_span(call)
            self.bus.emit(CallStarted(session=self.session, span=span, parent=self.turn_span(turn),
                                      time_ms=self._start(span), call=call, tool=tool, server=server,
                                      turn=turn))  # fmt: skip

    def call_ended(
        self,
        call: str,
        tool: str,
        server: str | None,
        turn: int,
        *,
        outcome: str,
        code: str | None = None,
        reason: str | None = None,
        limit: str | None = None,
        decision: str | None = None,
        duration_ms: float = 0.0,
        replayed: bool = False,
        entry: StoredEntry | None = None,
        budget_left: Mapping[str, Any] | None = None,
    ) -> None:
        if self.bus:
            span = self.call_span(call)
            start, now = self._end(span)
            self.bus.emit(CallEnded(
                session=self.session, span=span, parent=self.turn_span(turn), time_ms=now, start_ms=start, call=call,
                tool=tool, server=server, turn=turn, outcome=outcome, code=code, reason=reason, limit=limit,
                decision=decision, duration_ms=duration_ms, replayed=replayed, seq=_seq(entry), index=_index(entry),
                budget_left=dict(budget_left or {}), memo_from=_memo_from(entry),
            ))  # fmt: skip

    def call_denied(self, call: str, tool: str, turn: int, entry: StoredEntry) -> None:
        if self.bus:
            body: Mapping[str, Any] = entry.body
            rule: Any = body.get("rule")
            limit: Any = body.get("limit")
            self.bus.emit(CallDenied(
                session=self.session, span=self.call_span(call), parent=self.turn_span(turn), time_ms=self._now(),
                call=call, tool=tool, code=str(body.get("code")), reason=str(body.get("reason")),
                rule=rule if isinstance(rule, int) else None, limit=limit if isinstance(limit, str) else None,
                seq=entry.seq, index=entry.index,
            ))  # fmt: skip

    def tool_progress(self, call: str, tool: str, turn: int, detail: str) -> None:
        if self.bus:
            self.bus.emit(ToolProgress(session=self.session, span=self.call_span(call), parent=self.turn_span(turn),
                                       time_ms=self._now(), call=call, tool=tool, detail=detail))  # fmt: skip


def _seq(entry: StoredEntry | None) -> int | None:
    return entry.seq if entry is not None else None


def _index(entry: StoredEntry | None) -> int | None:
    return entry.index if entry is not None else None


def _memo_from(entry: StoredEntry | None) -> str | None:
    """The origin session of a memo hit (an ``mcp_tool_call`` answered from an earlier record)."""
    if entry is None or entry.kind != "mcp_tool_call":
        return None
    origin: Any = entry.body.get("replayed_from")
    return str(cast(Mapping[str, Any], origin).get("session")) if isinstance(origin, Mapping) else None


def _checkpoint_size(note: str | None) -> int | None:
    lines = note.split("\n") if note else []
    return int(lines[1]) if len(lines) > 1 and lines[1].isdigit() else None


# -- the flat progress view -----------------------------------------------------------------------


@dataclass(frozen=True)
class ProgressEvent:
    """What serve-mcp turns into progress notifications (and ``progress_subscriber`` sinks receive).

    ``kind``: ``call`` (a gate outcome), ``turn`` (a model turn), ``tool_progress`` (a server's
    progress notification), ``review`` (a panel reviewer's outcome, ``tool`` its name),
    ``suspended``, ``verdict``, ``witness`` (what the witnesses did with the end-of-session
    checkpoint). Never carries arguments or results.
    """

    kind: str
    session: str
    call: str | None = None
    tool: str | None = None
    outcome: str | None = None
    duration_ms: float | None = None
    detail: str | None = None
    budget_left: Mapping[str, Any] | None = None
    replayed: bool = False


ProgressSink = Callable[[ProgressEvent], None]


def progress_subscriber(sink: ProgressSink) -> Subscriber:
    """A subscriber that hands ``sink`` the ``ProgressEvent`` view of the events that have one."""

    def deliver(event: Event) -> None:
        progress = as_progress(event)
        if progress is not None:
            sink(progress)

    return deliver


def as_progress(event: Event) -> ProgressEvent | None:
    """The ``ProgressEvent`` view of ``event``, or None when it has none."""
    if isinstance(event, CallEnded):
        if event.outcome == "error":  # the gate raised: the run reports that, not a call line
            return None
        return ProgressEvent("call", event.session, event.call, event.tool, event.outcome, event.duration_ms,
                             event.code, event.budget_left, event.replayed)  # fmt: skip
    if isinstance(event, ToolProgress):
        return ProgressEvent("tool_progress", event.session, event.call, event.tool, detail=event.detail)
    if isinstance(event, ModelAnswered):
        return ProgressEvent("turn", event.session, detail=f"turn {event.turn}", replayed=event.replayed)
    if isinstance(event, PanelReviewed):
        return ProgressEvent("review", event.session, tool=event.reviewer, outcome=event.outcome, detail=event.reason,
                             replayed=event.replayed)  # fmt: skip
    if isinstance(event, Suspended):
        return ProgressEvent("suspended", event.session, outcome=event.reason, detail=event.detail)
    if isinstance(event, VerdictReached):
        return ProgressEvent("verdict", event.session, outcome=event.status, detail=event.reason)
    if isinstance(event, CheckpointWitnessed):
        outcome = "witnessed" if event.witnessed else "not_witnessed"
        return ProgressEvent("witness", event.session, outcome=outcome, detail=event.summary)
    return None
