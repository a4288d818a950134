"""In-process checks of the durability paths through the gate and ``truss.durable`` (fast: no subprocess)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.gate.support import contract_from, fake_connector, new_store, read_runtime, scripted
from truss._errors import NotFoundError, ServerStartError, UsageError
from truss.durable import deliver_signal, replay_session, resolve_call
from truss.ledger.entry import Record
from truss.runtime import Runtime
from truss.session import run_contract
from truss.testing import FakeTransport, ManualClock, mounted_tool, text_result
from truss.tools import MountedTool, ToolResult

pytestmark = pytest.mark.anyio

CONTRACT = """
[contract]
name = "memo"
intent = "look twice"
[[agent.steps]]
tool = "mcp:kv:get"
arguments = { key = "a", token = "s3cret-token" }
[[agent.steps]]
tool = "mcp:kv:get"
arguments = { key = "a", token = "s3cret-token" }
[[mcp.servers]]
name = "kv"
command = "kv-server"
allow_tools = ["get"]
{secret}
[[mcp.servers.tools]]
name = "get"
memo = "1h"
"""


def _contract(secret: str) -> str:
    return CONTRACT.replace("{secret}", secret)


async def _run(tmp_path: Path, text: str, session: str = "s1") -> tuple[Any, FakeTransport]:
    async def handler(tool: MountedTool, arguments: Mapping[str, Any]) -> ToolResult:
        return text_result(f"value of {arguments['key']}")

    transport = FakeTransport(handler, tools=[mounted_tool("kv", "get")])
    store, key = new_store(tmp_path)
    contract = contract_from(text)
    await run_contract(
        Runtime(
            store=store,
            key=key,
            clock=ManualClock(),
            home=tmp_path,
            environ={},
            connector=fake_connector(transport),
            provider=scripted(),
        ),
        contract,
        session_id=session,
    )
    return store, transport


async def test_a_second_identical_call_within_the_memo_ttl_is_answered_from_the_ledger(tmp_path: Path) -> None:
    store, transport = await _run(tmp_path, _contract(secret=""))
    assert len(transport.calls) == 1
    results = [e for e in store.read_session("s1") if e.kind == "mcp_tool_call"]
    assert "replayed_from" not in results[0].body
    assert results[1].body["replayed_from"] == {"session": "s1", "seq": results[0].seq, "hash": results[0].hash}
    report = await replay_session(read_runtime(store), "s1")
    assert report.matches, report.reason


async def test_a_call_whose_secret_arguments_were_redacted_is_never_answered_from_the_memo(tmp_path: Path) -> None:
    store, transport = await _run(tmp_path, _contract(secret='secret_args = ["token"]'))
    assert len(transport.calls) == 2
    assert all("replayed_from" not in e.body for e in store.read_session("s1") if e.kind == "mcp_tool_call")


async def test_replay_reports_a_record_whose_model_turn_does_not_follow_from_the_steps_before_it(
    tmp_path: Path,
) -> None:
    store, _ = await _run(tmp_path, _contract(secret=""))
    # A deliberately divergent history: the same session re-recorded (validly signed) with the
    # second model turn claiming a request the first turn's results cannot have produced.
    copied: list[Record] = []
    for entry in store.read_session("s1"):
        body = dict(entry.body)
        if entry.kind == "model_turn" and body["turn"] == 2:
            body["replay_key"] = "sha256:" + "0" * 64
        blobs = {ref: data for ref in entry.refs() if (data := store.blob(ref)) is not None}
        copied.append(Record(entry.kind, body, blobs))
    store.append("forged", copied)
    report = await replay_session(read_runtime(store), "forged")
    assert not report.matches and report.replayed is None
    assert report.reason is not None and "model turn 2" in report.reason


async def test_resolve_and_signal_refuse_unknown_sessions_calls_and_signals_and_write_nothing(tmp_path: Path) -> None:
    store, _ = await _run(tmp_path, _contract(secret=""))
    before = store.session("s1").entries
    with pytest.raises(NotFoundError):
        resolve_call(read_runtime(store), "nope", "c1.0", not_sent=True)
    with pytest.raises(NotFoundError):
        resolve_call(read_runtime(store), "s1", "c1.0", not_sent=True)
    with pytest.raises(UsageError):
        resolve_call(read_runtime(store), "s1", "c1.0", not_sent=True, failed="both")
    with pytest.raises(NotFoundError):
        deliver_signal(read_runtime(store), "s1", "job-1", {"status": "done"})
    assert store.session("s1").entries == before


async def test_replay_of_a_session_whose_server_never_started_reaches_its_error_verdict(tmp_path: Path) -> None:
    @asynccontextmanager
    async def broken(contract: Any, **_: Any) -> AsyncGenerator[None]:
        raise ServerStartError("MCP server 'kv' could not start", server="kv", cause="spawn")
        yield  # pragma: no cover - never reached

    store, key = new_store(tmp_path)
    outcome = await run_contract(
        Runtime(
            store=store, key=key, clock=ManualClock(), home=tmp_path, environ={}, connector=broken, provider=scripted()
        ),
        contract_from(_contract("")),
        session_id="s1",
    )
    assert outcome.status == "error"
    report = await replay_session(read_runtime(store), "s1")
    assert report.matches and report.replayed is not None and report.replayed["status"] == "error"


def _plan(calls: int, durability: str) -> str:
    steps = "".join(f'[[agent.steps]]\ntool = "mcp:kv:get"\narguments = {{ key = "k{i}" }}\n' for i in range(calls))
    return (
        f'[contract]\nname = "flushes"\nintent = "count the flushes"\n[ledger]\ndurability = "{durability}"\n'
        f'{steps}[[mcp.servers]]\nname = "kv"\ncommand = "kv-server"\nallow_tools = ["get"]\n'
    )


async def _flushes(tmp_path: Path, calls: int, durability: str) -> int:
    async def handler(tool: MountedTool, arguments: Mapping[str, Any]) -> ToolResult:
        return text_result(f"value of {arguments['key']}")

    transport = FakeTransport(handler, tools=[mounted_tool("kv", "get")])
    directory = tmp_path / f"{durability}-{calls}"
    directory.mkdir()
    store, key = new_store(directory)
    runtime = Runtime(store=store, key=key, clock=ManualClock(), home=directory, environ={},
                      connector=fake_connector(transport), provider=scripted())  # fmt: skip
    try:
        outcome = await run_contract(runtime, contract_from(_plan(calls, durability)), session_id="s1")
        assert outcome.status == "pass", outcome
        assert [e.kind for e in store.read_session("s1")].count("model_turn") == calls + 1
        return store.stats()["flushes"]
    finally:
        store.close()


@pytest.mark.parametrize(("durability", "per_call"), [("power", 2), ("process", 1)])
async def test_an_audited_call_flushes_twice_in_power_mode_and_once_in_process_mode(
    tmp_path: Path, durability: str, per_call: int
) -> None:
    # The model turn that proposes a call shares the flush of that call's intent (power) or result (process).
    few, many = await _flushes(tmp_path, 2, durability), await _flushes(tmp_path, 6, durability)
    assert (many - few) == 4 * per_call, (few, many)
