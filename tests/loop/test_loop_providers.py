"""The loop with real model providers speaking their wire formats to a loopback HTTP server.

A model calls three tools in one turn (one denied by policy) and then answers; a 500 storm that
exhausts the retries ends the run with verdict error. The loopback server and recorded wire
answers are the provider tests' (``tests/providers/_support.py``); the tools are fakes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.gate.support import contract_from, fake_connector, files_containing, kinds_of, new_store
from tests.providers._support import LoopbackServer, RecordingSleep, Reply, wire
from truss.contract import Contract
from truss.ledger.keys import TrustedKeys
from truss.ledger.verification import verify_entries
from truss.providers import make_provider
from truss.providers.base import Provider
from truss.runtime import Runtime
from truss.session import RunOutcome, run_contract
from truss.testing import FakeTransport, ManualClock, mounted_tool, text_result
from truss.tools import MountedTool, ToolResult

pytestmark = pytest.mark.anyio

KEY = "sk-proj-loop-test-0123456789abcdef"


@pytest.fixture
def loopback() -> Iterator[LoopbackServer]:
    server = LoopbackServer().start()
    try:
        yield server
    finally:
        server.close()


def contract(url: str, provider: str) -> Contract:
    base = url + "/v1" if provider == "openai" else url
    return contract_from(f"""
[contract]
name = "provider-loop"
intent = "What time is it, and is the tree clean?"
[agent]
provider = "{provider}"
model = "test-model"
base_url = "{base}"
api_key_env = "TEST_KEY"
max_attempts = 3
[policy]
default = "allow"
[[policy.rules]]
tool = "mcp:fs:*"
effect = "deny"
reason = "no file writes"
[[mcp.servers]]
name = "time"
command = "unused"
allow_tools = ["get_current_time"]
[[mcp.servers]]
name = "git"
command = "unused"
allow_tools = ["git_status"]
[[mcp.servers]]
name = "fs"
command = "unused"
allow_tools = ["write_file"]
[[done.checks]]
kind = "final_matches"
regex = "14:02"
[[done.checks]]
kind = "tool_succeeded"
tool = "mcp:git:git_status"
""")


async def answer(tool: MountedTool, arguments: Mapping[str, Any]) -> ToolResult:
    if tool.tool == "get_current_time":
        return text_result("14:02", structured={"time": "14:02", "timezone": arguments.get("timezone")})
    return text_result("nothing to commit, working tree clean")


def tools() -> FakeTransport:
    return FakeTransport(
        answer,
        tools=[
            mounted_tool("time", "get_current_time", input_schema={"type": "object"}),
            mounted_tool("git", "git_status", input_schema={"type": "object"}),
            mounted_tool("fs", "write_file", input_schema={"type": "object"}),
        ],
    )


async def run(tmp_path: Path, c: Contract, fake: FakeTransport, sleep: RecordingSleep) -> tuple[RunOutcome, Any]:
    clock = ManualClock()
    store, key = new_store(tmp_path, clock)
    environ = {"TEST_KEY": KEY}

    def provider(contract: Contract) -> Provider:
        return make_provider(contract, environ=environ, clock=clock, sleep=sleep, jitter=lambda: 0.0)

    with anyio.fail_after(30):
        outcome = await run_contract(
            Runtime(
                store=store,
                key=key,
                clock=clock,
                home=tmp_path / "home",
                environ=environ,
                connector=fake_connector(fake),
                provider=provider,
            ),
            c,
        )
    report = verify_entries(store.read_session(outcome.session), TrustedKeys([key.verifier]), blobs=store.blob)
    assert report.ok, report
    return outcome, store


async def test_openai_three_tools_in_one_turn_one_denied_then_an_answer(
    tmp_path: Path, loopback: LoopbackServer
) -> None:
    loopback.reply(Reply(body=wire("openai/three_tool_calls.json")), Reply(body=wire("openai/final_answer.json")))
    fake = tools()
    outcome, store = await run(tmp_path, contract(loopback.url, "openai"), fake, RecordingSleep())
    assert outcome.status == "pass", outcome.verdict
    assert [c.tool for c in fake.calls] == ["mcp:time:get_current_time", "mcp:git:git_status"]
    kinds = kinds_of(store, outcome.session)
    assert kinds.count("model_turn") == 2 and kinds.count("mcp_tool_denied") == 1
    # The second request on the wire carries the three results in order, the denial among them.
    second = loopback.requests[1].body
    tool_messages = [m for m in second["messages"] if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == ["call_a", "call_b", "call_c"]
    assert "no file writes" in tool_messages[2]["content"]
    assert "budget left" in tool_messages[0]["content"]
    turns = [e for e in store.read_session(outcome.session) if e.kind == "model_turn"]
    assert turns[0].body["usage"] == {"input_tokens": 310, "output_tokens": 77}
    store.close()
    assert files_containing(tmp_path, KEY.encode()) == []  # the API key is never recorded


async def test_a_500_storm_that_exhausts_retries_ends_the_run_with_verdict_error(
    tmp_path: Path, loopback: LoopbackServer
) -> None:
    loopback.reply(*[Reply(500, {"error": {"message": "overloaded"}}) for _ in range(3)])
    sleep = RecordingSleep()
    outcome, _ = await run(tmp_path, contract(loopback.url, "openai"), tools(), sleep)
    assert outcome.status == "error" and outcome.exit_code == 4
    assert outcome.verdict is not None and outcome.verdict["error"]["cause"] == "provider"
    assert len(loopback.requests) == 3 and len(sleep.delays) == 2
