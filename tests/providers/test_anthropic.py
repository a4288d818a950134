"""The Anthropic provider against a loopback server speaking the Messages API."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.providers._support import WIRE, LoopbackServer, RecordingSleep, Reply, make_contract, wire
from truss._errors import InputError, ProviderError
from truss.providers import AnthropicProvider, HttpSettings, ToolSpec, TurnRequest, TurnResponse, make_provider
from truss.testing import ManualClock

pytestmark = pytest.mark.anyio

KEY = "sk-ant-test-0123456789abcdef"
TOOLS = [
    ToolSpec("mcp__time__get_current_time", "Current time in a zone", {"type": "object", "properties": {}}),
    ToolSpec("mcp__git__git_status", "Working tree status", {"type": "object", "properties": {}}),
    ToolSpec("mcp__fs__write_file", "", {"type": "object", "properties": {}}),
]


def provider_for(server: LoopbackServer, sleep: RecordingSleep, **agent: Any) -> Any:
    contract = make_contract(
        provider="anthropic", model="claude-sonnet-4-5", base_url=server.url, api_key_env="TEST_ANTHROPIC_KEY", **agent
    )
    return make_provider(
        contract, environ={"TEST_ANTHROPIC_KEY": KEY}, clock=ManualClock(), sleep=sleep, jitter=lambda: 0.0
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
    loopback.reply(Reply(body=wire("anthropic/three_tool_uses.json")), Reply(body=wire("anthropic/final_answer.json")))
    provider = provider_for(loopback, sleep, max_output_tokens=1000, temperature=0.0)
    try:
        first = await turn(provider, first_request())
        assert first.stop_reason == "tool_use"
        assert [(c.id, c.name, c.arguments) for c in first.tool_calls] == [
            ("toolu_01A", "mcp__time__get_current_time", {"timezone": "Europe/Paris"}),
            ("toolu_01B", "mcp__git__git_status", {"repo_path": "/srv/repo"}),
            ("toolu_01C", "mcp__fs__write_file", {"path": "/etc/passwd", "content": "x"}),
        ]
        conversation = [
            *first_request().messages,
            {"role": "assistant", "text": first.text, "tool_calls": [c.to_json() for c in first.tool_calls]},
            {
                "role": "tool",
                "call_id": "toolu_01A",
                "name": "mcp__time__get_current_time",
                "is_error": False,
                "text": "",
                "structured": {"datetime": "2026-01-01T14:02:00+01:00"},
            },
            {
                "role": "tool",
                "call_id": "toolu_01B",
                "name": "mcp__git__git_status",
                "is_error": False,
                "text": "clean",
                "note": "[budget left: tool_calls=7]",
            },
            {
                "role": "tool",
                "call_id": "toolu_01C",
                "name": "mcp__fs__write_file",
                "is_error": True,
                "text": "denied by policy: writes need a person",
            },
        ]
        second = await turn(provider, TurnRequest("You are careful.", conversation, TOOLS, 2))
    finally:
        await provider.aclose()

    assert second.tool_calls == []
    assert second.stop_reason == "end_turn"
    assert second.text == "It is 14:02 in Paris; the tree is clean."

    sent = loopback.requests
    assert [r.path for r in sent] == ["/v1/messages", "/v1/messages"]
    assert sent[0].headers["x-api-key"] == KEY
    assert sent[0].headers["anthropic-version"] == "2023-06-01"
    assert sent[0].body == {
        "model": "claude-sonnet-4-5",
        "max_tokens": 1000,
        "system": "You are careful.",
        "temperature": 0.0,
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "What time is it, and is the tree clean?"}]}
        ],
        "tools": [
            {
                "name": "mcp__time__get_current_time",
                "description": "Current time in a zone",
                "input_schema": {"type": "object", "properties": {}},
            },
            {
                "name": "mcp__git__git_status",
                "description": "Working tree status",
                "input_schema": {"type": "object", "properties": {}},
            },
            {"name": "mcp__fs__write_file", "input_schema": {"type": "object", "properties": {}}},
        ],
    }
    messages = sent[1].body["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[1]["content"][0] == {"type": "text", "text": "I will check the time, the status and the log."}
    assert [b["type"] for b in messages[1]["content"]] == ["text", "tool_use", "tool_use", "tool_use"]
    assert messages[2]["content"] == [
        {
            "type": "tool_result",
            "tool_use_id": "toolu_01A",
            "content": [{"type": "text", "text": '{"datetime":"2026-01-01T14:02:00+01:00"}'}],
        },
        {
            "type": "tool_result",
            "tool_use_id": "toolu_01B",
            "content": [{"type": "text", "text": "clean\n[budget left: tool_calls=7]"}],
        },
        {
            "type": "tool_result",
            "tool_use_id": "toolu_01C",
            "content": [{"type": "text", "text": "denied by policy: writes need a person"}],
            "is_error": True,
        },
    ]


async def test_usage_counts_plain_cache_write_and_cache_read_input_tokens(
    loopback: LoopbackServer, sleep: RecordingSleep
) -> None:
    loopback.reply(Reply(body=wire("anthropic/three_tool_uses.json")), Reply(body=wire("anthropic/final_answer.json")))
    provider = provider_for(loopback, sleep)
    try:
        first = await turn(provider, first_request())
        second = await turn(provider, first_request())
    finally:
        await provider.aclose()
    assert (first.usage.input_tokens, first.usage.output_tokens, first.usage.total) == (532, 96, 628)
    assert (second.usage.input_tokens, second.usage.output_tokens) == (700, 18)


async def test_a_tool_use_whose_input_is_not_an_object_becomes_a_call_without_arguments(
    loopback: LoopbackServer, sleep: RecordingSleep
) -> None:
    loopback.reply(Reply(body=wire("anthropic/tool_use_input_not_an_object.json")))
    provider = provider_for(loopback, sleep)
    try:
        response = await turn(provider, first_request())
    finally:
        await provider.aclose()
    (call,) = response.tool_calls
    assert call.arguments is None
    assert call.raw_arguments == '"timezone=UTC"'


async def test_a_rate_limit_with_retry_after_is_waited_out_then_the_call_succeeds(
    loopback: LoopbackServer, sleep: RecordingSleep
) -> None:
    loopback.reply(
        Reply(
            429, {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}, {"retry-after": "7"}
        ),
        Reply(body=wire("anthropic/final_answer.json")),
    )
    provider = provider_for(loopback, sleep)
    try:
        response = await turn(provider, first_request())
    finally:
        await provider.aclose()
    assert response.text.startswith("It is 14:02")
    assert sleep.delays == [7.0]
    assert len(loopback.requests) == 2


async def test_an_overloaded_storm_exhausts_the_attempts_and_says_how_many(
    loopback: LoopbackServer, sleep: RecordingSleep
) -> None:
    overloaded = Reply(529, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    loopback.reply(*[overloaded] * 3)
    provider = provider_for(loopback, sleep, max_attempts=3)
    try:
        with pytest.raises(ProviderError) as caught:
            await turn(provider, first_request())
    finally:
        await provider.aclose()
    err = caught.value
    assert (err.provider, err.status, err.attempts, err.reason, err.retryable) == (
        "anthropic",
        529,
        3,
        "http_status",
        True,
    )
    assert len(loopback.requests) == 3
    assert sleep.delays == [0.5, 1.0]


@pytest.mark.parametrize("name", sorted(p.name for p in (WIRE / "anthropic" / "bad").iterdir()))
async def test_an_answer_of_the_wrong_shape_is_a_bad_response_error(
    loopback: LoopbackServer, sleep: RecordingSleep, name: str
) -> None:
    loopback.reply(Reply(body=wire(f"anthropic/bad/{name}")))
    provider = provider_for(loopback, sleep)
    try:
        with pytest.raises(ProviderError) as caught:
            await turn(provider, first_request())
    finally:
        await provider.aclose()
    assert (caught.value.reason, caught.value.status, caught.value.retryable) == ("bad_response", 200, False)
    assert len(loopback.requests) == 1


async def test_without_a_base_url_the_default_key_variable_is_required(tmp_path: Path) -> None:
    contract = make_contract(provider="anthropic", model="claude-sonnet-4-5")
    with pytest.raises(InputError) as caught:
        make_provider(contract, environ={}, clock=ManualClock())
    assert caught.value.env == "ANTHROPIC_API_KEY"
    provider = make_provider(contract, environ={"ANTHROPIC_API_KEY": KEY}, clock=ManualClock())
    assert isinstance(provider, AnthropicProvider)
    await provider.aclose()


async def test_a_custom_base_url_gets_no_key_unless_the_contract_names_its_variable(
    loopback: LoopbackServer, sleep: RecordingSleep
) -> None:
    loopback.reply(Reply(body=wire("anthropic/final_answer.json")))
    contract = make_contract(provider="anthropic", model="m", base_url=loopback.url)
    provider = make_provider(
        contract,
        environ={"ANTHROPIC_API_KEY": KEY},
        clock=ManualClock(),
        sleep=sleep,
        transport=None,
    )
    try:
        await turn(provider, first_request())
    finally:
        await provider.aclose()
    assert "x-api-key" not in loopback.requests[0].headers


async def test_a_response_larger_than_the_bound_is_refused(loopback: LoopbackServer, sleep: RecordingSleep) -> None:
    big = wire("anthropic/final_answer.json")
    big["content"][0]["text"] = "x" * 5000
    loopback.reply(Reply(body=big))
    provider = AnthropicProvider(
        model="m",
        api_key=KEY,
        base_url=loopback.url,
        settings=HttpSettings(max_response_bytes=4096),
        clock=ManualClock(),
        sleep=sleep,
    )
    try:
        with pytest.raises(ProviderError) as caught:
            await turn(provider, first_request())
    finally:
        await provider.aclose()
    assert caught.value.reason == "response_too_large"
