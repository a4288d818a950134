"""The run's typed event stream: a span tree (session -> turns -> calls) with point events inside,
seen alike by every subscriber, and a subscriber that raises never breaks the run."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.gate.support import ListProvider, calls, contract_from, fake_connector, new_store
from truss.contract import Contract
from truss.events import (
    CallDenied,
    CallEnded,
    CallStarted,
    CheckpointSigned,
    Event,
    EventBus,
    ModelAnswered,
    SessionEnded,
    SessionStarted,
    Suspended,
    TurnEnded,
    TurnStarted,
    VerdictReached,
    _filled,  # pyright: ignore[reportPrivateUsage] - the generator of their __init__
    progress_subscriber,
)
from truss.providers.base import Provider, TurnResponse
from truss.runtime import Runtime
from truss.session import approve_call, resume_session, run_contract
from truss.testing import FakeTransport, ManualClock, mounted_tool, text_result
from truss.tools import MountedTool, ToolResult

pytestmark = pytest.mark.anyio

TEXT = """
[contract]
name = "events"
intent = "read, try to delete, then write with approval"
[[policy.rules]]
tool = "mcp:srv:delete"
effect = "deny"
reason = "nothing is deleted"
[[policy.rules]]
tool = "mcp:srv:write"
effect = "ask"
reason = "writes need a person"
[[mcp.servers]]
name = "srv"
command = "unused"
allow_tools = ["read", "delete", "write"]
[[done.checks]]
kind = "tool_succeeded"
tool = "mcp:srv:write"
"""


def _transport() -> FakeTransport:
    async def handler(tool: MountedTool, arguments: Mapping[str, Any]) -> ToolResult:
        return text_result(f"{tool.tool} {arguments.get('path')}")

    schema = {"type": "object"}
    return FakeTransport(
        handler, tools=[mounted_tool("srv", name, input_schema=schema) for name in ("read", "delete", "write")]
    )


def _boom(event: Event) -> None:
    raise RuntimeError(f"a broken exporter choked on {event.kind}")


def _spans(events: list[Event]) -> dict[str, tuple[Event, Event]]:
    """span id -> (its start event, its end event); every span that starts also ends, once."""
    starts = {e.span: e for e in events if isinstance(e, SessionStarted | TurnStarted | CallStarted)}
    ends = {e.span: e for e in events if isinstance(e, SessionEnded | TurnEnded | CallEnded)}
    assert starts.keys() == ends.keys()
    assert len(starts) == sum(isinstance(e, SessionStarted | TurnStarted | CallStarted) for e in events)
    for span, start in starts.items():
        end = ends[span]
        assert end.parent == start.parent and events.index(start) < events.index(end)
        assert getattr(end, "start_ms") == start.time_ms <= end.time_ms  # noqa: B009 - every end event has it
    return {span: (starts[span], ends[span]) for span in starts}


async def test_a_subscriber_sees_the_tree_of_a_run_with_two_turns_a_denial_and_a_suspension(tmp_path: Path) -> None:
    clock = ManualClock()
    store, key = new_store(tmp_path, clock)
    contract: Contract = contract_from(TEXT)
    model = ListProvider([
        calls(("mcp__srv__read", {"path": "a"}), ("mcp__srv__delete", {"path": "a"})),
        calls(("mcp__srv__write", {"path": "b"})),
        TurnResponse("wrote it"),
    ])  # fmt: skip

    def provider(_contract: Contract) -> Provider:
        return model

    first: list[Event] = []
    second: list[Event] = []
    transport = _transport()
    runtime = Runtime(store=store, key=key, clock=clock, home=tmp_path / "home", environ={},
                      connector=fake_connector(transport), provider=provider)  # fmt: skip
    with anyio.fail_after(20):
        live = dataclasses.replace(runtime, events=[first.append, _boom, second.append])
        outcome = await run_contract(live, contract, session_id="s1")
    assert (outcome.status, outcome.waiting) == ("suspended", ("c2.0",))
    assert first == second  # every subscriber sees the same stream, a failing one in between or not

    spans = _spans(first)
    session, t1, t2 = "s1@0", "s1@0/t1", "s1@0/t2"
    assert {span: start.parent for span, (start, _) in spans.items()} == {
        session: None,
        t1: session,
        t2: session,
        "s1@0/c1.0": t1,
        "s1@0/c1.1": t1,
        "s1@0/c2.0": t2,
    }
    assert isinstance(first[0], SessionStarted) and isinstance(first[-1], SessionEnded)
    assert (first[0].contract, first[0].resumed) == ("events", False)
    assert (first[-1].status, first[-1].reason) == ("suspended", "waiting for approval")

    recorded = {e.seq: e for e in store.read_session("s1")}
    ended = {e.call: e for e in first if isinstance(e, CallEnded)}
    assert (ended["c1.0"].outcome, ended["c1.0"].decision, ended["c1.0"].server) == ("ok", "allow", "srv")
    assert recorded[ended["c1.0"].seq or 0].kind == "mcp_tool_call"
    assert (ended["c1.1"].outcome, ended["c1.1"].code, ended["c1.1"].decision) == ("denied", "rule", "deny")
    assert (ended["c2.0"].outcome, ended["c2.0"].code, ended["c2.0"].decision) == ("suspended", "approval", "ask")
    assert recorded[ended["c2.0"].seq or 0].kind == "approval_requested"
    assert ended["c1.0"].budget_left["tool_calls"] >= 0

    [denied] = [e for e in first if isinstance(e, CallDenied)]
    assert (denied.span, denied.parent, denied.code, denied.rule) == ("s1@0/c1.1", t1, "rule", 0)
    assert recorded[denied.seq].kind == "mcp_tool_denied" and recorded[denied.seq].index == denied.index
    assert first.index(spans["s1@0/c1.1"][0]) < first.index(denied) < first.index(spans["s1@0/c1.1"][1])

    answered = [e for e in first if isinstance(e, ModelAnswered)]
    assert [(e.turn, e.span, e.replayed, e.tool_calls) for e in answered] == [(1, t1, False, 2), (2, t2, False, 1)]
    assert all(recorded[e.seq].kind == "model_turn" for e in answered)
    turns = {e.turn: e for e in first if isinstance(e, TurnEnded)}
    assert (turns[1].outcome, turns[1].calls, turns[2].outcome, turns[2].calls) == ("ok", 2, "suspended", 1)

    [suspended] = [e for e in first if isinstance(e, Suspended)]
    assert (suspended.span, suspended.reason, suspended.calls) == (session, "approval", ("c2.0",))
    assert recorded[suspended.seq or 0].kind == "session_suspended"
    [checkpoint] = [e for e in first if isinstance(e, CheckpointSigned)]
    assert checkpoint.size == len(recorded)
    assert not any(isinstance(e, VerdictReached) for e in first)

    # The resumed leg is a new session span; the recorded turns come back replayed, c2.0 now runs.
    approve_call(runtime, "s1", "c2.0", approved=True)
    resumed: list[Event] = []
    with anyio.fail_after(20):
        finished = await resume_session(dataclasses.replace(runtime, events=[resumed.append]), "s1")
    assert finished.status == "pass"
    leg = _spans(resumed)
    root = next(span for span, (start, _) in leg.items() if start.parent is None)
    start_seq = int(root.split("@")[1])
    assert root == f"s1@{start_seq}" and start_seq == len(recorded) + 1  # after the approval_decided
    assert next(e.kind for e in store.read_session("s1", from_seq=start_seq)) == "session_resumed"
    assert isinstance(resumed[0], SessionStarted) and resumed[0].resumed
    replays = [(e.turn, e.replayed) for e in resumed if isinstance(e, ModelAnswered)]
    assert replays == [(1, True), (2, True), (3, False)]
    again = {e.call: e for e in resumed if isinstance(e, CallEnded)}
    assert (again["c1.0"].replayed, again["c1.1"].replayed) == (True, True)
    assert (again["c2.0"].outcome, again["c2.0"].decision, again["c2.0"].replayed) == ("ok", "ask", False)
    [verdict] = [e for e in resumed if isinstance(e, VerdictReached)]
    assert (verdict.status, verdict.span) == ("pass", root)
    assert isinstance(resumed[-1], SessionEnded) and resumed[-1].status == "pass"


async def test_progress_callers_get_the_flat_view_of_the_same_stream(tmp_path: Path) -> None:
    clock = ManualClock()
    store, key = new_store(tmp_path, clock)
    model = ListProvider([calls(("mcp__srv__read", {"path": "a"})), TurnResponse("done")])
    progress: list[Any] = []
    with anyio.fail_after(20):
        await run_contract(
            Runtime(
                store=store,
                key=key,
                clock=clock,
                home=tmp_path / "home",
                environ={},
                connector=fake_connector(_transport()),
                provider=lambda _c: model,
                events=(progress_subscriber(progress.append),),
            ),
            contract_from(TEXT),
            session_id="s1",
        )
    assert [(p.kind, p.call, p.outcome) for p in progress] == [
        ("turn", None, None),
        ("call", "c1.0", "ok"),
        ("turn", None, None),
        ("verdict", None, "fail"),
    ]


def test_events_are_frozen_dataclasses_with_their_defaults_and_a_fresh_default_per_event() -> None:
    common: dict[str, Any] = {"session": "s", "span": "s@0/c1.0", "parent": "s@0/t1", "time_ms": 2, "start_ms": 1}
    first = CallEnded(**common, call="c1.0", tool="mcp:srv:read", server="srv", turn=1, outcome="ok")
    second = CallEnded(**common, call="c1.0", tool="mcp:srv:read", server="srv", turn=1, outcome="ok")
    assert first == second and first.code is None and first.duration_ms == 0.0 and first.memo_from is None
    assert first.budget_left == {} and first.budget_left is not second.budget_left  # the factory, each time
    assert dataclasses.asdict(first)["outcome"] == "ok" and [f.name for f in dataclasses.fields(first)][:4] == [
        "session", "span", "parent", "time_ms"
    ]  # fmt: skip
    assert repr(first).startswith("CallEnded(session='s', span='s@0/c1.0'")
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.outcome = "error"  # type: ignore[misc]
    with pytest.raises(TypeError, match="missing"):
        CallEnded(**common)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        TurnStarted("s", "s@0/t1", "s@0", 1, turn=1)  # type: ignore[misc]  # keyword-only, as declared
    assert TurnStarted(session="s", span="x", parent=None, time_ms=1, turn=1) != TurnStarted(
        session="s", span="x", parent=None, time_ms=1, turn=2
    )


def test_a_subscriber_that_leaves_while_an_event_is_delivered_misses_only_later_ones() -> None:
    bus = EventBus()
    seen: list[tuple[str, int]] = []

    def leaving(event: Event) -> None:
        seen.append(("leaving", event.time_ms))
        unsubscribe()

    unsubscribe = bus.subscribe(leaving)
    bus.subscribe(lambda event: seen.append(("staying", event.time_ms)))
    for n in (1, 2):
        bus.emit(TurnStarted(session="s", span="x", parent=None, time_ms=n, turn=n))
    assert seen == [("leaving", 1), ("staying", 1), ("staying", 2)]
    unsubscribe()  # a second time: nothing left to remove
    assert bool(bus)


def test_an_event_with_fields_named_like_the_names_inside_its_generated_init_keeps_the_values_given() -> None:
    # ``_filled`` writes an ``__init__`` whose own names (self, the instance's dict, the sentinel of a
    # left-out factory field, each factory) must not be taken for a field of the same name.
    @_filled
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Odd(Event):
        state: str
        self: str = "default"
        _NOT_GIVEN: int = 0
        _factory_extra: str = "not a factory"
        extra: Mapping[str, Any] = dataclasses.field(default_factory=dict[str, Any])

    odd = vars(Odd(session="s", span="x", parent=None, time_ms=1, state="open", self="me", _NOT_GIVEN=3))
    expected: dict[str, Any] = {"state": "open", "self": "me", "_NOT_GIVEN": 3, "_factory_extra": "not a factory"}
    assert {name: odd[name] for name in expected} == expected and odd["extra"] == {}
    assert Odd(session="s", span="x", parent=None, time_ms=1, state="open").self == "default"
