"""The OpenAI provider against a loopback server speaking Chat Completions."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from tests.providers._support import WIRE, LoopbackServer, RecordingSleep, Reply, make_contract, wire
from truss._errors import InputError, ProviderError
from truss.providers import OpenAIProvider, ToolSpec, TurnRequest, TurnResponse, make_provider
from truss.providers.openai import to_wire
from truss.testing import ManualClock

pytestmark = pytest.mark.anyio

KEY = "sk-proj-test-fedcba9876543210"
SCHEMA = {"type": "object", "properties": {"timezone": {"type": "string"}}}
TOOLS = [
    ToolSpec("mcp__time__get_current_time", "Current time in a zone", SCHEMA),
    ToolSpec("mcp__git__git_status", "Working tree status", {"type": "object"}),
    ToolSpec("mcp__fs__write_file", "Write a file", {"type": "object"}),
]


def provider_for(server: LoopbackServer, sleep: RecordingSleep, *, keyed: bool = True, **agent: Any) -> Any:
    if keyed:
        agent["api_key_env"] = "TEST_OPENAI_KEY"
    contract = make_contract(provider="openai", model="gpt-4.1-mini", base_url=server.url + "/v1", **agent)
    return make_provider(
        contract, environ={"TEST_OPENAI_KEY": KEY}, clock=ManualClock(), sleep=sleep, jitter=lambda: 0.0
    )


def first_request() -> TurnRequest:
    return TurnRequest(
        system="You are careful.",
        messages=[{"role": "user", "text": "What time is it, and is the tree clean?"}],
        tools=TOOLS,
        turn=1,
    )


async def turn(provider: Any, request: TurnRequest) -> TurnResponse:
    with anyio.fail_after(10):
        return await provider.next_turn(request)


async def test_a_model_calling_three_tools_in_one_turn_then_answering_round_trips_the_wire_format(
    loopback: LoopbackServer, sleep: RecordingSleep
) -> None:
    loopback.reply(Reply(body=wire("openai/three_tool_calls.json")), Reply(body=wire("openai/final_answer.json")))
    provider = provider_for(loopback, sleep, max_output_tokens=800)
    try:
        first = await turn(provider, first_request())
        assert first.stop_reason == "tool_use"
        assert first.text == ""
        assert [(c.id, c.name, c.arguments) for c in first.tool_calls] == [
            ("call_a", "mcp__time__get_current_time", {"timezone": "Europe/Paris"}),
            ("call_b", "mcp__git__git_status", {"repo_path": "/srv/repo"}),
            ("call_c", "mcp__fs__write_file", {"path": "/etc/passwd", "content": "x"}),
        ]
        conversation = [
            *first_request().messages,
            {"role": "assistant", "text": "", "tool_calls": [c.to_json() for c in first.tool_calls]},
            {"role": "tool", "call_id": "call_a", "name": "t", "is_error": False, "text": "14:02", "note": "[left: 7]"},
            {"role": "tool", "call_id": "call_b", "name": "g", "is_error": False, "text": "", "structured": {"ok": 1}},
            {"role": "tool", "call_id": "call_c", "name": "w", "is_error": True, "text": "denied by policy"},
        ]
        second = await turn(provider, TurnRequest("You are careful.", conversation, TOOLS, 2))
    finally:
        await provider.aclose()

    assert (second.text, second.tool_calls, second.stop_reason) == (
        "It is 14:02 in Paris; the tree is clean.",
        [],
        "end_turn",
    )
    sent = loopback.requests
    assert [r.path for r in sent] == ["/v1/chat/completions", "/v1/chat/completions"]
    assert sent[0].headers["authorization"] == f"Bearer {KEY}"
    assert sent[0].body == {
        "model": "gpt-4.1-mini",
        "max_tokens": 800,
        "messages": [
            {"role": "system", "content": "You are careful."},
            {"role": "user", "content": "What time is it, and is the tree clean?"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "mcp__time__get_current_time",
                    "description": "Current time in a zone",
                    "parameters": SCHEMA,
                },
            },
            {
                "type": "function",
                "function": {
                    "name": "mcp__git__git_status",
                    "description": "Working tree status",
                    "parameters": {"type": "object"},
                },
            },
            {
                "type": "function",
                "function": {
                    "name": "mcp__fs__write_file",
                    "description": "Write a file",
                    "parameters": {"type": "object"},
                },
            },
        ],
    }
    messages = sent[1].body["messages"]
    assert messages[2] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_a",
                "type": "function",
                "function": {"name": "mcp__time__get_current_time", "arguments": '{"timezone":"Europe/Paris"}'},
            },
            {
                "id": "call_b",
                "type": "function",
                "function": {"name": "mcp__git__git_status", "arguments": '{"repo_path":"/srv/repo"}'},
            },
            {
                "id": "call_c",
                "type": "function",
                "function": {"name": "mcp__fs__write_file", "arguments": '{"path":"/etc/passwd","content":"x"}'},
            },
        ],
    }
    assert messages[3:] == [
        {"role": "tool", "tool_call_id": "call_a", "content": "14:02\n[left: 7]"},
        {"role": "tool", "tool_call_id": "call_b", "content": '{"ok":1}'},
        {"role": "tool", "tool_call_id": "call_c", "content": "ERROR: denied by policy"},
    ]


async def test_usage_is_reported_from_prompt_and_completion_tokens(
    loopback: LoopbackServer, sleep: RecordingSleep
) -> None:
    loopback.reply(Reply(body=wire("openai/three_tool_calls.json")))
    provider = provider_for(loopback, sleep)
    try:
        response = await turn(provider, first_request())
    finally:
        await provider.aclose()
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.total) == (310, 77, 387)


async def test_malformed_tool_call_json_becomes_a_call_without_arguments_and_is_sent_back_verbatim(
    loopback: LoopbackServer, sleep: RecordingSleep
) -> None:
    loopback.reply(
        Reply(body=wire("openai/malformed_tool_call_arguments.json")), Reply(body=wire("openai/final_answer.json"))
    )
    provider = provider_for(loopback, sleep, keyed=False)
    try:
        response = await turn(provider, first_request())
        bad, listed, empty = response.tool_calls
        assert (bad.id, bad.arguments, bad.raw_arguments) == ("call_bad", None, '{"timezone": "Europe/Paris"')
        assert (listed.arguments, listed.raw_arguments) == (None, "[1, 2]")
        # No id from the server: a deterministic one; empty arguments mean no arguments.
        assert (empty.id, empty.arguments, empty.raw_arguments) == ("call-1-2", {}, None)
        assert response.stop_reason == "tool_use"
        assert response.usage.total == 0
        conversation = [
            *first_request().messages,
            {"role": "assistant", "text": "", "tool_calls": [c.to_json() for c in response.tool_calls]},
        ]
        await turn(provider, TurnRequest("", conversation, TOOLS, 2))
    finally:
        await provider.aclose()
    assert "authorization" not in loopback.requests[0].headers
    echoed = loopback.requests[1].body["messages"][1]["tool_calls"]
    assert [c["function"]["arguments"] for c in echoed] == ['{"timezone": "Europe/Paris"', "[1, 2]", "{}"]


async def test_a_rate_limit_with_retry_after_is_waited_out_then_the_call_succeeds(
    loopback: LoopbackServer, sleep: RecordingSleep
) -> None:
    limited = Reply(429, {"error": {"message": "Rate limit reached", "type": "requests"}}, {"retry-after": "2"})
    loopback.reply(limited, Reply(body=wire("openai/final_answer.json")))
    provider = provider_for(loopback, sleep)
    try:
        response = await turn(provider, first_request())
    finally:
        await provider.aclose()
    assert response.text.startswith("It is 14:02")
    assert sleep.delays == [2.0]


async def test_a_500_storm_exhausts_the_attempts_with_a_clear_error(
    loopback: LoopbackServer, sleep: RecordingSleep
) -> None:
    loopback.reply(*[Reply(500, {"error": {"message": "The server had an error", "type": "server_error"}})] * 4)
    provider = provider_for(loopback, sleep)
    try:
        with pytest.raises(ProviderError) as caught:
            await turn(provider, first_request())
    finally:
        await provider.aclose()
    err = caught.value
    assert (err.provider, err.status, err.attempts, err.retryable) == ("openai", 500, 4, True)
    assert len(loopback.requests) == 4
    assert sleep.delays == [0.5, 1.0, 2.0]


@pytest.mark.parametrize("name", sorted(p.name for p in (WIRE / "openai" / "bad").iterdir()))
async def test_an_answer_of_the_wrong_shape_is_a_bad_response_error(
    loopback: LoopbackServer, sleep: RecordingSleep, name: str
) -> None:
    loopback.reply(Reply(body=wire(f"openai/bad/{name}")))
    provider = provider_for(loopback, sleep)
    try:
        with pytest.raises(ProviderError) as caught:
            await turn(provider, first_request())
    finally:
        await provider.aclose()
    assert (caught.value.reason, caught.value.status, caught.value.retryable) == ("bad_response", 200, False)


async def test_openai_itself_gets_max_completion_tokens_and_the_default_key_variable() -> None:
    contract = make_contract(provider="openai", model="gpt-4.1-mini")
    with pytest.raises(InputError) as caught:
        make_provider(contract, environ={}, clock=ManualClock())
    assert caught.value.env == "OPENAI_API_KEY"
    provider = make_provider(contract, environ={"OPENAI_API_KEY": KEY}, clock=ManualClock())
    assert isinstance(provider, OpenAIProvider)
    await provider.aclose()
    assert "max_completion_tokens" in to_wire(first_request(), model="m", max_output_tokens=5)


async def test_a_named_key_variable_that_is_not_set_is_an_input_error_naming_it() -> None:
    contract = make_contract(
        provider="openai", model="llama3.1", base_url="http://127.0.0.1:1/v1", api_key_env="MY_KEY"
    )
    with pytest.raises(InputError) as caught:
        make_provider(contract, environ={"OTHER": "x"}, clock=ManualClock())
    assert (caught.value.env, caught.value.provider, caught.value.exit_code) == ("MY_KEY", "openai", 2)


def test_an_empty_assistant_message_is_sent_with_empty_content_not_null() -> None:
    request = TurnRequest("", [{"role": "user", "text": "hi"}, {"role": "assistant", "text": ""}], [], 2)
    body = to_wire(request, model="m", max_output_tokens=1)
    assert body["messages"][1] == {"role": "assistant", "content": ""}
    assert "tools" not in body
