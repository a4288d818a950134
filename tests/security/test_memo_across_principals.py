"""Attack: one serve-mcp principal receives a result memoized from another principal's session.

Principals see only their own sessions (docs/serve-mcp.md). The cross-run memo must not become
a side door: a memo hit would hand tenant B the result recorded in tenant A's session and name
A's session in B's ledger (``replayed_from``). A memo answers only calls of the same principal
(sessions run outside serve-mcp, with no principal, share among themselves as before)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.gate.support import contract_from, fake_connector, new_store, scripted
from truss.runtime import Runtime
from truss.session import run_contract
from truss.testing import FakeTransport, ManualClock, mounted_tool, text_result
from truss.tools import MountedTool, ToolResult

pytestmark = pytest.mark.anyio

CONTRACT = """
[contract]
name = "memo"
intent = "look once"
[[agent.steps]]
tool = "mcp:kv:get"
arguments = { key = "a" }
[[mcp.servers]]
name = "kv"
command = "kv-server"
allow_tools = ["get"]
[[mcp.servers.tools]]
name = "get"
memo = "1h"
"""

TENANT_A = {"tenant": "acme", "user": "alice"}
TENANT_B = {"tenant": "globex", "user": "bob"}


async def test_a_memoized_result_is_not_replayed_to_another_principal(tmp_path: Path) -> None:
    async def handler(tool: MountedTool, arguments: Mapping[str, Any]) -> ToolResult:
        return text_result(f"value of {arguments['key']}")

    transport = FakeTransport(handler, tools=[mounted_tool("kv", "get")])
    store, key = new_store(tmp_path)
    clock = ManualClock()

    async def run(session: str, principal: dict[str, str] | None) -> None:
        await run_contract(
            Runtime(
                store=store,
                key=key,
                clock=clock,
                home=tmp_path,
                environ={},
                connector=fake_connector(transport),
                provider=scripted(),
            ),
            contract_from(CONTRACT),
            session_id=session,
            principal=principal,
        )

    await run("a1", TENANT_A)
    await run("b1", TENANT_B)
    assert len(transport.calls) == 2  # B's call went to the server
    memo_refs = [e.body.get("replayed_from") for e in store.read_session("b1") if e.kind == "mcp_tool_call"]
    assert memo_refs == [None]

    await run("a2", TENANT_A)  # the same principal again: still a hit
    assert len(transport.calls) == 2
    [hit] = [e for e in store.read_session("a2") if e.kind == "mcp_tool_call"]
    assert hit.body["replayed_from"]["session"] == "a1"

    await run("n1", None)  # no principal (truss run) is a principal of its own
    assert len(transport.calls) == 3
