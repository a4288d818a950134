"""Quotas across runs: reserve the worst case before a run starts, settle to what it used at its end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.gate.support import contract_from, fake_connector, new_store, scripted
from truss._errors import QuotaExceededError
from truss._quota_book import quota_book, reserve
from truss.contract import Contract
from truss.durable import resolve_call
from truss.ledger.keys import TrustedKeys
from truss.ledger.verification import verify_ledger
from truss.quota import QUOTA_SESSION
from truss.runtime import Runtime
from truss.session import RunOutcome, approve_call, resume_session, run_contract
from truss.testing import FakeTransport, ManualClock, mounted_tool, text_result
from truss.tools import MountedTool, ToolResult

pytestmark = pytest.mark.anyio

HOUR_MS = 3_600_000

FIVE_RUNS = """
[contract]
name = "five-a-day"
intent = "read once"
[budget]
max_tool_calls = 2
[[quotas]]
name = "runs-per-day"
window = "24h"
runs = 5
[[mcp.servers]]
name = "srv"
command = "unused"
allow_tools = ["read", "write"]
[[agent.steps]]
tool = "mcp:srv:read"
"""

TEN_CALLS = """
[contract]
name = "ten-calls"
intent = "write once, with a person's approval"
[budget]
max_tool_calls = 4
[policy]
[[policy.rules]]
tool = "mcp:srv:write"
effect = "ask"
[[quotas]]
name = "calls-per-day"
window = "24h"
tool_calls = 10
[[mcp.servers]]
name = "srv"
command = "unused"
allow_tools = ["read", "write"]
[[agent.steps]]
tool = "mcp:srv:write"
"""


QUOTA_BLOCK = """[[quotas]]
name = "runs-per-day"
window = "24h"
runs = 5
"""
ONE_RUN = FIVE_RUNS.replace("runs = 5", "runs = 1")
THREE_CALLS = FIVE_RUNS.replace("runs = 5", "tool_calls = 3")  # a run may use 2, its one step uses 1
NO_QUOTA = FIVE_RUNS.replace(QUOTA_BLOCK, "")  # the same contract, counting against no quota


class World:
    def __init__(self, tmp_path: Path, text: str) -> None:
        self.clock = ManualClock(start_ms=1_800_000_000_000)
        self.store, self.key = new_store(tmp_path, self.clock)
        self.home = tmp_path / "home"
        self.contract: Contract = contract_from(text)

        async def handler(tool: MountedTool, arguments: Any) -> ToolResult:
            return text_result(f"{tool.tool} ok")

        self.transport = FakeTransport(handler, tools=[mounted_tool("srv", "read"), mounted_tool("srv", "write")])

    def runtime(self) -> Runtime:
        return Runtime(store=self.store, key=self.key, clock=self.clock, home=self.home, environ={},
                       connector=fake_connector(self.transport), provider=scripted())  # fmt: skip

    async def run(self, **kw: Any) -> RunOutcome:
        with anyio.fail_after(30):
            return await run_contract(self.runtime(), self.contract, **kw)

    def run_sessions(self) -> list[str]:
        return [s.id for s in self.store.sessions() if not s.id.startswith("@")]


async def test_twenty_concurrent_starts_against_five_runs_a_day_run_exactly_five(tmp_path: Path) -> None:
    w = World(tmp_path, FIVE_RUNS)
    outcomes: list[RunOutcome] = []
    refused: list[QuotaExceededError] = []

    async def start(n: int) -> None:
        try:
            outcomes.append(await w.run(session_id=f"s_start{n}"))
        except QuotaExceededError as exc:
            refused.append(exc)

    async with anyio.create_task_group() as group:
        for n in range(20):
            group.start_soon(start, n)
    assert len(outcomes) == 5 and all(o.status == "pass" for o in outcomes)
    assert len(refused) == 15
    assert {e.quota for e in refused} == {"runs-per-day"} and {e.dimension for e in refused} == {"runs"}
    # Refused before anything started: no session, no call; only the five ran.
    assert len(w.run_sessions()) == 5 and len(w.transport.calls) == 5
    assert QuotaExceededError.exit_code == 6 and all(e.retryable for e in refused)
    # Each refusal says when it frees: a day after the runs' start, or as the running runs end.
    assert all(e.frees_at_ms == 1_800_000_000_000 + 24 * HOUR_MS or e.held_by for e in refused)
    assert verify_ledger(w.store, TrustedKeys([w.key.verifier])).ok


async def test_a_full_window_frees_after_its_time_and_a_clock_set_back_does_not_shorten_it(tmp_path: Path) -> None:
    w = World(tmp_path, FIVE_RUNS)
    for _ in range(5):
        assert (await w.run()).status == "pass"
    with pytest.raises(QuotaExceededError) as refused:
        await w.run()
    assert refused.value.frees_at_ms == 1_800_000_000_000 + 24 * HOUR_MS

    w.clock.advance(23 * 3600)
    with pytest.raises(QuotaExceededError):
        await w.run()
    w.clock.set_wall_ms(1_800_000_000_000 - 48 * HOUR_MS)  # set back two days: the window must not look over
    with pytest.raises(QuotaExceededError):
        await w.run()
    w.clock.set_wall_ms(1_800_000_000_000 + 24 * HOUR_MS)
    assert (await w.run()).status == "pass"
    stamps = [e.body["at_ms"] for e in w.store.read_session(QUOTA_SESSION) if "at_ms" in e.body]
    assert stamps == sorted(stamps)  # time never goes backwards in the quota's record


async def test_ten_calls_a_day_refuses_the_third_run_of_budget_four_until_a_settlement_frees_it(
    tmp_path: Path,
) -> None:
    w = World(tmp_path, TEN_CALLS)
    a = await w.run()
    b = await w.run()
    assert a.status == b.status == "suspended"  # each waits for approval, holding its 4 calls
    with pytest.raises(QuotaExceededError) as refused:
        await w.run()
    assert (refused.value.used, refused.value.limit, refused.value.requested) == (8, 10, 4)
    assert refused.value.frees_at_ms is None and set(refused.value.held_by) == {a.session, b.session}
    assert len(w.run_sessions()) == 2

    approve_call(Runtime(w.store, key=w.key), a.session, a.waiting[0], approved=True)
    with anyio.fail_after(30):
        done = await resume_session(w.runtime(), a.session)
    assert done.status == "pass"
    settled = [e.body for e in w.store.read_session(QUOTA_SESSION) if e.kind == "quota_settled"]
    assert [s["session"] for s in settled] == [a.session]
    assert [u["tool_calls"] for u in settled[0]["used"].values()] == [1]
    third = await w.run()  # 1 used + 4 held + 4 reserved fits 10
    assert third.status == "suspended"


async def test_a_run_whose_budget_alone_exceeds_a_quota_is_refused_as_not_retryable(tmp_path: Path) -> None:
    w = World(tmp_path, TEN_CALLS.replace("tool_calls = 10", "tool_calls = 3"))
    with pytest.raises(QuotaExceededError) as refused:
        await w.run()
    assert not refused.value.retryable and refused.value.requested == 4
    assert w.run_sessions() == []


async def test_a_token_quota_over_a_run_without_max_tokens_is_refused_as_unbounded(tmp_path: Path) -> None:
    w = World(tmp_path, FIVE_RUNS.replace("runs = 5", "tokens = 1000"))
    with pytest.raises(QuotaExceededError) as refused:
        await w.run()
    assert refused.value.dimension == "tokens" and not refused.value.retryable


async def test_a_reservation_whose_run_never_started_holds_the_quota_until_its_deadline_then_is_released(
    tmp_path: Path,
) -> None:
    w = World(tmp_path, ONE_RUN)
    # What a start killed right after its reservation leaves: the reservation, and no session.
    reserve(w.runtime().store, w.contract, session="s_lost", principal=None, now_ms=w.clock.now_ms())
    with pytest.raises(QuotaExceededError) as refused:
        await w.run()
    assert refused.value.held_by == ["s_lost"] and refused.value.retryable
    w.clock.advance(10 * 60)  # the contract's deadline (10m): the lost start can no longer be running
    assert (await w.run()).status == "pass"
    settled = {e.body["session"]: e.body for e in w.store.read_session(QUOTA_SESSION) if e.kind == "quota_settled"}
    assert settled["s_lost"]["how"] == "released"
    assert list(settled["s_lost"]["used"].values()) == [{"runs": 0, "tool_calls": 0, "tokens": 0}]
    assert verify_ledger(w.store, TrustedKeys([w.key.verifier])).ok


async def test_a_run_that_ended_before_its_settlement_was_written_is_settled_from_its_entries_by_the_next_start(
    tmp_path: Path,
) -> None:
    w = World(tmp_path, THREE_CALLS)
    # What a run killed between its session_ended and its settlement leaves: its reservation of 2
    # calls, unsettled, and its session ended having sent 1 call.
    reserve(w.runtime().store, w.contract, session="s_crashed", principal=None, now_ms=w.clock.now_ms())
    ended = await run_contract(w.runtime(), contract_from(NO_QUOTA), session_id="s_crashed")
    assert ended.status == "pass" and len(w.transport.calls) == 1
    # Held in full (2) the next run's 2 would not fit 3; settled to the 1 it used, they do.
    after = await w.run()
    assert after.status == "pass"
    settled = [e.body for e in w.store.read_session(QUOTA_SESSION) if e.kind == "quota_settled"]
    assert [(s["session"], s["how"]) for s in settled] == [("s_crashed", "ended"), (after.session, "ended")]
    assert [u["tool_calls"] for u in settled[0]["used"].values()] == [1]
    assert verify_ledger(w.store, TrustedKeys([w.key.verifier])).ok


PER_TOOL_AND_SERVER = """
[contract]
name = "scoped"
intent = "read twice, write once"
[budget]
max_tool_calls = 4
[[quotas]]
name = "writes-per-day"
window = "24h"
per = "tool"
tool = "mcp:srv:write"
tool_calls = 2
[[quotas]]
name = "srv-calls-per-day"
window = "24h"
per = "server"
tool_calls = 100
[[mcp.servers]]
name = "srv"
command = "unused"
allow_tools = ["read", "write"]
[[mcp.servers.tools]]
name = "write"
budget_calls = 1
[[agent.steps]]
tool = "mcp:srv:read"
[[agent.steps]]
tool = "mcp:srv:read"
[[agent.steps]]
tool = "mcp:srv:write"
"""


async def test_a_tool_quota_reserves_the_tool_s_own_budget_and_counts_only_its_calls_a_server_quota_counts_the_server_s(
    tmp_path: Path,
) -> None:
    w = World(tmp_path, PER_TOOL_AND_SERVER)
    assert (await w.run()).status == "pass"
    assert (await w.run()).status == "pass"  # each reserves 1 write (the tool's budget_calls), not 4
    with pytest.raises(QuotaExceededError) as refused:
        await w.run()
    assert refused.value.quota == "writes-per-day" and refused.value.dimension == "tool_calls"
    assert (refused.value.used, refused.value.limit, refused.value.requested) == (2, 2, 1)
    assert refused.value.frees_at_ms == 1_800_000_000_000 + 24 * HOUR_MS
    reserved = [e.body for e in w.store.read_session(QUOTA_SESSION) if e.kind == "quota_reserved"]
    assert {c["quota"]: c["tool_calls"] for c in reserved[0]["charges"]} == {
        "writes-per-day": 1,
        "srv-calls-per-day": 4,
    }
    settled = [e.body for e in w.store.read_session(QUOTA_SESSION) if e.kind == "quota_settled"]
    assert len(settled) == 2 and len(w.transport.calls) == 6
    for body in settled:  # three calls sent: one of them to the tool, all three to the server
        used = {key.rsplit("|", 1)[1]: amounts["tool_calls"] for key, amounts in body["used"].items()}
        assert used == {"tool=mcp:srv:write": 1, "server=srv": 3}


async def test_a_principal_quota_counts_each_principal_s_runs_apart(tmp_path: Path) -> None:
    w = World(tmp_path, FIVE_RUNS.replace("runs = 5", 'per = "principal"\nruns = 1'))
    assert (await w.run(principal={"caller": "alice"})).status == "pass"
    assert (await w.run(principal={"caller": "bob"})).status == "pass"
    with pytest.raises(QuotaExceededError) as refused:
        await w.run(principal={"caller": "alice"})
    assert refused.value.quota == "runs-per-day" and refused.value.used == 1
    assert len(w.run_sessions()) == 2


async def test_a_run_stopped_in_doubt_keeps_its_reservation_until_the_call_is_resolved_and_the_run_ends(
    tmp_path: Path,
) -> None:
    w = World(
        tmp_path, TEN_CALLS.replace('effect = "ask"', 'effect = "allow"').replace("tool_calls = 10", "tool_calls = 6")
    )
    sent, never = anyio.Event(), anyio.Event()

    async def handler(tool: MountedTool, arguments: Any) -> ToolResult:
        sent.set()
        await never.wait()  # the answer never comes back: the run is stopped with the call out
        return text_result("unreachable")

    w.transport = FakeTransport(handler, tools=[mounted_tool("srv", "read"), mounted_tool("srv", "write")])
    stop = anyio.Event()
    stopped: list[RunOutcome] = []

    async def run() -> None:
        stopped.append(await w.run(stop=stop))

    with anyio.fail_after(30):
        async with anyio.create_task_group() as group:
            group.start_soon(run)
            await sent.wait()
            stop.set()
    session = stopped[0].session
    never.set()  # resumed, the server answers again (the call in doubt is never re-sent)
    with anyio.fail_after(30):
        doubt = await resume_session(w.runtime(), session)
    assert doubt.status == "suspended" and doubt.waiting_on == "in_doubt"
    with pytest.raises(QuotaExceededError) as refused:  # 4 held in full + 4 more would pass 6
        await w.run()
    assert refused.value.held_by == [session] and refused.value.used == 4
    assert [r.session for r in quota_book(w.store).unsettled()] == [session]

    resolve_call(w.runtime(), session, doubt.waiting[0], result={"content": [{"type": "text", "text": "done"}]})
    with anyio.fail_after(30):
        assert (await resume_session(w.runtime(), session)).status == "pass"
    assert quota_book(w.store).unsettled() == []
    assert (await w.run()).status == "pass"  # 1 call used by the resolved run + 4 reserved fits 6
