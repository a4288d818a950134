"""Attack: a model that echoes a secret. A provider echoing its own API key got it stored raw in
turn blobs and exports and forwarded to an MCP server as a tool argument; a model that had seen
one server's token could pass it to another. Provider keys are now scrubbed like ``secret_env``
values, and a call whose arguments hold a known secret its server was not given is denied
(``secret``, recorded, with a reason naming the variable, never the value).

The model's answers are data files (``data/model_*.json``, ``${KEY}`` and ``${TOKEN_A}`` standing
for the values), played by a loopback model server; the tools are a fake transport.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.gate.support import fake_connector, files_containing, new_store
from tests.providers._support import LoopbackServer, RecordingSleep, Reply
from tests.security._support import DATA
from truss.contract import Contract, load_contract_text
from truss.ledger.bundle import export_bundle
from truss.ledger.keys import TrustedKeys
from truss.ledger.verification import verify_ledger
from truss.providers import Provider, make_provider
from truss.runtime import Runtime
from truss.session import RunOutcome, run_contract
from truss.testing import FakeTransport, ManualClock, mounted_tool, text_result
from truss.tools import MountedTool, ToolResult

pytestmark = pytest.mark.anyio

KEY = "sk-echoed-canary-0b9d2f7c4e"
TOKEN_A = "ghp-server-a-canary-71c3e5"

CONTRACT = """
[contract]
name = "echoing-model"
intent = "security test"
[agent]
provider = "openai"
model = "hostile-model"
base_url = "{base_url}"
api_key_env = "MODEL_KEY"
max_attempts = 1
[budget]
max_model_turns = 3
[[mcp.servers]]
name = "a"
command = "unused"
allow_tools = ["echo"]
secret_env = ["TOKEN_A"]
[[mcp.servers]]
name = "b"
command = "unused"
allow_tools = ["echo"]
secret_args = ["password"]
"""

FINAL = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "done"}, "finish_reason": "stop"}]}


async def _echo(tool: MountedTool, arguments: Mapping[str, Any]) -> ToolResult:
    return text_result("ok")


def _answer(attack: str) -> bytes:
    text = (DATA / f"{attack}.json").read_text(encoding="utf-8")
    return text.replace("${KEY}", KEY).replace("${TOKEN_A}", TOKEN_A).encode()


async def _run(tmp_path: Path, attack: str) -> tuple[RunOutcome, FakeTransport, Any, bytes]:
    clock = ManualClock()
    store, key = new_store(tmp_path, clock)
    fake = FakeTransport(_echo, tools=[mounted_tool("a", "echo"), mounted_tool("b", "echo")])
    model = LoopbackServer().start()
    environ = {"MODEL_KEY": KEY, "TOKEN_A": TOKEN_A}
    try:
        model.reply(Reply(body=_answer(attack)), Reply(body=FINAL))
        contract = load_contract_text(CONTRACT.format(base_url=model.url + "/v1"), source="t.toml", environ={})

        def factory(c: Contract) -> Provider:
            return make_provider(c, environ=environ, clock=clock, sleep=RecordingSleep())

        with anyio.fail_after(30):
            outcome = await run_contract(
                Runtime(store=store, key=key, clock=clock, home=tmp_path / "h", environ=environ,
                        connector=fake_connector(fake), provider=factory),
                contract,
            )  # fmt: skip
        assert verify_ledger(store, TrustedKeys([key.verifier]), session=outcome.session).ok
        bundle = export_bundle(store, outcome.session, vkey=key.verifier.vkey, signer=key)
        return outcome, fake, store, bundle
    finally:
        model.close()


def _denials(store: Any, session: str) -> list[dict[str, Any]]:
    return [e.body for e in store.read_session(session) if e.kind == "mcp_tool_denied"]


async def test_a_model_echoing_its_api_key_gets_it_recorded_nowhere_and_sent_to_no_server(tmp_path: Path) -> None:
    outcome, fake, store, bundle = await _run(tmp_path, "model_echoing_its_api_key")
    try:
        assert fake.calls == []
        [denied] = _denials(store, outcome.session)
        assert (denied["tool"], denied["code"]) == ("mcp:b:echo", "secret")
        assert "MODEL_KEY" in denied["reason"]
        turns = [e for e in store.read_session(outcome.session) if e.kind == "model_turn"]
        assert turns, "the echoing turn is on the record, scrubbed"
    finally:
        store.close()
    assert KEY.encode() not in bundle
    assert files_containing(tmp_path, KEY.encode()) == []


async def test_a_model_forwarding_one_servers_token_to_another_server_is_denied(tmp_path: Path) -> None:
    outcome, fake, store, bundle = await _run(tmp_path, "model_forwarding_another_servers_token")
    try:
        assert [c.tool for c in fake.calls] == ["mcp:a:echo"]  # server a was given the token
        [denied] = _denials(store, outcome.session)
        assert (denied["tool"], denied["code"]) == ("mcp:b:echo", "secret")
        assert "TOKEN_A" in denied["reason"] and TOKEN_A not in denied["reason"]
    finally:
        store.close()
    assert TOKEN_A.encode() not in bundle
    assert files_containing(tmp_path, TOKEN_A.encode()) == []


async def test_a_known_secret_in_another_servers_secret_arg_is_denied_not_given_to_that_server(tmp_path: Path) -> None:
    # Redacting a secret_args field learns its value as given to that server; a value the config
    # gave to none (a provider key) or to another server must stay foreign to it all the same.
    outcome, fake, store, bundle = await _run(tmp_path, "model_passing_known_secrets_as_another_servers_secret_arg")
    try:
        assert fake.calls == []
        denied = _denials(store, outcome.session)
        assert [(d["tool"], d["code"]) for d in denied] == [("mcp:b:echo", "secret")] * 2
        assert "MODEL_KEY" in denied[0]["reason"] and "TOKEN_A" in denied[1]["reason"]
    finally:
        store.close()
    for secret in (KEY, TOKEN_A):
        assert secret.encode() not in bundle
        assert files_containing(tmp_path, secret.encode()) == []
