"""A server's elicitation requests during a call: answered by the contract's policy and recorded.

Real servers only: server-everything over stdio asks on the 2025-11-25 handshake era (a
server-to-client ``elicitation/create`` that arrives on the session's own task), an in-process SDK
2.x server asks on 2026-07-28 (an ``input_required`` result the SDK resolves inside the calling
task). Whole runs go through ``run_contract`` and are read back from the ledger.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Annotated, Any

import anyio
import pytest
from mcp import types
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.resolve import Elicit, Resolve
from pydantic import BaseModel

from tests.conftest import node_peer
from tests.gate.support import contract_from, new_store
from truss._clock import SystemClock
from truss._errors import ToolNotAdvertisedError
from truss.contract import Server
from truss.elicitation import CallElicitations
from truss.ledger.entry import StoredEntry
from truss.ledger.stores import LedgerStore
from truss.mcp._connection import Live
from truss.mcp.client import connect
from truss.runtime import Runtime
from truss.session import run_contract

pytestmark = pytest.mark.anyio

CLOCK = SystemClock()


def _everything_contract(tool: str, arguments: str, elicitation: str | None) -> str:
    node, script = node_peer("server-everything")
    return f"""
[contract]
name = "elicited"
intent = "let the server ask"
[[agent.steps]]
tool = "mcp:everything:{tool}"
arguments = {arguments}
[[mcp.servers]]
name = "everything"
command = {json.dumps(node)}
args = [{json.dumps(script)}, "stdio"]
allow_tools = ["{tool}"]
connect_timeout = "30s"
{elicitation or ""}
[[done.checks]]
kind = "tool_succeeded"
tool = "mcp:everything:{tool}"
"""


def _calls(store: LedgerStore, session: str) -> list[StoredEntry]:
    return [e for e in store.read_session(session) if e.kind == "mcp_tool_call"]


def _blob(store: LedgerStore, ref: str) -> Any:
    data = store.blob(ref)
    assert data is not None
    return json.loads(data)


async def _run(tmp_path: Path, text: str, status: str = "pass", **connect_options: Any) -> tuple[LedgerStore, str]:
    store, key = new_store(tmp_path)
    connector = functools.partial(connect, **connect_options) if connect_options else connect
    with anyio.fail_after(90):
        runtime = Runtime(store, clock=CLOCK, home=tmp_path, key=key, environ={}, connector=connector)
        outcome = await run_contract(runtime, contract_from(text), session_id="s1")
    assert outcome.status == status, outcome
    return store, "s1"


async def test_a_form_request_from_a_handshake_era_server_is_accepted_with_contract_values_and_defaults(
    tmp_path: Path,
) -> None:
    policy = '[mcp.servers.elicitation]\naction = "accept"\ncontent = { name = "Ada Lovelace", check = true }'
    store, session = await _run(tmp_path, _everything_contract("trigger-elicitation-request", "{}", policy))
    [call] = _calls(store, session)
    result = _blob(store, call.body["result"])
    assert "Name: Ada Lovelace" in result["content"][1]["text"]
    [record] = call.body["elicitations"]
    assert (record["mode"], record["action"], record["reason"]) == ("form", "accept", "accepted")
    assert "calls_in_flight" not in record
    request = _blob(store, record["request"])
    assert request["message"] == "Please provide inputs for the following fields:"
    assert request["requestedSchema"]["required"] == ["name"]
    content = _blob(store, record["content"])
    assert content == {
        "name": "Ada Lovelace",
        "check": True,
        "firstLine": "It was a dark and stormy night.",
        "integer": 42,
        "number": 3.14,
        "untitledSingleSelectEnum": "Monica",
        "untitledMultipleSelectEnum": ["Guitar"],
        "titledSingleSelectEnum": "hero-1",
        "titledMultipleSelectEnum": ["fish-1"],
        "legacyTitledEnum": "pet-1",
    }


async def test_a_server_is_not_offered_elicitation_without_the_contract_table(tmp_path: Path) -> None:
    # server-everything registers its eliciting tool only for clients that declare the capability.
    contract = contract_from(_everything_contract("trigger-elicitation-request", "{}", None))
    with anyio.fail_after(60), pytest.raises(ToolNotAdvertisedError) as info:
        async with connect(contract, log_dir=tmp_path, clock=CLOCK):
            pass
    assert info.value.missing == ["trigger-elicitation-request"]


async def test_a_url_mode_request_is_declined_and_recorded_without_its_url(tmp_path: Path) -> None:
    url = "https://consent.example.test/start?one_time=opensesame42"
    policy = '[mcp.servers.elicitation]\naction = "accept"'
    store, session = await _run(
        tmp_path, _everything_contract("trigger-url-elicitation", f"{{ url = {json.dumps(url)} }}", policy)
    )
    [call] = _calls(store, session)
    [record] = call.body["elicitations"]
    assert (record["mode"], record["action"], record["reason"]) == ("url", "decline", "url_mode")
    assert "content" not in record
    request = store.blob(record["request"])
    assert request is not None and b"opensesame42" not in request
    assert json.loads(request)["url"].startswith("sha256:")


class Confirm(BaseModel):
    confirmed: bool = False
    reason: str = "none given"


async def ask(ctx: Context) -> Elicit[Confirm]:
    return Elicit("Delete /srv/x?", Confirm)


def _modern_server() -> MCPServer:
    app = MCPServer("eliciting")

    @app.tool()
    async def delete(path: str, answer: Annotated[object, Resolve(ask)]) -> str:
        """Delete after asking."""
        return f"{path}: {answer!r}"

    return app


_MODERN = """
[contract]
name = "modern-elicited"
intent = "let the server ask"
[[agent.steps]]
tool = "mcp:srv:delete"
arguments = {{ path = "/srv/x" }}
[[mcp.servers]]
name = "srv"
command = "unused-in-process"
allow_tools = ["delete"]
[mcp.servers.elicitation]
{policy}
[[done.checks]]
kind = "tool_succeeded"
tool = "mcp:srv:delete"
"""


ACCEPTED = {"confirmed": True, "reason": "none given"}


@pytest.mark.parametrize(
    ("policy", "action", "reason", "content", "status"),
    [
        ('action = "accept"\ncontent = { confirmed = true }', "accept", "accepted", ACCEPTED, "pass"),
        # the server's tool fails when it is not answered: the run's verdict says so, the record stays
        ('action = "decline"', "decline", "policy", None, "fail"),
    ],
)
async def test_an_input_required_request_of_the_2026_era_is_answered_by_policy_and_recorded(
    tmp_path: Path, policy: str, action: str, reason: str, content: dict[str, Any] | None, status: str
) -> None:
    text = _MODERN.format(policy=policy)
    store, session = await _run(tmp_path, text, status, inprocess={"srv": _modern_server()})
    started = next(iter(store.read_session(session)))
    assert started.body["servers"]["srv"]["protocol_version"] == "2026-07-28"
    [call] = _calls(store, session)
    [record] = call.body["elicitations"]
    assert (record["action"], record["reason"]) == (action, reason)
    assert _blob(store, record["request"])["message"] == "Delete /srv/x?"
    if content is None:
        assert "content" not in record
    else:
        assert _blob(store, record["content"]) == content
        assert "confirmed=True" in _blob(store, call.body["result"])["content"][0]["text"]


def _live(policy: str | None) -> Live:
    settings: dict[str, Any] = {"name": "srv", "command": "x", "allow_tools": ["*"]}
    if policy is not None:
        settings["elicitation"] = {"action": policy}
    return Live(Server.model_validate(settings))


_NO_CONTEXT: Any = None  # Live.on_elicit does not read the SDK's request context
_PARAMS = types.ElicitRequestFormParams(
    message="Go on?", requested_schema={"type": "object", "properties": {"go": {"type": "boolean", "default": True}}}
)


async def test_a_request_that_says_no_call_is_recorded_by_every_call_in_flight_on_the_server() -> None:
    live = _live("accept")
    first, second = CallElicitations(), CallElicitations()
    live.inflight.update({1: first, 2: second})
    answered = await live.on_elicit(_NO_CONTEXT, _PARAMS)
    assert isinstance(answered, types.ElicitResult) and answered.action == "accept"
    assert [r.calls_in_flight for r in first.records] == [2]
    assert first.records == second.records


async def test_a_request_while_no_call_is_in_flight_is_declined_and_reported() -> None:
    live = _live("accept")
    reported: list[tuple[str, dict[str, Any]]] = []
    live.report = lambda name, attributes: reported.append((name, dict(attributes)))
    answered = await live.on_elicit(_NO_CONTEXT, _PARAMS)
    assert isinstance(answered, types.ElicitResult) and answered.action == "decline"
    assert reported == [("elicitation_declined", {"reason": "no_call", "mode": "form"})]
