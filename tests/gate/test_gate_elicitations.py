"""What the gate records of the elicitations the MCP tier answered during a call (docs/ledger-format.md).

The transport hands them over as ``extra["elicitations"]`` on a result, or as the field of that name
on a ``ToolCallError``; either way they land in the call's ``mcp_tool_call`` entry, with the request
and the content as payloads that known secret values are scrubbed from.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.gate.support import contract_from, make_gate, new_store, steps
from truss._errors import ToolCallError
from truss.contract import Elicitation
from truss.elicitation import CallElicitations, Elicited, answer, declined
from truss.gate import CallRequest
from truss.ledger.stores import LedgerStore
from truss.testing import FakeTransport, mounted_tool, text_result
from truss.tools import MountedTool, ToolResult

pytestmark = pytest.mark.anyio

CONTRACT = """
[contract]
name = "elicitations"
intent = "record what the server asked"
[[mcp.servers]]
name = "srv"
transport = "http"
url = "https://srv.example.test/mcp"
headers = { Authorization = { secret_env = "SRV_TOKEN", format = "Bearer {}" } }
allow_tools = ["ask"]
[mcp.servers.elicitation]
action = "accept"
"""
TOKEN = "tok-0123456789-secret"
SCHEMA = {"type": "object", "properties": {"who": {"type": "string", "default": f"owner of {TOKEN}"}}}


def _asked(count: int = 1) -> CallElicitations:
    collected = CallElicitations()
    policy = Elicitation(action="accept")
    for _ in range(count):
        got = answer(policy, mode="form", message=f"Confirm for {TOKEN}?", requested_schema=SCHEMA)
        collected.add(Elicited("form", f"Confirm for {TOKEN}?", SCHEMA, None, got, calls_in_flight=2))
    collected.add(Elicited("url", "Open it", None, "sha256:" + "0" * 64, declined("url_mode", "never")))
    return collected


async def _call(tmp_path: Path, handler: Any) -> tuple[LedgerStore, dict[str, Any]]:
    store, _ = new_store(tmp_path)
    transport = FakeTransport(handler, tools=[mounted_tool("srv", "ask")])
    gate = make_gate(contract_from(CONTRACT), store, transport, environ={"SRV_TOKEN": TOKEN})
    await gate.call(CallRequest(call="c1.0", tool="mcp:srv:ask", arguments={}, turn=1))
    return store, steps(store)[-1].body


def _payload(store: LedgerStore, ref: str) -> Any:
    data = store.blob(ref)
    assert data is not None and TOKEN.encode() not in data
    return json.loads(data)


async def test_elicitations_of_a_call_are_recorded_in_its_entry_with_scrubbed_payloads(tmp_path: Path) -> None:
    async def handler(tool: MountedTool, arguments: Mapping[str, Any]) -> ToolResult:
        return ToolResult(text_result("done").wire, {"elicitations": _asked()})

    store, body = await _call(tmp_path, handler)
    form, url = body["elicitations"]
    assert (form["mode"], form["action"], form["reason"], form["calls_in_flight"]) == ("form", "accept", "accepted", 2)
    assert _payload(store, form["request"])["message"] == "Confirm for [redacted]?"
    assert _payload(store, form["content"]) == {"who": "owner of [redacted]"}
    assert (url["mode"], url["action"], url["reason"]) == ("url", "decline", "url_mode")
    assert "content" not in url and "calls_in_flight" not in url
    assert "elicitations_unrecorded" not in body


async def test_elicitations_of_a_call_that_failed_below_the_tool_are_recorded_with_the_failure(
    tmp_path: Path,
) -> None:
    async def handler(tool: MountedTool, arguments: Mapping[str, Any]) -> ToolResult:
        raise ToolCallError("the server hung up", server="srv", tool="ask", cause="connection_closed",
                            elicitations=_asked(40))  # fmt: skip

    _, body = await _call(tmp_path, handler)
    assert body["failure"]["cause"] == "connection_closed"
    assert len(body["elicitations"]) == 32
    assert body["elicitations_unrecorded"] == 9
