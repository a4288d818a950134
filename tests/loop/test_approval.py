"""Approvals and resumption: suspend on ``ask``, decide, resume; interrupted runs; what is replayed."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from tests.gate.support import (
    ListProvider,
    calls,
    contract_from,
    entries_of,
    fake_connector,
    kinds_of,
    new_store,
    scripted,
)
from truss._errors import NotFoundError, RunSuspended, UsageError, VerificationError
from truss.contract import Contract
from truss.ledger.envelope import open_verdict
from truss.ledger.keys import TrustedKeys
from truss.ledger.verification import verify_entries
from truss.providers.base import Provider, TurnResponse
from truss.runtime import Runtime
from truss.session import RunOutcome, approve_call, resume_session, run_contract
from truss.testing import FakeTransport, ManualClock, mounted_tool, text_result
from truss.tools import MountedTool, ToolResult

pytestmark = pytest.mark.anyio

TAMPERED = Path(__file__).parent / "tampered_records"

TEXT = """
[contract]
name = "approval-test"
intent = "write a file after reading"
[policy]
default = "allow"
[[policy.rules]]
tool = "mcp:srv:write"
effect = "ask"
reason = "writes need a person"
[[mcp.servers]]
name = "srv"
command = "unused"
allow_tools = ["read", "write"]
retry_in_doubt = ["read"]
[[done.checks]]
kind = "tool_succeeded"
tool = "mcp:srv:write"
"""

READ, WRITE = "mcp__srv__read", "mcp__srv__write"


class World:
    """One ledger, one fake server, and a model whose answers are fixed: replays must ask it nothing."""

    def __init__(self, tmp_path: Path, responses: list[TurnResponse] | None = None) -> None:
        self.clock = ManualClock()
        self.store, self.key = new_store(tmp_path, self.clock)
        self.home = tmp_path / "home"
        self.contract: Contract = contract_from(TEXT)
        self.model = ListProvider(
            responses
            or [
                calls((READ, {"path": "a"})),
                calls((READ, {"path": "b"}), (WRITE, {"path": "c", "text": "x"})),
                TurnResponse("wrote it"),
            ]
        )
        self.gate_open = anyio.Event()
        self.gate_open.set()

        async def handler(tool: MountedTool, arguments: Mapping[str, Any]) -> ToolResult:
            await self.gate_open.wait()
            return text_result(f"{tool.tool} {arguments.get('path')}")

        schema = {"type": "object"}
        self.transport = FakeTransport(
            handler,
            tools=[mounted_tool("srv", "read", input_schema=schema), mounted_tool("srv", "write", input_schema=schema)],
        )

    def provider(self, _contract: Contract) -> Provider:
        return self.model

    async def run(self, **kw: Any) -> RunOutcome:
        with anyio.fail_after(20):
            return await run_contract(
                Runtime(
                    store=self.store,
                    key=self.key,
                    clock=self.clock,
                    home=self.home,
                    environ={},
                    connector=kw.pop("connector", fake_connector(self.transport)),
                    provider=self.provider,
                ),
                self.contract,
                **kw,
            )

    async def resume(self, session: str) -> RunOutcome:
        with anyio.fail_after(20):
            return await resume_session(
                Runtime(
                    store=self.store,
                    key=self.key,
                    clock=self.clock,
                    home=self.home,
                    environ={},
                    connector=fake_connector(self.transport),
                    provider=self.provider,
                ),
                session,
            )

    def verified(self, session: str) -> bool:
        report = verify_entries(
            self.store.read_session(session), TrustedKeys([self.key.verifier]), blobs=self.store.blob
        )
        return report.ok


async def test_ask_suspends_the_run_and_approval_lets_resume_finish_it(tmp_path: Path) -> None:
    w = World(tmp_path)
    first = await w.run()
    assert first.status == "suspended" and first.exit_code == 3 and first.waiting == ("c2.1",)
    assert [c.tool for c in w.transport.calls] == ["mcp:srv:read", "mcp:srv:read"]  # the sibling read ran
    assert kinds_of(w.store, first.session)[-1] == "session_suspended"
    assert w.verified(first.session)

    approve_call(Runtime(w.store, key=w.key), first.session, "c2.1", approved=True, reason="looks fine")
    asked_before = len(w.model.requests)
    second = await w.resume(first.session)
    assert second.status == "pass" and second.exit_code == 0
    # Recorded turns and results came from the ledger: the model was asked only for the new turn,
    # and only the approved write went to the server.
    assert len(w.model.requests) == asked_before + 1
    assert [c.tool for c in w.transport.calls] == ["mcp:srv:read", "mcp:srv:read", "mcp:srv:write"]
    kinds = kinds_of(w.store, first.session)
    assert kinds.count("session_resumed") == 1 and kinds.count("approval_decided") == 1
    assert kinds[-2:] == ["verdict", "session_ended"]
    assert w.verified(first.session)


async def test_a_resumed_run_seals_its_verdict_with_the_contract_hash_its_session_started_with(
    tmp_path: Path,
) -> None:
    w = World(tmp_path)
    first = await w.run()
    approve_call(Runtime(w.store, key=w.key), first.session, "c2.1", approved=True)
    second = await w.resume(first.session)
    assert second.status == "pass"
    recorded = entries_of(w.store, first.session)
    started = recorded[0].body["contract_hash"]
    # The resume takes the hash the loaded contract was checked against instead of hashing it again:
    # the verdict, the outcome and the envelope's predicate still name the contract that ran.
    assert started == w.contract.hash
    assert [e.body["contract_hash"] for e in recorded if e.kind == "verdict"] == [started]
    assert second.verdict is not None and second.verdict["contract_hash"] == started
    envelope = w.store.envelope(first.session)
    assert envelope is not None
    opened = open_verdict(envelope, TrustedKeys([w.key.verifier]), session=first.session, head=second.head)
    assert opened.contract_hash == started


async def test_a_denied_approval_reaches_the_model_as_a_denial(tmp_path: Path) -> None:
    w = World(tmp_path)
    first = await w.run()
    approve_call(Runtime(w.store, key=w.key), first.session, "c2.1", approved=False, reason="not today")
    second = await w.resume(first.session)
    assert second.status == "fail" and second.exit_code == 1
    assert [c.tool for c in w.transport.calls] == ["mcp:srv:read", "mcp:srv:read"]
    last_request = w.model.requests[-1]
    denial = [m for m in last_request.messages if m["role"] == "tool" and m["call_id"] == "m1"][-1]
    assert denial["is_error"] is True and "not today" in denial["text"]
    denied = [e for e in w.store.read_session(first.session) if e.kind == "mcp_tool_denied"]
    assert [d.body["code"] for d in denied] == ["approval_denied"]


@pytest.mark.parametrize("attack", sorted(p.stem for p in TAMPERED.glob("*.sql")))
async def test_resume_of_a_record_tampered_after_approval_is_refused_and_sends_nothing(
    tmp_path: Path, attack: str
) -> None:
    import sqlite3
    from contextlib import closing

    w = World(tmp_path)
    first = await w.run()
    approve_call(Runtime(w.store, key=w.key), first.session, "c2.1", approved=True)
    sent, asked = list(w.transport.calls), len(w.model.requests)
    with closing(sqlite3.connect(w.store.db)) as conn, conn:
        changed = conn.executescript((TAMPERED / f"{attack}.sql").read_text(encoding="utf-8"))
        assert changed.connection.total_changes > 0, attack
    with pytest.raises(VerificationError) as refused:
        await w.resume(first.session)
    assert refused.value.exit_code == 1 and first.session in refused.value.message
    # Verified before anything is replayed: no server call, no model turn, nothing appended.
    assert w.transport.calls == sent and len(w.model.requests) == asked
    assert kinds_of(w.store, first.session)[-1] == "approval_decided"


async def test_resume_before_a_decision_stays_suspended_and_records_nothing(tmp_path: Path) -> None:
    w = World(tmp_path)
    first = await w.run()
    count = len(kinds_of(w.store, first.session))
    with pytest.raises(RunSuspended) as caught:
        await w.resume(first.session)
    assert caught.value.exit_code == 3 and caught.value.call == "c2.1"
    assert len(kinds_of(w.store, first.session)) == count


async def test_a_resume_refused_after_its_read_stops_the_servers_it_started_and_says_nothing(tmp_path: Path) -> None:
    # Two writes wait; one is approved, so the record's last entry is a decision and the servers
    # start while the read goes on; the other still waits, which only the whole read shows.
    w = World(tmp_path, [calls((WRITE, {"path": "a", "text": "x"}), (WRITE, {"path": "b", "text": "y"}))])
    first = await w.run()
    assert first.waiting == ("c1.0", "c1.1")
    approve_call(Runtime(w.store, key=w.key), first.session, "c1.0", approved=True)
    count = len(kinds_of(w.store, first.session))
    opened: list[str] = []

    @asynccontextmanager
    async def connector(_contract: Contract, **_: Any) -> AsyncGenerator[FakeTransport]:
        opened.append("open")
        try:
            yield w.transport
        finally:
            opened.append("closed")

    seen: list[Any] = []
    runtime = Runtime(store=w.store, key=w.key, clock=w.clock, home=w.home, connector=connector,
                      provider=w.provider, events=(seen.append,))  # fmt: skip
    with pytest.raises(RunSuspended) as caught, anyio.fail_after(20):
        await resume_session(runtime, first.session)
    assert caught.value.exit_code == 3 and caught.value.call == "c1.1"
    assert opened.count("open") == opened.count("closed")  # whatever started was stopped
    assert seen == [] and w.transport.calls == []  # no run event, nothing sent
    assert len(kinds_of(w.store, first.session)) == count  # nothing appended
    lease = w.store.lease(first.session)
    assert lease is None or not lease.held(w.clock.now_ms())  # given up again


async def test_approving_twice_or_an_unknown_call_is_refused(tmp_path: Path) -> None:
    w = World(tmp_path)
    first = await w.run()
    with pytest.raises(NotFoundError):
        approve_call(Runtime(w.store, key=w.key), first.session, "c9.9", approved=True)
    with pytest.raises(NotFoundError):
        approve_call(Runtime(w.store, key=w.key), "s_missing", "c2.1", approved=True)
    approve_call(Runtime(w.store, key=w.key), first.session, "c2.1", approved=True)
    with pytest.raises(UsageError):
        approve_call(Runtime(w.store, key=w.key), first.session, "c2.1", approved=False)


async def test_a_stop_request_records_the_run_as_interrupted_and_resume_finishes_it(tmp_path: Path) -> None:
    w = World(tmp_path, [calls((READ, {"path": "a"})), TurnResponse("read it")])
    w.contract = contract_from(TEXT.replace('kind = "tool_succeeded"\ntool = "mcp:srv:write"', 'kind = "no_denials"'))
    w.gate_open = anyio.Event()  # the read hangs until the test lets it go
    stop = anyio.Event()
    outcome: list[RunOutcome] = []

    async def run() -> None:
        outcome.append(await w.run(stop=stop))

    with anyio.fail_after(20):
        async with anyio.create_task_group() as group:
            group.start_soon(run)
            while not w.transport.calls:
                await anyio.lowlevel.checkpoint()
            stop.set()
    [first] = outcome
    assert first.status == "interrupted" and first.exit_code == 3
    suspended = list(w.store.read_session(first.session))[-1]
    assert suspended.kind == "session_suspended"
    assert suspended.body == {"reason": "interrupted", "in_flight": ["c1.0"]}
    assert w.verified(first.session)
    info = w.store.session(first.session)
    assert info is not None and info.status == "interrupted"

    # The read had an intent and no result; it is declared safe to re-send, so resume re-sends it.
    w.gate_open.set()
    second = await w.resume(first.session)
    assert second.status == "pass"
    assert len(w.transport.calls) == 2
    assert w.verified(first.session)


async def test_an_interrupted_call_that_is_not_safe_to_resend_is_in_doubt(tmp_path: Path) -> None:
    w = World(tmp_path, [calls((WRITE, {"path": "a"})), TurnResponse("wrote")])
    w.contract = contract_from(TEXT.replace('effect = "ask"', 'effect = "allow"'))
    w.gate_open = anyio.Event()
    stop = anyio.Event()
    outcome: list[RunOutcome] = []

    async def run() -> None:
        outcome.append(await w.run(stop=stop))

    with anyio.fail_after(20):
        async with anyio.create_task_group() as group:
            group.start_soon(run)
            while not w.transport.calls:
                await anyio.lowlevel.checkpoint()
            stop.set()
    w.gate_open.set()
    second = await w.resume(outcome[0].session)
    assert second.status == "suspended" and second.exit_code == 3
    assert len(w.transport.calls) == 1  # never re-sent
    kinds = kinds_of(w.store, outcome[0].session)
    assert "in_doubt" in kinds and kinds[-1] == "session_suspended"


async def test_resume_of_a_finished_session_returns_its_outcome(tmp_path: Path) -> None:
    w = World(tmp_path, [TurnResponse("nothing to do")])
    w.contract = contract_from(TEXT.replace('kind = "tool_succeeded"\ntool = "mcp:srv:write"', 'kind = "no_denials"'))
    first = await w.run()
    again = await w.resume(first.session)
    assert again.status == first.status == "pass" and again.head == first.head
    assert len(w.model.requests) == 1


async def test_a_stop_request_while_servers_connect_records_nothing_and_closes_them(tmp_path: Path) -> None:
    w = World(tmp_path)
    closed: list[bool] = []
    connecting = anyio.Event()

    @asynccontextmanager
    async def slow_connect(contract: Contract, **_: Any) -> AsyncGenerator[FakeTransport]:
        try:
            connecting.set()
            await anyio.sleep_forever()  # a server that takes its time to start
            yield w.transport
        finally:
            closed.append(True)

    stop = anyio.Event()
    outcome: list[RunOutcome] = []

    async def run() -> None:
        outcome.append(await w.run(stop=stop, connector=slow_connect))

    with anyio.fail_after(20):
        async with anyio.create_task_group() as group:
            group.start_soon(run)
            await connecting.wait()
            stop.set()
    [first] = outcome
    assert first.status == "interrupted" and first.exit_code == 3 and first.head is None
    assert closed == [True]
    assert w.store.session(first.session) is None


async def test_a_suspension_with_nothing_recorded_past_the_head_makes_no_verified_read_of_the_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A verified read proves the session from its first entry and keeps its payloads: at 3,000
    # calls the suspension's reload of nothing held 10 MB (docs/benchmarks.md, issue 16).
    from truss.ledger.reader import VerifiedStore

    reads: list[int] = []
    original = VerifiedStore.read_session

    def counted(self: VerifiedStore, session: str, *, from_seq: int = 0) -> Any:
        reads.append(from_seq)
        return original(self, session, from_seq=from_seq)

    monkeypatch.setattr(VerifiedStore, "read_session", counted)
    w = World(tmp_path)
    first = await w.run()
    assert first.status == "suspended" and first.waiting == ("c2.1",)
    assert reads == []
    monkeypatch.setattr(VerifiedStore, "read_session", original)
    approve_call(Runtime(w.store, key=w.key), first.session, "c2.1", approved=True)
    assert (await w.resume(first.session)).status == "pass"


PLANNED = """
[contract]
name = "approval-plan"
intent = "read, then write with approval"
[agent]
final = "wrote it"
[[agent.steps]]
tool = "mcp:srv:read"
arguments = { path = "a" }
[[agent.steps]]
tool = "mcp:srv:write"
arguments = { path = "c", text = "x", size = 2.0 }
[policy]
default = "allow"
[[policy.rules]]
tool = "mcp:srv:write"
effect = "ask"
reason = "writes need a person"
[[mcp.servers]]
name = "srv"
command = "unused"
allow_tools = ["read", "write"]
"""


async def test_a_resumed_plan_whose_step_holds_a_float_replays_and_sends_the_recorded_arguments(tmp_path: Path) -> None:
    # A replayed plan turn is checked by asking the plan again (the answer must hash to the recorded
    # response). Its answer then stands in for decoding the record only when it is plain JSON; a
    # float is not (RFC 8785 writes 2.0 as 2): that turn is decoded from the record, as before, and
    # the approved call carries the arguments as recorded.
    w = World(tmp_path)
    w.contract = contract_from(PLANNED)
    w.provider = scripted()  # type: ignore[method-assign]
    first = await w.run()
    assert first.status == "suspended" and first.waiting == ("c2.0",)
    approve_call(Runtime(w.store, key=w.key), first.session, "c2.0", approved=True)
    done = await w.resume(first.session)
    assert done.status == "pass", done
    [(_, read), (_, write)] = [(c.tool, dict(c.arguments)) for c in w.transport.calls]
    assert read == {"path": "a"}
    assert write == {"path": "c", "text": "x", "size": 2} and type(write["size"]) is int
