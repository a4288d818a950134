"""Real providers inside a whole run: loopback model server, the gate, the loop, the verdict, the ledger.

The model side speaks the real wire formats over 127.0.0.1; the tools are a ``FakeTransport``
(the MCP tier has its own tests). Each case is one of issue 6's provider cases, observed where a
user sees it: the verdict, the exit code, the ledger.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.gate.support import fake_connector, files_containing, kinds_of, new_store
from tests.providers._support import LoopbackServer, RecordingSleep, Reply
from truss.contract import Contract, load_contract_text
from truss.providers import Provider, make_provider
from truss.runtime import Runtime
from truss.session import RunOutcome, run_contract
from truss.testing import FakeTransport, ManualClock, mounted_tool, text_result
from truss.tools import MountedTool, ToolResult

pytestmark = pytest.mark.anyio

KEY = "sk-run-canary-5d41402abc4b2a76b9719d911017c592"

CONTRACT = """
[contract]
name = "provider-run"
intent = "Read the time, note it, and answer."
[agent]
provider = "{provider}"
model = "test-model"
base_url = "{base_url}"
api_key_env = "TEST_MODEL_KEY"
max_attempts = 3
[budget]
max_tool_calls = 10
max_model_turns = 5
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
allow_tools = ["now", "echo", "write"]
[[done.checks]]
kind = "tool_succeeded"
tool = "mcp:srv:now"
[[done.checks]]
kind = "final_matches"
regex = "12:00"
"""


async def tools(tool: MountedTool, arguments: Mapping[str, Any]) -> ToolResult:
    if tool.tool == "now":
        return text_result("12:00 UTC", structured={"time": "12:00", "zone": "UTC"})
    return text_result(json.dumps(dict(arguments)))


def transport() -> FakeTransport:
    return FakeTransport(tools, tools=[mounted_tool("srv", name) for name in ("now", "echo", "write")])


def openai_calls(*calls: tuple[str, str]) -> dict[str, Any]:
    tool_calls = [
        {"id": f"call_{i}", "type": "function", "function": {"name": name, "arguments": arguments}}
        for i, (name, arguments) in enumerate(calls)
    ]
    message = {"role": "assistant", "content": None, "tool_calls": tool_calls}
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120},
    }


def openai_text(text: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-2",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 300, "completion_tokens": 10, "total_tokens": 310},
    }


def anthropic_text(text: str) -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 50, "output_tokens": 5},
    }


def anthropic_calls(*calls: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    blocks = [{"type": "tool_use", "id": f"toolu_{i}", "name": n, "input": a} for i, (n, a) in enumerate(calls)]
    return {
        "id": "msg_0",
        "type": "message",
        "role": "assistant",
        "content": blocks,
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 40, "output_tokens": 8},
    }


class Run:
    def __init__(self, tmp_path: Path, server: LoopbackServer, sleep: RecordingSleep) -> None:
        self.tmp_path = tmp_path
        self.clock = ManualClock()
        self.store, self.key = new_store(tmp_path, self.clock)
        self.server = server
        self.sleep = sleep
        self.fake = transport()

    def contract(self, provider: str, budget: str = "") -> Contract:
        base_url = self.server.url + ("/v1" if provider == "openai" else "")
        text = CONTRACT.format(provider=provider, base_url=base_url, budget=budget)
        return load_contract_text(text, source="provider-run.toml", environ={})

    async def __call__(self, contract: Contract) -> RunOutcome:
        environ = {"TEST_MODEL_KEY": KEY}

        def factory(c: Contract) -> Provider:
            return make_provider(c, environ=environ, clock=self.clock, sleep=self.sleep)

        with anyio.fail_after(30):
            return await run_contract(
                Runtime(
                    store=self.store,
                    key=self.key,
                    clock=self.clock,
                    home=self.tmp_path / "home",
                    environ=environ,
                    connector=fake_connector(self.fake),
                    provider=factory,
                ),
                contract,
            )


@pytest.fixture
def run(tmp_path: Path, loopback: LoopbackServer, sleep: RecordingSleep) -> Run:
    return Run(tmp_path, loopback, sleep)


async def test_three_calls_in_one_turn_one_denied_then_an_answer_passes_and_records_usage(
    run: Run, loopback: LoopbackServer
) -> None:
    loopback.reply(
        Reply(
            body=openai_calls(
                ("mcp__srv__now", "{}"),
                ("mcp__srv__write", '{"path": "/etc/motd"}'),
                ("mcp__srv__echo", '{"text": "noted"}'),
            )
        ),
        Reply(body=openai_text("It is 12:00 UTC.")),
    )
    outcome = await run(run.contract("openai"))
    assert (outcome.status, outcome.exit_code) == ("pass", 0)
    assert [c.tool for c in run.fake.calls] == ["mcp:srv:now", "mcp:srv:echo"]
    kinds = kinds_of(run.store, outcome.session)
    assert kinds.count("model_turn") == 2 and kinds.count("mcp_tool_denied") == 1
    turns = [e.body for e in run.store.read_session(outcome.session) if e.kind == "model_turn"]
    assert [t["usage"] for t in turns] == [
        {"input_tokens": 100, "output_tokens": 20},
        {"input_tokens": 300, "output_tokens": 10},
    ]
    replies = loopback.requests[1].body["messages"]
    assert [m["role"] for m in replies] == ["system", "user", "assistant", "tool", "tool", "tool"]
    assert "no writes in this test" in replies[4]["content"]
    # The key went to the model server and nowhere else: not a byte of it under the run's files.
    assert loopback.requests[0].headers["authorization"] == f"Bearer {KEY}"
    assert files_containing(run.tmp_path, KEY.encode()) == []


async def test_a_rate_limit_then_success_is_invisible_to_the_verdict(run: Run, loopback: LoopbackServer) -> None:
    limited = Reply(
        429, {"type": "error", "error": {"type": "rate_limit_error", "message": "slow"}}, {"retry-after": "3"}
    )
    loopback.reply(
        limited,
        Reply(body=anthropic_calls(("mcp__srv__now", {}))),
        Reply(body=anthropic_text("It is 12:00.")),
    )
    outcome = await run(run.contract("anthropic"))
    assert outcome.status == "pass"
    assert run.sleep.delays == [3.0]
    assert len(loopback.requests) == 3


async def test_a_500_storm_ends_the_run_with_verdict_error_naming_the_provider(
    run: Run, loopback: LoopbackServer
) -> None:
    loopback.reply(*[Reply(500, {"error": {"message": "boom", "type": "server_error"}})] * 3)
    outcome = await run(run.contract("openai"))
    assert (outcome.status, outcome.exit_code) == ("error", 4)
    assert len(loopback.requests) == 3
    assert outcome.verdict is not None
    assert outcome.verdict["error"]["cause"] == "provider"
    assert files_containing(run.tmp_path, KEY.encode()) == []


async def test_malformed_tool_call_json_goes_back_to_the_model_and_the_run_goes_on(
    run: Run, loopback: LoopbackServer
) -> None:
    loopback.reply(
        Reply(body=openai_calls(("mcp__srv__now", '{"zone": '))),
        Reply(body=openai_calls(("mcp__srv__now", "{}"))),
        Reply(body=openai_text("It is 12:00 UTC.")),
    )
    outcome = await run(run.contract("openai"))
    assert outcome.status == "pass"
    assert len(run.fake.calls) == 1
    second = loopback.requests[1].body["messages"]
    assert second[2]["tool_calls"][0]["function"]["arguments"] == '{"zone": '
    assert second[3]["role"] == "tool" and second[3]["content"].startswith("ERROR: ")


async def test_a_token_budget_spent_mid_run_ends_it_with_verdict_error(run: Run, loopback: LoopbackServer) -> None:
    loopback.reply(
        Reply(body=openai_calls(("mcp__srv__now", "{}"))),
        Reply(body=openai_calls(("mcp__srv__echo", '{"text": "more"}'))),
        Reply(body=openai_text("It is 12:00 UTC.")),
    )
    outcome = await run(run.contract("openai", budget="max_tokens = 150"))
    assert (outcome.status, outcome.exit_code) == ("error", 4)
    assert outcome.verdict is not None
    assert outcome.verdict["error"]["cause"] == "budget"
    assert outcome.verdict["error"]["limit"] == "max_tokens"
    assert len(loopback.requests) < 3
