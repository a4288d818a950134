"""Attack: JSON that parses but that the ledger's RFC 8785 encoding has no form for (an integer
beyond 2**53, NaN, Infinity, nesting past 128 levels), sent by a model as tool arguments or by a
server as a result. Recording it failed after the fact and ended the run with an internal error
(a hostile model or server could stop any run; an honest one with a 64-bit id did too). Now the
model's call is denied as arguments that did not parse, the server's call fails as
``invalid_result``, the run reaches its verdict and the ledger verifies.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.durability.support import cli, entries
from tests.gate.support import fake_connector, new_store
from tests.providers._support import LoopbackServer, RecordingSleep, Reply
from tests.security._support import DATA, HOSTILE, hostile_contract, truss
from truss.contract import Contract, load_contract_text
from truss.ledger.keys import IdentityKey, TrustedKeys
from truss.ledger.stores.sqlite import SqliteStore
from truss.ledger.verification import verify_ledger
from truss.providers import Provider, make_provider
from truss.runtime import Runtime
from truss.session import RunOutcome, run_contract
from truss.testing import FakeTransport, ManualClock, mounted_tool, text_result
from truss.tools import MountedTool, ToolResult

MODEL_ATTACKS = sorted(p.name for p in DATA.glob("model_tool_arguments_*.json"))


def test_every_model_attack_file_is_exercised() -> None:
    assert len(MODEL_ATTACKS) == 6


@pytest.mark.anyio
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
@pytest.mark.parametrize("attack", MODEL_ATTACKS)
async def test_model_arguments_without_a_canonical_form_are_denied_and_the_run_finishes(
    tmp_path: Path, attack: str, provider: str
) -> None:
    reply = json.loads((DATA / attack).read_text())
    arguments = reply["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    if provider == "anthropic":  # the same value, as Anthropic sends it: already parsed
        reply = _anthropic_tool_use(arguments)
    outcome, fake, store, key = await _run(tmp_path, provider, Reply(body=reply), Reply(body=_final(provider)))
    assert (outcome.status, outcome.exit_code) == ("pass", 0)
    assert fake.calls == []
    [denied] = [e for e in store.read_session(outcome.session) if e.kind == "mcp_tool_denied"]
    assert denied.body["code"] == "bad_arguments"
    assert verify_ledger(store, TrustedKeys([key.verifier]), session=outcome.session).ok


@pytest.mark.anyio
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_token_count_the_ledger_cannot_record_is_an_invalid_answer_and_the_run_ends_in_error(
    tmp_path: Path, provider: str
) -> None:
    reply = json.loads((DATA / "model_usage_with_a_token_count_at_2_53.json").read_text())
    if provider == "anthropic":
        reply = _anthropic_tool_use("{}")
        reply["usage"] = {"input_tokens": 2**52, "cache_read_input_tokens": 2**52, "output_tokens": 1}
    outcome, fake, store, key = await _run(tmp_path, provider, Reply(body=reply))
    assert (outcome.status, outcome.exit_code) == ("error", 4)
    assert fake.calls == []
    [verdict] = [e for e in store.read_session(outcome.session) if e.kind == "verdict"]
    assert verdict.body["error"]["cause"] == "provider", verdict.body
    assert "usage." in verdict.body["error"]["detail"]  # the answer's bad field is named
    assert verify_ledger(store, TrustedKeys([key.verifier]), session=outcome.session).ok


CONTRACT = """
[contract]
name = "unrecordable"
intent = "call a tool"
[agent]
provider = "{provider}"
model = "m"
base_url = "{base_url}"
api_key_env = "MODEL_KEY"
[[mcp.servers]]
name = "hostile"
command = "unused"
allow_tools = ["echo"]
[done]
pass_without_checks = true
"""


async def _echo(tool: MountedTool, arguments: Mapping[str, Any]) -> ToolResult:
    return text_result("echo")


async def _run(
    tmp_path: Path, provider: str, *replies: Reply
) -> tuple[RunOutcome, FakeTransport, SqliteStore, IdentityKey]:
    """A run of ``CONTRACT`` whose model (a loopback server) answers with ``replies``; a fake echo tool."""
    clock = ManualClock()
    store, key = new_store(tmp_path, clock)
    fake = FakeTransport(_echo, tools=[mounted_tool("hostile", "echo")])
    model = LoopbackServer().start()
    environ = {"MODEL_KEY": "sk-k"}
    try:
        model.reply(*replies)
        base = model.url + ("/v1" if provider == "openai" else "")
        contract = load_contract_text(CONTRACT.format(provider=provider, base_url=base), source="t.toml", environ={})

        def factory(c: Contract) -> Provider:
            return make_provider(c, environ=environ, clock=clock, sleep=RecordingSleep())

        with anyio.fail_after(30):
            outcome = await run_contract(
                Runtime(store=store, key=key, clock=clock, home=tmp_path / "h", environ=environ,
                        connector=fake_connector(fake), provider=factory),
                contract,
            )  # fmt: skip
    finally:
        model.close()
    return outcome, fake, store, key


def _anthropic_tool_use(arguments_text: str) -> dict[str, Any]:
    value = json.loads(arguments_text)  # Python's parser takes NaN, Infinity, huge integers, depth 300
    block = {"type": "tool_use", "id": "toolu_0", "name": "mcp__hostile__echo", "input": value}
    return {
        "id": "msg_0",
        "type": "message",
        "role": "assistant",
        "content": [block],
        "stop_reason": "tool_use",
        "usage": {"input_tokens": 10, "output_tokens": 5},
    }


def _final(provider: str) -> dict[str, Any]:
    if provider == "openai":
        return {"choices": [{"index": 0, "message": {"role": "assistant", "content": "done"}, "finish_reason": "stop"}]}
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": "done"}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 10, "output_tokens": 1},
    }


@pytest.mark.parametrize("tool", ["u64", "deep"])
def test_a_server_result_without_a_canonical_form_is_a_failed_call_and_the_run_finishes(
    tmp_path: Path, home: Path, tool: str
) -> None:
    agent = f'[[agent.steps]]\ntool = "mcp:hostile:{tool}"\narguments = {{}}\n'
    contract = hostile_contract(tmp_path, agent=agent, server_extra=f'allow_tools = ["{tool}"]')
    contract.write_text(contract.read_text().replace('allow_tools = ["echo"]\n', ""))
    run = truss(home, "--json", "run", str(contract))
    assert run.returncode == 0, run.stderr
    assert "internal error" not in run.stderr and "failed (invalid_result)" in run.stderr
    session = json.loads(run.stdout)["session"]
    assert cli(home, "ledger", "verify", session).returncode == 0
    [call] = [e for e in entries(home, session) if e.kind == "mcp_tool_call"]
    assert call.body["failure"]["cause"] == "invalid_result"


@pytest.mark.parametrize(
    ("allow", "code"), [('["echo"]', 0), ('["echo", "counter"]', 4)], ids=["filtered", "allowlisted"]
)
def test_a_tool_definition_without_a_canonical_form_is_filtered_or_a_start_error_naming_it(
    tmp_path: Path, home: Path, allow: str, code: int
) -> None:
    # ``counter`` has a 64-bit ``maximum`` in its input schema: no pin can be computed for it.
    contract = hostile_contract(tmp_path)
    text = contract.read_text().replace('allow_tools = ["echo"]', f"allow_tools = {allow}")
    contract.write_text(text.replace(f"{json.dumps(str(HOSTILE))}]", f'{json.dumps(str(HOSTILE))}, "u64_schema"]'))
    run = truss(home, "run", str(contract))
    assert run.returncode == code, run.stderr
    shown = run.stdout + run.stderr
    assert "internal error" not in shown
    if code:
        assert "'counter'" in shown and "cannot be pinned" in shown


@pytest.mark.anyio
async def test_lone_surrogates_in_a_model_reply_become_replacement_characters_and_the_run_finishes(
    tmp_path: Path,
) -> None:
    # Text, call id and (inside the arguments string) an argument with "\\ud800"-style escapes.
    clock = ManualClock()
    store, key = new_store(tmp_path, clock)
    fake = FakeTransport(_echo, tools=[mounted_tool("hostile", "echo")])
    model = LoopbackServer().start()
    try:
        attack = (DATA / "model_reply_with_lone_surrogates.json").read_bytes()
        model.reply(Reply(body=attack), Reply(body=_final("openai")))
        text = CONTRACT.format(provider="openai", base_url=model.url + "/v1")
        contract = load_contract_text(text, source="t.toml", environ={})

        def factory(c: Contract) -> Provider:
            return make_provider(c, environ={"MODEL_KEY": "sk-k"}, clock=clock, sleep=RecordingSleep())

        with anyio.fail_after(30):
            outcome = await run_contract(
                Runtime(
                    store=store,
                    key=key,
                    clock=clock,
                    home=tmp_path / "h",
                    environ={"MODEL_KEY": "sk-k"},
                    connector=fake_connector(fake),
                    provider=factory,
                ),
                contract,
            )
    finally:
        model.close()
    assert (outcome.status, outcome.exit_code) == ("pass", 0)
    # The text and the call id are kept with U+FFFD; arguments holding a lone surrogate did not parse.
    recorded = b"".join(store.blob(ref) or b"" for e in store.read_session(outcome.session) for ref in e.refs())
    assert "half an emoji: \ufffd".encode() in recorded and "call_\ufffd".encode() in recorded
    assert fake.calls == []
    [denied] = [e for e in store.read_session(outcome.session) if e.kind == "mcp_tool_denied"]
    assert denied.body["code"] == "bad_arguments"
    assert verify_ledger(store, TrustedKeys([key.verifier]), session=outcome.session).ok
