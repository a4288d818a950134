"""Property: whatever JSON a model provider answers a turn with (any depth, integers of any size,
floats including NaN and the infinities, any strings including lone surrogates, any size, in any
field: usage, tool arguments, text, stop reason), the run reaches a verdict and the ledger verifies.

Each example is a whole run: the anthropic or openai provider against a loopback HTTP model server
answering the first turn with one generated body (JSON *text*, so it can hold what Python's JSON
writer never produces) and later turns with a plain final answer; the tools are a fake transport.
``usage.prompt_tokens = 2**62`` used to end the run with an internal error (the sum could not be
recorded); it is a ``bad_response`` from the provider now, as negative or float usage already was.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.gate.support import fake_connector, new_store
from tests.providers._support import LoopbackServer, Recorded, RecordingSleep, Reply
from tests.security.test_any_server_answer import _values  # pyright: ignore[reportPrivateUsage]
from truss.contract import Contract, load_contract_text
from truss.ledger.keys import IdentityKey, TrustedKeys
from truss.ledger.stores.sqlite import SqliteStore
from truss.ledger.verification import verify_ledger
from truss.providers import Provider, make_provider
from truss.runtime import Runtime
from truss.session import RunOutcome, run_contract
from truss.testing import FakeTransport, ManualClock, mounted_tool, text_result
from truss.tools import MountedTool, ToolResult

KEY = "sk-any-answer-canary-7f3a"

CONTRACT = """
[contract]
name = "any-model-answer"
intent = "take whatever the model says"
[agent]
provider = "{provider}"
model = "m"
base_url = "{base_url}"
api_key_env = "TEST_MODEL_KEY"
max_attempts = 1
[budget]
max_model_turns = 3
max_tool_calls = 4
[[mcp.servers]]
name = "srv"
command = "unused"
allow_tools = ["echo"]
[[done.checks]]
kind = "final_matches"
regex = "done"
"""

_FINAL: dict[str, Any] = {
    "openai": {"choices": [{"index": 0, "message": {"role": "assistant", "content": "done"}, "finish_reason": "stop"}]},
    "anthropic": {"content": [{"type": "text", "text": "done"}], "stop_reason": "end_turn", "usage": {}},
}

_fields = st.one_of(
    _values,
    st.sampled_from(["4611686018427387904", "9007199254740993", "4294967297", "1e400", "NaN", "-1", "1.5"]),
)


def _obj(**members: str) -> str:
    """A JSON object's text from its members' texts (which may be anything JSON text can hold)."""
    return "{" + ",".join(f"{json.dumps(k)}:{v}" for k, v in members.items()) + "}"


@st.composite
def model_answers(draw: st.DrawFn) -> tuple[str, str]:
    """(provider, the JSON text of its answer to the first turn)."""
    provider = draw(st.sampled_from(["openai", "anthropic"]))
    if draw(st.integers(0, 9)) == 0:  # sometimes not the wire format at all
        depth = draw(st.sampled_from([0, 1, 126, 127, 250]))
        return provider, "[" * depth + draw(_values) + "]" * depth

    def field(default: Any) -> str:
        return draw(_fields) if draw(st.booleans()) else json.dumps(default)

    if provider == "openai":
        arguments = field(json.dumps({"text": draw(st.text(max_size=30))}))
        function = _obj(name='"mcp__srv__echo"', arguments=arguments)
        call = _obj(id='"call_1"', type='"function"', function=function)
        message = _obj(role='"assistant"', content=field(None), tool_calls=f"[{call}]")
        choice = _obj(index="0", message=message, finish_reason=field("tool_calls"))
        usage = _obj(prompt_tokens=field(10), completion_tokens=field(2))
        body = _obj(choices=f"[{choice}]", usage=usage)
    else:
        use = _obj(type='"tool_use"', id=field("toolu_1"), name='"mcp__srv__echo"', input=field({"t": 1}))
        text = _obj(type='"text"', text=field("calling"))
        usage = _obj(input_tokens=field(10), output_tokens=field(2), cache_read_input_tokens=field(0))
        body = _obj(content=f"[{text},{use}]", stop_reason=field("tool_use"), usage=usage)
    return provider, body


async def _echo(tool: MountedTool, arguments: Mapping[str, Any]) -> ToolResult:
    return text_result("ok")


def _first_then_final(provider: str, body: str) -> LoopbackServer:
    def respond(recorded: Recorded) -> Reply:
        first = len(server.requests) == 1
        return Reply(body=body.encode("utf-8", "surrogatepass") if first else _FINAL[provider])

    server = LoopbackServer(respond)
    return server


def _run(tmp_path: Path, provider: str, body: str) -> tuple[RunOutcome, SqliteStore, IdentityKey]:
    """A whole run whose model answers its first turn with ``body`` and then with a final answer."""
    server = _first_then_final(provider, body).start()
    clock = ManualClock()
    store, key = new_store(tmp_path, clock)
    environ = {"TEST_MODEL_KEY": KEY}
    base_url = server.url + ("/v1" if provider == "openai" else "")
    contract = load_contract_text(CONTRACT.format(provider=provider, base_url=base_url), source="c.toml", environ={})
    fake = FakeTransport(_echo, tools=[mounted_tool("srv", "echo")])

    def factory(c: Contract) -> Provider:
        return make_provider(c, environ=environ, clock=clock, sleep=RecordingSleep())

    async def main() -> RunOutcome:
        with anyio.fail_after(30):
            runtime = Runtime(store=store, key=key, clock=clock, home=tmp_path / "home", environ=environ,
                              connector=fake_connector(fake), provider=factory)  # fmt: skip
            return await run_contract(runtime, contract)

    try:
        return anyio.run(main), store, key
    except BaseException:
        store.close()
        raise
    finally:
        server.close()


USAGE_OF_2_62 = json.dumps({
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "done"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 2**62, "completion_tokens": 1},
})  # fmt: skip
"""An OpenAI answer with a usage figure past what a ledger entry can hold (one of the property's cases too)."""


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(answer=model_answers())
@example(answer=("openai", USAGE_OF_2_62))
@example(answer=("anthropic", json.dumps({
    "content": [{"type": "text", "text": "done"}], "stop_reason": "end_turn",
    "usage": {"input_tokens": 2**52, "output_tokens": 1, "cache_read_input_tokens": 2**52},
})))  # fmt: skip
def test_any_answer_a_model_sends_reaches_a_verdict_and_the_ledger_verifies(
    tmp_path: Path, answer: tuple[str, str]
) -> None:
    provider, body = answer
    tmp_path = Path(tempfile.mkdtemp(dir=tmp_path))  # a ledger of its own: the manual clock repeats ids
    outcome, store, key = _run(tmp_path, provider, body)
    try:
        assert outcome.status in ("pass", "fail", "error")
        entries = list(store.read_session(outcome.session))
        assert [e.kind for e in entries][-2:] == ["verdict", "session_ended"]
        assert verify_ledger(store, TrustedKeys([key.verifier]), session=outcome.session).ok
    finally:
        store.close()


def test_a_usage_figure_of_two_to_the_62_is_a_bad_response_not_an_internal_error(tmp_path: Path) -> None:
    outcome, store, _ = _run(tmp_path, "openai", USAGE_OF_2_62)
    try:
        assert outcome.status == "error"
        assert outcome.verdict is not None and outcome.verdict["error"]["cause"] == "provider"
        detail = outcome.verdict["error"]["detail"]  # the provider's bad_response, as for negative usage
        assert "not a valid response" in detail and "usage.prompt_tokens" in detail
    finally:
        store.close()
