"""The gate, driven directly: resolve, policy, budget, intent, call, result, and what each records."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import anyio
import pytest

from tests.gate.support import contract_from, files_containing, make_gate, new_store, step_kinds, steps
from truss._errors import ToolCallError
from truss.gate import REDACTED, CallRequest, check_arguments
from truss.ledger.canonical import canonical, sha256_ref
from truss.ledger.stores import LedgerStore
from truss.testing import FakeTransport, ManualClock, mounted_tool, text_result
from truss.tools import MountedTool, ToolResult

pytestmark = pytest.mark.anyio

ECHO_SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}, "n": {"type": "integer"}}}


def contract_text(extra: str = "", server: str = "", budget: str = "") -> str:
    return f"""
[contract]
name = "gate-test"
intent = "test the gate"
[budget]
max_tool_calls = 100
{budget}
{extra}
[[mcp.servers]]
name = "srv"
command = "unused"
allow_tools = ["echo", "write"]
{server}
"""


async def echo(tool: MountedTool, arguments: Mapping[str, Any]) -> ToolResult:
    return text_result(str(arguments.get("text", "")), structured={"echo": dict(arguments)})


def transport(handler: Any = echo) -> FakeTransport:
    return FakeTransport(
        handler,
        tools=[
            mounted_tool("srv", "echo", input_schema=ECHO_SCHEMA, annotations={"readOnlyHint": True}),
            mounted_tool("srv", "write", input_schema={"type": "object"}),
        ],
    )


def req(call: str, tool: str = "mcp:srv:echo", arguments: Mapping[str, Any] | None = None, **kw: Any) -> CallRequest:
    return CallRequest(call=call, tool=tool, arguments={"text": "hi"} if arguments is None else arguments, turn=1, **kw)


async def test_allowed_call_records_intent_before_the_call_and_result_after(tmp_path: Path) -> None:
    store, _ = new_store(tmp_path)
    seen_kinds_at_call: list[list[str]] = []

    async def handler(tool: MountedTool, arguments: Mapping[str, Any]) -> ToolResult:
        seen_kinds_at_call.append(step_kinds(store))
        return await echo(tool, arguments)

    gate = make_gate(contract_from(contract_text()), store, transport(handler))
    outcome = await gate.call(req("c1.0"))
    assert outcome.outcome == "ok" and outcome.result.text == "hi"
    assert seen_kinds_at_call == [["mcp_tool_intent"]]
    intent, result = steps(store)
    assert result.kind == "mcp_tool_call"
    assert result.body["intent"] == intent.seq
    assert result.body["args"] == intent.body["args"] == sha256_ref(canonical({"text": "hi"}))
    assert result.body["is_error"] is False
    assert result.body["pin"] == gate.tools["mcp:srv:echo"].pin
    stored = store.blob(result.body["result"])
    assert stored is not None and json.loads(stored)["content"][0]["text"] == "hi"


async def test_unmounted_tool_is_denied_and_never_sent(tmp_path: Path) -> None:
    store, _ = new_store(tmp_path)
    fake = transport()
    gate = make_gate(contract_from(contract_text()), store, fake)
    outcome = await gate.call(req("c1.0", tool="mcp:srv:delete_everything"))
    assert outcome.outcome == "denied" and outcome.code == "not_mounted"
    assert outcome.result.is_error and "not mounted" in outcome.result.text
    assert fake.calls == []
    [denied] = steps(store)
    assert denied.kind == "mcp_tool_denied" and denied.body["code"] == "not_mounted"


async def test_arguments_that_did_not_parse_go_back_to_the_model_as_an_error(tmp_path: Path) -> None:
    store, _ = new_store(tmp_path)
    fake = transport()
    gate = make_gate(contract_from(contract_text()), store, fake)
    outcome = await gate.call(CallRequest("c1.0", "mcp:srv:echo", None, 1, raw_arguments='{"text": "hi'))
    assert outcome.outcome == "denied" and outcome.code == "bad_arguments"
    assert fake.calls == []


async def test_arguments_of_the_wrong_type_are_refused_before_the_server(tmp_path: Path) -> None:
    store, _ = new_store(tmp_path)
    fake = transport()
    gate = make_gate(contract_from(contract_text()), store, fake)
    outcome = await gate.call(req("c1.0", arguments={"text": "x", "n": "three"}))
    assert outcome.outcome == "denied" and outcome.code == "bad_arguments"
    assert "'n'" in outcome.result.text
    assert fake.calls == []


async def test_a_server_schema_whose_required_list_holds_arrays_or_objects_does_not_break_the_gate(
    tmp_path: Path,
) -> None:
    # Regression: the input schema comes from the server; 'required: [["text"], {}]' made the gate
    # raise TypeError (unhashable) on every call of the tool, with nothing recorded.
    store, _ = new_store(tmp_path)
    schema = {"type": "object", "properties": {"text": {"type": "string"}}, "required": [["text"], {"a": 1}, "n"]}
    fake = FakeTransport(echo, tools=[mounted_tool("srv", "echo", input_schema=schema)])
    gate = make_gate(contract_from(contract_text()), store, fake)
    outcome = await gate.call(req("c1.0"))
    assert outcome.outcome == "denied" and outcome.code == "bad_arguments"
    assert step_kinds(store) == ["mcp_tool_denied"] and fake.calls == []
    assert (await gate.call(req("c2.0", arguments={"text": "hi", "n": 1}))).outcome == "ok"


def test_argument_check_reports_missing_required_and_accepts_union_types() -> None:
    schema = {"type": "object", "properties": {"a": {"type": ["string", "null"]}}, "required": ["a", "b"]}
    assert check_arguments(schema, {"a": None}) == "missing required argument(s): b"
    assert check_arguments(schema, {"a": None, "b": 1}) is None
    assert check_arguments(schema, {"a": 3, "b": 1}) is not None


async def test_policy_denial_is_recorded_with_its_rule_and_never_charged(tmp_path: Path) -> None:
    rules = """
[[policy.rules]]
tool = "mcp:srv:write"
effect = "deny"
reason = "no writes"
"""
    store, _ = new_store(tmp_path)
    fake = transport()
    gate = make_gate(contract_from(contract_text(rules)), store, fake)
    outcome = await gate.call(req("c1.0", tool="mcp:srv:write", arguments={}))
    assert outcome.outcome == "denied" and outcome.code == "rule"
    [denied] = steps(store)
    assert denied.body["rule"] == 0 and denied.body["reason"] == "no writes"
    assert gate.budget.tool_calls == 0
    assert fake.calls == []


@pytest.mark.parametrize(
    ("budget", "server", "limit", "allowed"),
    [
        ("", "budget_calls = 3", "server_budget_calls", 3),
        ("", '[[mcp.servers.tools]]\nname = "echo"\nbudget_calls = 2', "tool_budget_calls", 2),
    ],
)
async def test_the_nth_call_of_a_budget_runs_and_the_next_is_denied_and_recorded(
    tmp_path: Path, budget: str, server: str, limit: str, allowed: int
) -> None:
    store, _ = new_store(tmp_path)
    fake = transport()
    gate = make_gate(contract_from(contract_text(server=server, budget=budget)), store, fake)
    outcomes = [await gate.call(req(f"c{i}.0")) for i in range(allowed + 1)]
    assert [o.outcome for o in outcomes] == ["ok"] * allowed + ["denied"]
    assert outcomes[-1].limit == limit and outcomes[-1].code == "budget"
    assert len(fake.calls) == allowed
    denied = [e for e in steps(store) if e.kind == "mcp_tool_denied"]
    assert len(denied) == 1 and denied[0].body["limit"] == limit


async def test_run_wide_max_tool_calls_boundary(tmp_path: Path) -> None:
    text = contract_text().replace("max_tool_calls = 100", "max_tool_calls = 2")
    store, _ = new_store(tmp_path)
    gate = make_gate(contract_from(text), store, transport())
    outcomes = [await gate.call(req(f"c{i}.0")) for i in range(3)]
    assert [o.outcome for o in outcomes] == ["ok", "ok", "denied"]
    assert outcomes[2].limit == "max_tool_calls"


async def test_twenty_concurrent_calls_against_a_budget_of_ten_execute_exactly_ten(tmp_path: Path) -> None:
    text = contract_text().replace("max_tool_calls = 100", "max_tool_calls = 10")
    store, _ = new_store(tmp_path)
    release = anyio.Event()
    started = 0

    async def handler(tool: MountedTool, arguments: Mapping[str, Any]) -> ToolResult:
        nonlocal started
        started += 1
        if started == 10:
            release.set()
        await release.wait()  # all ten are in flight at once before any finishes
        return await echo(tool, arguments)

    fake = transport(handler)
    gate = make_gate(contract_from(text), store, fake)
    results: list[str] = []

    async def one(i: int) -> None:
        results.append((await gate.call(req(f"c1.{i}"))).outcome)

    with anyio.fail_after(10):
        async with anyio.create_task_group() as group:
            for i in range(20):
                group.start_soon(one, i)
    assert sorted(results) == ["denied"] * 10 + ["ok"] * 10
    assert len(fake.calls) == 10
    kinds = step_kinds(store)
    assert kinds.count("mcp_tool_call") == 10 and kinds.count("mcp_tool_denied") == 10
    assert kinds.count("mcp_tool_intent") == 10


async def test_a_failure_below_the_tool_is_recorded_with_its_cause(tmp_path: Path) -> None:
    async def broken(tool: MountedTool, arguments: Mapping[str, Any]) -> ToolResult:
        raise ToolCallError("connection closed", server="srv", tool="echo", cause="connection_closed", retryable=True)

    store, _ = new_store(tmp_path)
    gate = make_gate(contract_from(contract_text()), store, transport(broken))
    outcome = await gate.call(req("c1.0"))
    assert outcome.outcome == "failed" and outcome.code == "connection_closed"
    assert outcome.result.is_error
    call = steps(store)[-1]
    assert call.kind == "mcp_tool_call"
    assert call.body["failure"] == {"cause": "connection_closed", "retryable": True}
    assert call.body["is_error"] is True


async def test_result_over_max_result_bytes_is_an_error_result(tmp_path: Path) -> None:
    async def big(tool: MountedTool, arguments: Mapping[str, Any]) -> ToolResult:
        return text_result("x" * 5000)

    text = contract_text(budget="max_result_bytes = 1000")
    store, _ = new_store(tmp_path)
    fake = FakeTransport(big, max_result_bytes=10_000_000, tools=transport().tools.values())
    gate = make_gate(contract_from(text), store, fake)
    outcome = await gate.call(req("c1.0"))
    assert outcome.outcome == "failed" and outcome.code == "result_too_large"
    assert steps(store)[-1].body["failure"]["cause"] == "result_too_large"


async def test_a_result_the_transport_refused_as_too_large_is_recorded_in_the_same_form(tmp_path: Path) -> None:
    # The real MCP tier refuses an over-size result itself (an isError result with extra.refused);
    # the record must not depend on which side measured it: one form, failure.cause = result_too_large.
    async def big(tool: MountedTool, arguments: Mapping[str, Any]) -> ToolResult:
        return text_result("x" * 5000)

    store, _ = new_store(tmp_path)
    fake = FakeTransport(big, max_result_bytes=1000, tools=transport().tools.values())
    gate = make_gate(contract_from(contract_text()), store, fake)  # the contract's limit is the default 1 MiB
    outcome = await gate.call(req("c1.0"))
    assert (outcome.outcome, outcome.code, outcome.result.is_error) == ("failed", "result_too_large", True)
    [result] = [e for e in steps(store) if e.kind == "mcp_tool_call"]
    assert result.body["failure"] == {"cause": "result_too_large", "retryable": False}
    assert result.body["is_error"] is True


async def test_secret_args_are_redacted_before_hashing_and_scrubbed_from_results(tmp_path: Path) -> None:
    canary = "canary-7f3a9c1e-secret-value"
    store, _ = new_store(tmp_path)
    fake = transport()  # echo repeats the secret back in its result
    gate = make_gate(contract_from(contract_text(server='secret_args = ["text"]')), store, fake)
    outcome = await gate.call(req("c1.0", arguments={"text": canary}))
    assert fake.calls[0].arguments["text"] == canary  # the raw value reached the server, in memory
    assert outcome.outcome == "ok"
    intent, call = steps(store)
    assert intent.body["args"] == sha256_ref(canonical({"text": REDACTED}))
    result = store.blob(call.body["result"])
    assert result is not None and canary.encode() not in result
    store.close()
    assert files_containing(tmp_path, canary.encode()) == []


async def test_secret_env_values_are_scrubbed_from_stored_results(tmp_path: Path) -> None:
    canary = "tok-93be1a55e0d4"
    store, _ = new_store(tmp_path)
    gate = make_gate(
        contract_from(contract_text(server='secret_env = ["API_TOKEN"]')),
        store,
        transport(),
        environ={"API_TOKEN": canary},
    )
    await gate.call(req("c1.0", arguments={"text": f"the token is {canary}"}))
    store.close()
    assert files_containing(tmp_path, canary.encode()) == []


async def test_ask_records_a_request_and_does_not_call(tmp_path: Path) -> None:
    rules = """
[[policy.rules]]
tool = "mcp:srv:write"
effect = "ask"
reason = "writes need a person"
"""
    store, _ = new_store(tmp_path)
    fake = transport()
    gate = make_gate(contract_from(contract_text(rules)), store, fake)
    outcome = await gate.call(req("c1.0", tool="mcp:srv:write", arguments={"path": "a"}))
    assert outcome.outcome == "suspended" and outcome.code == "approval"
    assert fake.calls == []
    [asked] = steps(store)
    assert asked.kind == "approval_requested" and asked.body["reason"] == "writes need a person"


class DurabilitySpy:
    """A store wrapper that records the durability each append asked for."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.durable: list[tuple[str, bool]] = []

    def append(self, session: str, records: Any, *, durable: bool = True, expect_seq: int | None = None) -> Any:
        self.durable += [(r.kind, durable) for r in records]
        return self.store.append(session, records, durable=durable, expect_seq=expect_seq)

    def blob(self, ref: str) -> bytes | None:
        return self.store.blob(ref)


@pytest.mark.parametrize(("mode", "intent_durable"), [("power", True), ("process", False)])
async def test_durability_mode_decides_whether_intents_are_fsynced_and_results_always_are(
    tmp_path: Path, mode: str, intent_durable: bool
) -> None:
    store, _ = new_store(tmp_path)
    spy = DurabilitySpy(store)
    gate = make_gate(contract_from(contract_text(f'[ledger]\ndurability = "{mode}"')), store, transport())
    gate.journal.store = cast(LedgerStore, spy)  # a wrapper with the methods this test reaches
    await gate.call(req("c1.0"))
    assert spy.durable == [("mcp_tool_intent", intent_durable), ("mcp_tool_call", True)]


async def test_call_timeout_is_the_smallest_setting(tmp_path: Path) -> None:
    store, _ = new_store(tmp_path)
    fake = transport()
    text = contract_text(server='call_timeout = "7s"', budget='call_timeout = "30s"')
    gate = make_gate(contract_from(text), store, fake, clock=ManualClock())
    await gate.call(req("c1.0"))
    assert fake.calls[0].timeout_s == 7.0


async def test_a_wall_clock_set_back_gives_the_run_no_more_time_before_its_deadline(tmp_path: Path) -> None:
    # Regression: the deadline was measured on the wall clock, so an operator or NTP setting it
    # back an hour after the deadline had passed let calls run for that hour more.
    store, _ = new_store(tmp_path)
    clock = ManualClock()
    fake = transport()
    gate = make_gate(contract_from(contract_text(budget='deadline = "10s"')), store, fake, clock=clock)
    clock.advance(11)
    clock.set_wall_ms(clock.now_ms() - 3_600_000)
    outcome = await gate.call(req("c1.0"))
    assert outcome.outcome == "denied" and outcome.limit == "deadline"
    assert fake.calls == [] and gate.remaining()["seconds"] == 0


async def test_a_wall_clock_set_ahead_takes_no_time_from_the_run(tmp_path: Path) -> None:
    store, _ = new_store(tmp_path)
    clock = ManualClock()
    fake = transport()
    gate = make_gate(contract_from(contract_text(budget='deadline = "10s"')), store, fake, clock=clock)
    clock.advance(4)
    clock.set_wall_ms(clock.now_ms() + 3_600_000)
    outcome = await gate.call(req("c1.0"))
    assert outcome.outcome == "ok" and fake.calls[0].timeout_s == 6.0
    assert gate.remaining()["seconds"] == 6


async def test_what_is_left_follows_each_charge_and_the_clock_and_each_caller_gets_its_own_copy(tmp_path: Path) -> None:
    text = contract_text(server='budget_calls = 5\n[[mcp.servers.tools]]\nname = "echo"\nbudget_calls = 3',
                         budget='deadline = "10m"')  # fmt: skip
    store, _ = new_store(tmp_path)
    clock = ManualClock()
    gate = make_gate(contract_from(text), store, transport(), clock=clock)
    first, again = gate.remaining(), gate.remaining()
    assert first == again == {"tool_calls": 100, "model_turns": first["model_turns"], "seconds": 600,
                              "servers": {"srv": 5}, "tools": {"mcp:srv:echo": 3}}  # fmt: skip
    first["tool_calls"] = 0
    cast(dict[str, int], first["servers"])["srv"] = 0  # a caller's copy, nested maps too
    assert gate.remaining()["tool_calls"] == 100 and gate.remaining()["servers"] == {"srv": 5}
    await gate.call(req("c1.0"))
    assert gate.remaining()["tool_calls"] == 99 and gate.remaining()["tools"] == {"mcp:srv:echo": 2}
    clock.advance(61)
    assert gate.remaining()["seconds"] == 539
