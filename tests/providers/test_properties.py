"""Properties over untrusted input: whatever a model server or a tool sends, providers map it or say why.

These use ``httpx2.MockTransport`` to feed hundreds of generated answers quickly; the loopback
tests cover the real sockets.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import httpx2
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.providers._support import make_contract
from truss._errors import ProviderError
from truss.providers import TurnRequest, TurnResponse, make_provider, retry_after_s
from truss.providers.openai import to_wire
from truss.testing import ManualClock

REQUEST = TurnRequest("", [{"role": "user", "text": "go"}], [], 3)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def answer_with(body: bytes, provider: str) -> TurnResponse | ProviderError:
    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, content=body, headers={"content-type": "application/json"})

    async def go() -> TurnResponse | ProviderError:
        contract = make_contract(provider=provider, model="m", base_url="http://127.0.0.1:9", max_attempts=1)
        p = make_provider(contract, environ={}, clock=ManualClock(), transport=httpx2.MockTransport(handler))
        try:
            return await p.next_turn(REQUEST)
        except ProviderError as err:
            return err
        finally:
            await p.aclose()

    return anyio.run(go)


def openai_answer(arguments: Any) -> bytes:
    call = {"id": "call_1", "type": "function", "function": {"name": "mcp__a__b", "arguments": arguments}}
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    return json.dumps({"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]}).encode()


@settings(max_examples=100, deadline=None)
@given(arguments=st.text(max_size=60))
def test_any_argument_string_becomes_a_call_whose_raw_text_is_sent_back_unchanged(arguments: str) -> None:
    result = answer_with(openai_answer(arguments), "openai")
    assert isinstance(result, TurnResponse)
    (call,) = result.tool_calls
    if call.arguments is None:
        assert call.raw_arguments == arguments
        echoed = to_wire(
            TurnRequest("", [{"role": "assistant", "text": "", "tool_calls": [call.to_json()]}], [], 4),
            model="m",
            max_output_tokens=1,
        )
        assert echoed["messages"][0]["tool_calls"][0]["function"]["arguments"] == arguments
    else:
        assert isinstance(call.arguments, dict)


@settings(max_examples=100, deadline=None)
@given(body=json_values, provider=st.sampled_from(["openai", "anthropic"]))
def test_any_json_answer_is_mapped_or_refused_as_a_bad_response(body: Any, provider: str) -> None:
    result = answer_with(json.dumps(body).encode(), provider)
    if isinstance(result, ProviderError):
        assert (result.reason, result.retryable) == ("bad_response", False)


@settings(max_examples=100, deadline=None)
@given(raw=st.binary(max_size=80), provider=st.sampled_from(["openai", "anthropic"]))
def test_any_bytes_are_mapped_or_refused_as_a_bad_response(raw: bytes, provider: str) -> None:
    result = answer_with(raw, provider)
    if isinstance(result, ProviderError):
        assert result.reason == "bad_response"


@given(value=st.text(max_size=40), millis=st.none() | st.text(max_size=10))
def test_retry_after_never_raises_and_is_never_negative(value: str, millis: str | None) -> None:
    headers = {"retry-after": value}
    if millis is not None:
        headers["retry-after-ms"] = millis
    delay = retry_after_s(headers, 1_767_225_600_000)
    assert delay is None or delay >= 0
