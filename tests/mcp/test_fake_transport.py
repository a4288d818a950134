"""``truss.testing.FakeTransport``: a handler-driven ToolTransport with the real tier's limits."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import anyio
import pytest

from truss._errors import ToolCallError
from truss.testing import FakeTransport, mounted_tool, mounted_tools, text_result
from truss.tools import MountedTool, ToolResult, pin_of

pytestmark = pytest.mark.anyio

ECHO = mounted_tool("srv", "echo", description="Echo.", annotations={"readOnlyHint": True})


async def echo_handler(tool: MountedTool, arguments: Mapping[str, Any]) -> ToolResult:
    return text_result(str(arguments.get("text", "")))


async def test_calls_reach_the_handler_and_are_recorded() -> None:
    transport = FakeTransport(echo_handler, tools=[ECHO])
    result = await transport.call(ECHO, {"text": "hi"}, timeout_s=1)
    assert result.text == "hi"
    assert [(c.tool, dict(c.arguments)) for c in transport.calls] == [("mcp:srv:echo", {"text": "hi"})]
    assert transport.pins() == {"mcp:srv:echo": ECHO.pin}
    assert transport.by_provider_name == {"mcp__srv__echo": "mcp:srv:echo"}


async def test_dict_answers_lose_their_meta() -> None:
    async def handler(tool: MountedTool, arguments: Mapping[str, Any]) -> Mapping[str, Any]:
        return {"content": [], "isError": False, "_meta": {"stamp": 1}}

    result = await FakeTransport(handler).call(ECHO, {}, timeout_s=1)
    assert result.wire == {"content": [], "isError": False}


async def test_results_over_the_limit_become_error_results() -> None:
    async def handler(tool: MountedTool, arguments: Mapping[str, Any]) -> ToolResult:
        return text_result("z" * 500)

    result = await FakeTransport(handler, max_result_bytes=100).call(ECHO, {}, timeout_s=1)
    assert result.is_error and result.extra["refused"] == "max_result_bytes"


async def test_a_handler_that_outlives_the_timeout_is_a_timeout_error() -> None:
    async def handler(tool: MountedTool, arguments: Mapping[str, Any]) -> ToolResult:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    with anyio.fail_after(5), pytest.raises(ToolCallError) as info:
        await FakeTransport(handler).call(ECHO, {}, timeout_s=0.05)
    assert (info.value.server, info.value.tool, info.value.cause) == ("srv", "echo", "timeout")


def test_mounted_tools_have_real_pins() -> None:
    tools = mounted_tools(ECHO, mounted_tool("srv", "other"))
    assert sorted(tools) == ["mcp:srv:echo", "mcp:srv:other"]
    assert ECHO.pin == pin_of(ECHO.definition)
    assert ECHO.read_only
