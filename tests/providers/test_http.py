"""Retries, Retry-After, bounds and key hygiene of both real providers over real loopback sockets."""

from __future__ import annotations

import email.utils
import json
import traceback
from collections.abc import Iterator
from typing import Any

import anyio
import httpx2
import pytest
from pydantic import ValidationError

from tests.providers._support import WIRE, LoopbackServer, RecordingSleep, Reply, closed_port_url, make_contract, wire
from truss._errors import InputError, ProviderError, TrussError
from truss.providers import Provider, ToolSpec, TurnRequest, make_provider, retry_after_s
from truss.providers._http import HttpSettings
from truss.providers.openai import OpenAIProvider
from truss.testing import ManualClock

pytestmark = pytest.mark.anyio

KEY = "sk-secret-do-not-leak-4242424242"
REQUEST = TurnRequest("sys", [{"role": "user", "text": "hi"}], [ToolSpec("mcp__a__b", "d", {"type": "object"})], 1)
CLOCK_START_MS = 1_767_225_600_000


def openai_at(url: str, sleep: RecordingSleep, jitter: float = 0.0, **agent: Any) -> Any:
    contract = make_contract(provider="openai", model="m", base_url=url, api_key_env="K", **agent)
    return make_provider(
        contract, environ={"K": KEY}, clock=ManualClock(CLOCK_START_MS), sleep=sleep, jitter=lambda: jitter
    )


def anthropic_at(url: str, sleep: RecordingSleep, **agent: Any) -> Any:
    contract = make_contract(provider="anthropic", model="m", base_url=url, api_key_env="K", **agent)
    return make_provider(contract, environ={"K": KEY}, clock=ManualClock(CLOCK_START_MS), sleep=sleep)


async def ask(provider: Any) -> Any:
    try:
        with anyio.fail_after(10):
            return await provider.next_turn(REQUEST)
    finally:
        await provider.aclose()


async def failure(provider: Any) -> ProviderError:
    with pytest.raises(ProviderError) as caught:
        await ask(provider)
    return caught.value


def http_date(ms: int) -> str:
    return email.utils.formatdate(ms / 1000, usegmt=True)


FINAL = wire("openai/final_answer.json")


async def test_retry_after_as_an_http_date_waits_until_that_date(
    loopback: LoopbackServer, sleep: RecordingSleep
) -> None:
    loopback.reply(Reply(503, b"busy", {"retry-after": http_date(CLOCK_START_MS + 30_000)}), Reply(body=FINAL))
    await ask(openai_at(loopback.url, sleep))
    assert sleep.delays == [30.0]


async def test_retry_after_longer_than_the_cap_is_capped(loopback: LoopbackServer, sleep: RecordingSleep) -> None:
    loopback.reply(Reply(429, b"{}", {"retry-after": "86400"}), Reply(body=FINAL))
    await ask(openai_at(loopback.url, sleep))
    assert sleep.delays == [60.0]


async def test_retry_after_ms_wins_over_retry_after(loopback: LoopbackServer, sleep: RecordingSleep) -> None:
    loopback.reply(Reply(429, b"{}", {"retry-after-ms": "1500", "retry-after": "9"}), Reply(body=FINAL))
    await ask(openai_at(loopback.url, sleep))
    assert sleep.delays == [1.5]


async def test_a_nonsense_retry_after_falls_back_to_jittered_backoff(
    loopback: LoopbackServer, sleep: RecordingSleep
) -> None:
    loopback.reply(Reply(429, b"{}", {"retry-after": "soon"}), Reply(502, b""), Reply(body=FINAL))
    await ask(openai_at(loopback.url, sleep, jitter=1.0))
    assert sleep.delays == [0.375, 0.75]


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after": "12"}, 12.0),
        ({"retry-after": "0.25"}, 0.25),
        ({"retry-after": "-3"}, None),
        ({"retry-after": "nan"}, None),
        ({"retry-after": "inf"}, None),
        ({"retry-after": http_date(CLOCK_START_MS - 60_000)}, 0.0),
        ({"retry-after": "Thu, 99 Foo 2026 99:99:99 GMT"}, None),
        ({"retry-after-ms": "x", "retry-after": "4"}, 4.0),
        ({}, None),
    ],
)
def test_retry_after_parsing(headers: dict[str, str], expected: float | None) -> None:
    assert retry_after_s(headers, CLOCK_START_MS) == expected


async def test_a_refused_connection_is_retried_then_reported_as_a_transport_failure(sleep: RecordingSleep) -> None:
    err = await failure(openai_at(closed_port_url(), sleep, max_attempts=3))
    assert (err.reason, err.status, err.attempts, err.retryable) == ("transport", None, 3, True)
    assert len(sleep.delays) == 2


async def test_a_dropped_connection_is_retried(loopback: LoopbackServer, sleep: RecordingSleep) -> None:
    loopback.reply(Reply(drop=True), Reply(body=FINAL))
    response = await ask(openai_at(loopback.url, sleep))
    assert response.text.startswith("It is")
    assert len(loopback.requests) == 2


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
async def test_a_client_error_is_not_retried(loopback: LoopbackServer, sleep: RecordingSleep, status: int) -> None:
    loopback.reply(Reply(status, {"error": {"message": "nope", "type": "invalid_request_error"}}))
    err = await failure(openai_at(loopback.url, sleep))
    assert (err.status, err.attempts, err.retryable, err.reason) == (status, 1, False, "http_status")
    assert sleep.delays == []


async def test_a_redirect_is_not_followed_so_the_key_never_reaches_another_host(
    loopback: LoopbackServer, sleep: RecordingSleep
) -> None:
    other = LoopbackServer().start()
    try:
        loopback.reply(Reply(307, b"", {"location": other.url + "/chat/completions"}))
        err = await failure(anthropic_at(loopback.url, sleep))
    finally:
        other.close()
    assert (err.status, err.retryable) == (307, False)
    assert other.requests == []


@pytest.mark.parametrize("name", sorted(p.name for p in (WIRE / "garbage").iterdir()))
async def test_a_success_status_with_a_garbage_body_is_a_bad_response(
    loopback: LoopbackServer, sleep: RecordingSleep, name: str
) -> None:
    loopback.reply(Reply(body=(WIRE / "garbage" / name).read_bytes()))
    err = await failure(openai_at(loopback.url, sleep))
    assert (err.reason, err.status, err.retryable) == ("bad_response", 200, False)


def _every_text_of(err: BaseException) -> Iterator[str]:
    yield str(err)
    yield repr(err)
    yield "".join(traceback.format_exception(err))
    if isinstance(err, TrussError):
        yield err.diagnostics()
        yield json.dumps(err.to_json())
        yield repr(err.fields)


async def test_the_api_key_appears_in_no_error_text_repr_or_traceback(
    loopback: LoopbackServer, sleep: RecordingSleep
) -> None:
    # The server echoes the key back in every error, as a careless gateway might.
    echo = {"error": {"message": f"invalid key {KEY}", "type": "authentication_error"}}
    loopback.reply(
        Reply(401, echo),
        Reply(500, echo),
        Reply(500, echo),
        Reply(400, f"plain text {KEY}".encode()),
        Reply(body=wire("anthropic/bad/content_not_a_list.json")),
    )
    errors: list[ProviderError] = [
        await failure(anthropic_at(loopback.url, sleep)),
        await failure(openai_at(loopback.url, sleep, max_attempts=2)),
        await failure(openai_at(loopback.url, sleep)),
        await failure(anthropic_at(loopback.url, sleep)),
        await failure(openai_at(closed_port_url(), sleep, max_attempts=1)),
    ]
    assert errors[0].status == 401
    assert "[redacted]" in str(errors[0])
    for err in errors:
        for text in _every_text_of(err):
            assert KEY not in text
    providers: list[Provider] = [anthropic_at(loopback.url, sleep), openai_at(loopback.url, sleep)]
    for provider in providers:
        assert KEY not in repr(provider)
        assert KEY not in repr(vars(provider))
        await provider.aclose()
    assert KEY not in json.dumps(REQUEST.to_json())


async def test_the_url_in_errors_drops_user_info_and_query(sleep: RecordingSleep) -> None:
    # A contract refuses such a base_url at load (tests/security/test_credentials_in_urls.py); a
    # program building a provider itself still gets errors without them.
    url = closed_port_url().replace("http://", "http://user:hunter2@") + "/v1?token=abc"
    with pytest.raises(ValidationError):
        make_contract(provider="openai", model="m", base_url=url)
    provider = OpenAIProvider(model="m", api_key=KEY, base_url=url, settings=HttpSettings(max_attempts=1),
                              clock=ManualClock(CLOCK_START_MS), sleep=sleep)  # fmt: skip
    err = await failure(provider)
    for text in _every_text_of(err):
        assert "hunter2" not in text
        assert "token=abc" not in text


def _httpx2_errors() -> list[type[Exception]]:
    found: list[type[Exception]] = []
    for name in httpx2.__all__:
        value = getattr(httpx2, name)
        if isinstance(value, type) and issubclass(value, Exception):
            found.append(value)
    return found


@pytest.mark.parametrize("exc_type", _httpx2_errors(), ids=lambda t: t.__name__)
async def test_every_httpx2_exception_becomes_a_provider_error(
    exc_type: type[Exception], sleep: RecordingSleep
) -> None:
    # Exception mapping only: a transport that raises, so every class httpx2 exports is covered.
    def handler(request: httpx2.Request) -> httpx2.Response:
        if issubclass(exc_type, httpx2.RequestError):
            raise exc_type("simulated", request=request)
        if issubclass(exc_type, httpx2.HTTPStatusError):
            raise exc_type("simulated", request=request, response=httpx2.Response(500, request=request))
        try:
            error = exc_type("simulated")
        except TypeError:  # the StreamError family takes no message
            error = exc_type.__new__(exc_type)
        raise error

    contract = make_contract(provider="openai", model="m", base_url="http://127.0.0.1:9/v1")
    provider = make_provider(
        contract, environ={}, clock=ManualClock(), sleep=sleep, transport=httpx2.MockTransport(handler)
    )
    with pytest.raises(ProviderError) as caught:
        await ask(provider)
    assert caught.value.provider == "openai"
    assert caught.value.attempts is not None


@pytest.mark.parametrize("bad_key", ["sk-line\r\nX-Injected: 1", "sk-clé-unicode", "sk with space", "sk-tab\t", ""])
def test_an_unusable_key_value_is_refused_at_start_without_showing_it(bad_key: str) -> None:
    contract = make_contract(provider="openai", model="m", base_url="http://127.0.0.1:9/v1", api_key_env="K")
    with pytest.raises(InputError) as caught:
        make_provider(contract, environ={"K": bad_key}, clock=ManualClock())
    assert caught.value.env == "K"
    if bad_key:
        for text in _every_text_of(caught.value):
            assert bad_key not in text


async def test_a_conversation_json_cannot_carry_is_a_provider_error_before_anything_is_sent(
    loopback: LoopbackServer, sleep: RecordingSleep
) -> None:
    provider = anthropic_at(loopback.url, sleep)
    call = {"id": "c", "name": "mcp__a__b", "arguments": {"x": float("nan")}}
    request = TurnRequest("", [{"role": "assistant", "text": "", "tool_calls": [call]}], [], 1)
    with pytest.raises(ProviderError) as caught:
        try:
            await provider.next_turn(request)
        finally:
            await provider.aclose()
    assert (caught.value.reason, caught.value.attempts) == ("bad_request", 0)
    assert loopback.requests == []


@pytest.mark.parametrize(
    ("base_url", "allowed"),
    [
        ("https://llm.example.com/v1", True),
        ("http://127.0.0.1:11434/v1", True),
        ("http://[::1]:8000/v1", True),
        ("http://localhost:1234/v1", True),
        ("http://llm.example.com/v1", False),
        ("http://10.0.0.7:8000/v1", False),
        ("http://127.0.0.1.example.com/v1", False),
    ],
)
async def test_a_key_is_sent_in_clear_text_only_to_this_machine(base_url: str, allowed: bool) -> None:
    contract = make_contract(provider="openai", model="m", base_url=base_url, api_key_env="K")
    if allowed:
        provider = make_provider(contract, environ={"K": KEY}, clock=ManualClock())
        await provider.aclose()
        return
    with pytest.raises(InputError) as caught:
        make_provider(contract, environ={"K": KEY}, clock=ManualClock())
    assert caught.value.env == "K"
    # Without a key the same server is fine (a LAN Ollama needs none).
    keyless = make_contract(provider="openai", model="m", base_url=base_url)
    await make_provider(keyless, environ={"K": KEY}, clock=ManualClock()).aclose()
