"""Properties of the gate over generated batches of concurrent calls.

Whatever mix of calls arrives at once (allowed, denied by policy, needing approval, unmounted,
with unparsable arguments) and whatever the budget:

- no more calls reach the server than the budget allows, and none that policy denies, that waits
  for approval or that is not mounted;
- every call leaves exactly one outcome entry (``mcp_tool_call``, ``mcp_tool_denied`` or
  ``approval_requested``), and every ``mcp_tool_call`` follows its own intent;
- what reached the server is exactly what was recorded as called.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.gate.support import contract_from, make_gate, new_store, steps
from truss.gate import CallRequest
from truss.testing import FakeTransport, mounted_tool, text_result
from truss.tools import MountedTool, ToolResult

TEXT = """
[contract]
name = "gate-properties"
intent = "properties"
[budget]
max_tool_calls = {budget}
[policy]
default = "allow"
[[policy.rules]]
tool = "mcp:srv:drop"
effect = "deny"
reason = "never"
[[policy.rules]]
tool = "mcp:srv:write"
effect = "ask"
reason = "a person decides"
[[mcp.servers]]
name = "srv"
command = "unused"
allow_tools = ["read", "write", "drop"]
"""

KINDS = ["read", "write", "drop", "ghost", "garbage"]


def request(i: int, kind: str) -> CallRequest:
    if kind == "garbage":
        return CallRequest(f"c1.{i}", "mcp:srv:read", None, 1, raw_arguments="{nope")
    return CallRequest(f"c1.{i}", f"mcp:srv:{kind}", {"n": i}, 1)


async def drive(kinds: list[str], budget: int) -> tuple[list[str], list[Any]]:
    reached: list[str] = []

    async def handler(tool: MountedTool, arguments: Mapping[str, Any]) -> ToolResult:
        reached.append(tool.tool)
        await anyio.lowlevel.checkpoint()
        return text_result("ok")

    tools = [mounted_tool("srv", name, input_schema={"type": "object"}) for name in ("read", "write", "drop")]
    fake = FakeTransport(handler, tools=tools)
    with tempfile.TemporaryDirectory() as tmp:
        store, _ = new_store(Path(tmp))
        gate = make_gate(contract_from(TEXT.format(budget=budget)), store, fake)
        with anyio.fail_after(20):
            async with anyio.create_task_group() as group:
                for i, kind in enumerate(kinds):
                    group.start_soon(gate.call, request(i, kind))
        recorded = steps(store)
        store.close()
    return reached, recorded


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kinds=st.lists(st.sampled_from(KINDS), min_size=1, max_size=24), budget=st.integers(0, 12))
def test_concurrent_calls_never_overspend_and_each_leaves_exactly_one_outcome(kinds: list[str], budget: int) -> None:
    reached, recorded = anyio.run(drive, kinds, budget)
    assert len(reached) <= budget
    assert set(reached) <= {"read"}
    assert len(reached) == min(budget, kinds.count("read"))
    outcomes = Counter(e.body["call"] for e in recorded if e.kind != "mcp_tool_intent")
    assert outcomes == Counter(f"c1.{i}" for i in range(len(kinds)))
    intents = {e.body["call"]: e.seq for e in recorded if e.kind == "mcp_tool_intent"}
    calls = [e for e in recorded if e.kind == "mcp_tool_call"]
    assert len(calls) == len(reached)
    assert all(intents[e.body["call"]] == e.body["intent"] < e.seq for e in calls)
    asked = [e for e in recorded if e.kind == "approval_requested"]
    assert len(asked) == kinds.count("write")
