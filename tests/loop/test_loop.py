"""The agent loop through ``run_contract``: turns, parallel calls, stop conditions, verdicts, the ledger."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, Callable, Mapping
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from tests.gate.support import ListProvider, calls, contract_from, fake_connector, kinds_of, new_store, scripted
from truss._errors import ProviderError, ServerStartError
from truss.contract import Contract
from truss.events import progress_subscriber
from truss.ledger.envelope import open_verdict
from truss.ledger.keys import TrustedKeys
from truss.ledger.verification import verify_entries
from truss.providers.base import Provider, ToolCall, TurnResponse, Usage
from truss.runtime import Runtime
from truss.session import RunOutcome, run_contract
from truss.testing import FakeTransport, ManualClock, mounted_tool, text_result
from truss.tools import MountedTool, ToolResult

pytestmark = pytest.mark.anyio

BASE = """
[contract]
name = "loop-test"
intent = "exercise the loop"
[agent]
max_parallel_calls = {parallel}
final = "all done"
{steps}
[budget]
max_tool_calls = 20
max_model_turns = {turns}
{budget}
[policy]
default = "allow"
[[policy.rules]]
tool = "mcp:srv:write"
effect = "deny"
reason = "no writes in this test"
[[mcp.servers]]
name = "srv"
command = "unused"
allow_tools = ["echo", "write", "add"]
{checks}
"""

ECHO = "mcp__srv__echo"
WRITE = "mcp__srv__write"
ADD = "mcp__srv__add"


def contract(*, steps: str = "", checks: str = "", budget: str = "", turns: int = 10, parallel: int = 4) -> Contract:
    text = BASE.format(steps=steps, checks=checks, budget=budget, turns=turns, parallel=parallel)
    return contract_from(text)


async def echo(tool: MountedTool, arguments: Mapping[str, Any]) -> ToolResult:
    if tool.tool == "add":
        total = arguments["a"] + arguments["b"]
        return text_result(str(total), structured={"sum": total})
    return text_result(str(arguments.get("text", "")), structured=dict(arguments))


def transport(handler: Any = echo) -> FakeTransport:
    schema = {"type": "object", "properties": {"text": {"type": "string"}}}
    add_schema = {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}
    return FakeTransport(
        handler,
        tools=[
            mounted_tool("srv", "echo", input_schema=schema),
            mounted_tool("srv", "write", input_schema=schema),
            mounted_tool("srv", "add", input_schema=add_schema),
        ],
    )


def _factory(provider: Any) -> Callable[[Contract], Provider]:
    if isinstance(provider, ListProvider):
        fixed: Provider = provider
        return lambda _contract: fixed
    made: Callable[[Contract], Provider] = provider
    return made


class Harness:
    def __init__(self, tmp_path: Path) -> None:
        self.clock = ManualClock()
        self.store, self.key = new_store(tmp_path, self.clock)
        self.home = tmp_path / "home"
        self.events: list[Any] = []

    async def run(self, c: Contract, fake: FakeTransport, provider: Any, **kw: Any) -> RunOutcome:
        with anyio.fail_after(20):
            return await run_contract(
                Runtime(
                    store=self.store,
                    key=self.key,
                    clock=self.clock,
                    home=self.home,
                    environ=kw.pop("environ", {}),
                    connector=kw.pop("connector", fake_connector(fake)),
                    provider=_factory(provider),
                    events=(progress_subscriber(self.events.append),),
                ),
                c,
                **kw,
            )

    def verify(self, outcome: RunOutcome) -> None:
        trusted = TrustedKeys([self.key.verifier])
        report = verify_entries(self.store.read_session(outcome.session), trusted, blobs=self.store.blob)
        assert report.ok, report
        envelope = self.store.envelope(outcome.session)
        assert envelope is not None
        statement = open_verdict(envelope, trusted, session=outcome.session, head=outcome.head)
        assert statement.status == outcome.status


async def test_three_tools_in_one_turn_one_denied_results_go_back_in_order(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    model = ListProvider(
        [calls((ECHO, {"text": "a"}), (WRITE, {"text": "b"}), (ADD, {"a": 1, "b": 2})), TurnResponse("finished")]
    )
    checks = '[[done.checks]]\nkind = "final_matches"\nregex = "^finished$"'
    outcome = await h.run(contract(checks=checks), transport(), model)
    assert outcome.status == "pass" and outcome.exit_code == 0
    second = model.requests[1].messages
    tool_messages = [m for m in second if m["role"] == "tool"]
    assert [m["call_id"] for m in tool_messages] == ["m0", "m1", "m2"]
    assert [m["is_error"] for m in tool_messages] == [False, True, False]
    assert "no writes in this test" in tool_messages[1]["text"]
    assert tool_messages[2]["structured"] == {"sum": 3}
    assert all(m["note"].startswith("[budget left: tool_calls=") for m in tool_messages)
    assert all("budget" not in m["text"] for m in tool_messages)
    kinds = kinds_of(h.store, outcome.session)
    assert kinds[0] == "session_started" and kinds[-2:] == ["verdict", "session_ended"]
    assert kinds.count("mcp_tool_call") == 2 and kinds.count("mcp_tool_denied") == 1
    h.verify(outcome)


async def test_calls_of_one_turn_run_concurrently_up_to_max_parallel_calls(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    running = 0
    peak = 0
    both = anyio.Event()

    async def handler(tool: MountedTool, arguments: Mapping[str, Any]) -> ToolResult:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        if running == 2:
            both.set()
        await both.wait()
        for _ in range(3):
            await anyio.lowlevel.checkpoint()  # yield so a third call could start if the limiter let it
        running -= 1
        return await echo(tool, arguments)

    model = ListProvider([calls(*[(ECHO, {"text": str(i)}) for i in range(6)])])
    outcome = await h.run(contract(parallel=2), transport(handler), model)
    assert outcome.status == "pass"
    assert peak == 2


async def test_malformed_and_unknown_calls_go_back_to_the_model_and_the_run_goes_on(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    bad_json = ToolCall(id="x0", name=ECHO, arguments=None, raw_arguments='{"text": ')
    unknown = ToolCall(id="x1", name="mcp__srv__rm_rf", arguments={})
    wrong_type = ToolCall(id="x2", name=ADD, arguments={"a": "one", "b": 2})
    model = ListProvider([TurnResponse("", [bad_json, unknown, wrong_type], "tool_use"), TurnResponse("ok")])
    fake = transport()
    checks = '[[done.checks]]\nkind = "no_denials"'
    outcome = await h.run(contract(checks=checks), fake, model)
    assert fake.calls == []
    replies = [m for m in model.requests[1].messages if m["role"] == "tool"]
    assert all(m["is_error"] for m in replies)
    assert "bad_arguments" in replies[0]["text"] and "not_mounted" in replies[1]["text"]
    assert outcome.status == "fail" and outcome.exit_code == 1
    assert outcome.verdict is not None and outcome.verdict["checks"][0]["ok"] is False


async def test_scripted_plan_with_step_references_passes_its_checks(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    steps = """
[[agent.steps]]
tool = "mcp:srv:add"
arguments = { a = 2, b = 3 }
[[agent.steps]]
tool = "mcp:srv:echo"
arguments = { text = "sum is ${steps.0.result/sum}" }
"""
    checks = """
[[done.checks]]
kind = "result_matches"
tool = "mcp:srv:echo"
pointer = ""
equals = "sum is 5"
[[done.checks]]
kind = "result_matches"
tool = "mcp:srv:add"
pointer = "/sum"
equals = 5
[[done.checks]]
kind = "final_matches"
regex = "done"
"""
    outcome = await h.run(contract(steps=steps, checks=checks), transport(), scripted())
    assert outcome.status == "pass", outcome.verdict
    h.verify(outcome)


async def test_a_failing_check_gives_verdict_fail_naming_the_check(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    steps = '[[agent.steps]]\ntool = "mcp:srv:echo"\narguments = { text = "hello" }'
    checks = '[[done.checks]]\nkind = "result_matches"\ntool = "mcp:srv:echo"\npointer = "/text"\nregex = "^bye$"'
    outcome = await h.run(contract(steps=steps, checks=checks), transport(), scripted())
    assert outcome.status == "fail" and outcome.exit_code == 1
    assert outcome.reason is not None and "check 0 (result_matches)" in outcome.reason
    h.verify(outcome)


async def test_running_out_of_model_turns_ends_the_run_with_verdict_error(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    forever = ListProvider([calls((ECHO, {"text": str(i)})) for i in range(10)])
    outcome = await h.run(contract(turns=2), transport(), forever)
    assert outcome.status == "error" and outcome.exit_code == 4
    assert outcome.verdict is not None and outcome.verdict["error"]["limit"] == "max_model_turns"
    assert len(forever.requests) == 2
    h.verify(outcome)


async def test_token_budget_exhausted_mid_run_is_an_error_and_its_calls_are_not_made(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    spend = TurnResponse("", [ToolCall("t0", ECHO, {"text": "x"})], "tool_use", Usage(300, 300))
    model = ListProvider([calls((ECHO, {"text": "a"})), spend])
    fake = transport()
    outcome = await h.run(contract(budget="max_tokens = 500"), fake, model)
    assert outcome.status == "error"
    assert outcome.verdict is not None and outcome.verdict["error"]["limit"] == "max_tokens"
    assert len(fake.calls) == 1


async def test_a_deadline_that_passes_during_a_call_ends_the_run_with_verdict_error(tmp_path: Path) -> None:
    h = Harness(tmp_path)

    async def slow(tool: MountedTool, arguments: Mapping[str, Any]) -> ToolResult:
        h.clock.advance(5)  # the call takes the rest of the run's time
        return await echo(tool, arguments)

    model = ListProvider([calls((ECHO, {"text": "a"})), calls((ECHO, {"text": "b"}))])
    fake = transport(slow)
    outcome = await h.run(contract(budget='deadline = "3s"'), fake, model)
    assert outcome.status == "error" and outcome.exit_code == 4
    assert outcome.verdict is not None and outcome.verdict["error"]["cause"] == "deadline"
    assert len(fake.calls) == 1
    h.verify(outcome)


async def test_a_provider_that_gives_up_ends_the_run_with_verdict_error(tmp_path: Path) -> None:
    h = Harness(tmp_path)

    class Failing(ListProvider):
        async def next_turn(self, request: Any) -> TurnResponse:
            raise ProviderError("openai: 5 attempts, last status 500", provider="openai", status=500, attempts=5)

    outcome = await h.run(contract(), transport(), Failing([]))
    assert outcome.status == "error"
    assert outcome.verdict is not None and outcome.verdict["error"]["cause"] == "provider"
    assert "500" in (outcome.reason or "")


async def test_a_server_that_cannot_start_still_leaves_a_recorded_session_with_verdict_error(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def refusing(contract: Contract, **_: Any) -> AsyncGenerator[FakeTransport]:
        raise ServerStartError("server 'srv' exited at start", server="srv", cause="exited")
        yield transport()  # never reached: the server "fails" to start

    outcome = await h.run(contract(), transport(), ListProvider([]), connector=refusing)
    assert outcome.status == "error"
    assert kinds_of(h.store, outcome.session) == ["session_started", "verdict", "session_ended"]
    started = next(iter(h.store.read_session(outcome.session)))
    assert started.body["start_failure"]["error"] == "ServerStartError"
    h.verify(outcome)


async def test_a_repeated_session_id_returns_that_session_and_runs_nothing(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    fake = transport()
    steps = '[[agent.steps]]\ntool = "mcp:srv:echo"\narguments = { text = "once" }'
    first = await h.run(contract(steps=steps), fake, scripted(), session_id="job-1")
    second = await h.run(contract(steps=steps), fake, scripted(), session_id="job-1")
    assert first.session == second.session == "job-1"
    assert second.status == first.status == "pass" and second.head == first.head
    assert len(fake.calls) == 1


async def test_session_started_records_the_effective_contract_pins_and_principal(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    c = contract()
    outcome = await h.run(c, transport(), ListProvider([]), principal={"tenant": "t1", "user": "u1"})
    started = next(iter(h.store.read_session(outcome.session)))
    assert started.body["contract_hash"] == c.hash
    assert started.body["effective"] == json.loads(json.dumps(c.to_json()))
    assert set(started.body["pins"]) == {"mcp:srv:echo", "mcp:srv:write", "mcp:srv:add"}
    assert started.body["principal"] == {"tenant": "t1", "user": "u1"}
    info = h.store.session(outcome.session)
    assert info is not None and info.principal == {"tenant": "t1", "user": "u1"}


async def test_progress_reports_each_call_with_budget_left_and_no_arguments(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    model = ListProvider([calls((ECHO, {"text": "private words"}))])
    await h.run(contract(), transport(), model)
    call_events = [e for e in h.events if e.kind == "call"]
    assert len(call_events) == 1
    event = call_events[0]
    assert event.tool == "mcp:srv:echo" and event.outcome == "ok"
    assert event.budget_left["tool_calls"] == 19
    assert "private words" not in repr(h.events)


async def test_a_made_up_tool_name_is_recorded_bounded(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    long_name = "x" * 100_000
    model = ListProvider([TurnResponse("", [ToolCall("z0", long_name, {})], "tool_use"), TurnResponse("ok")])
    outcome = await h.run(contract(), transport(), model)
    [denied] = [e for e in h.store.read_session(outcome.session) if e.kind == "mcp_tool_denied"]
    assert denied.body["code"] == "not_mounted"
    assert len(denied.raw) < 2_000


async def test_an_unmounted_tool_of_a_contract_server_is_denied_under_its_namespaced_name(tmp_path: Path) -> None:
    h = Harness(tmp_path)
    calls_ = [ToolCall("u0", "mcp__srv__rm_rf", {}), ToolCall("u1", "mcp__other__rm_rf", {})]
    model = ListProvider([TurnResponse("", calls_, "tool_use"), TurnResponse("ok")])
    outcome = await h.run(contract(), transport(), model)
    denied = [e.body for e in h.store.read_session(outcome.session) if e.kind == "mcp_tool_denied"]
    # srv is the contract's server: the record uses the name the rest of it uses; "other" is not one
    assert [(d["tool"], d["code"]) for d in denied] == [
        ("mcp:srv:rm_rf", "not_mounted"),
        ("mcp__other__rm_rf", "not_mounted"),
    ]


async def test_a_check_that_fails_after_a_call_was_refused_for_budget_is_an_error_naming_the_limit(
    tmp_path: Path,
) -> None:
    h = Harness(tmp_path)
    steps = """
[[agent.steps]]
tool = "mcp:srv:echo"
arguments = { text = "one" }
[[agent.steps]]
tool = "mcp:srv:add"
arguments = { a = 1, b = 1 }
"""
    checks = '[[done.checks]]\nkind = "tool_succeeded"\ntool = "mcp:srv:add"'
    c = contract(steps=steps, checks=checks, budget="").model_copy(
        update={"budget": contract().budget.model_copy(update={"max_tool_calls": 1})}
    )
    outcome = await h.run(c, transport(), scripted())
    assert outcome.status == "error" and outcome.exit_code == 4
    assert outcome.verdict is not None
    assert outcome.verdict["error"] == {
        "cause": "budget",
        "detail": outcome.verdict["error"]["detail"],
        "limit": "max_tool_calls",
    }
    assert outcome.verdict["checks"][0]["ok"] is False
