"""2026-07-28 rules the client tier keeps: tools with an invalid ``x-mcp-header`` are refused, and a result
without ``resultType`` is complete (SEP-2243, SEP-2322)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import types
from mcp.server import Server, ServerRequestContext

from tests.mcp._util import contract_of, http_server
from truss._clock import SystemClock
from truss._errors import ServerStartError
from truss.mcp.client import connect

pytestmark = pytest.mark.anyio

CLOCK = SystemClock()

TOOLS = [
    types.Tool(
        name="lookup",
        input_schema={"type": "object", "properties": {"region": {"type": "string", "x-mcp-header": "Region"}}},
    ),
    types.Tool(
        name="object_header",  # x-mcp-header only on primitives
        input_schema={"type": "object", "properties": {"data": {"type": "object", "x-mcp-header": "Data"}}},
    ),
    types.Tool(
        name="duplicate_header",  # unique, case-insensitively
        input_schema={
            "type": "object",
            "properties": {
                "a": {"type": "string", "x-mcp-header": "Zone"},
                "b": {"type": "string", "x-mcp-header": "zone"},
            },
        },
    ),
]


def _server() -> Server[Any]:
    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=TOOLS)

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        return types.CallToolResult(content=[types.TextContent(type="text", text=f"called {params.name}")])

    return Server("headers", on_list_tools=list_tools, on_call_tool=call_tool)


def _contract(allow: list[str]) -> Any:
    return contract_of({"name": "srv", "command": "unused-in-process", "allow_tools": allow})


async def test_tools_with_an_invalid_x_mcp_header_are_filtered_with_the_reason_and_never_mounted(
    tmp_path: Path,
) -> None:
    with anyio.fail_after(20):
        async with connect(_contract(["*"]), log_dir=tmp_path, clock=CLOCK, inprocess={"srv": _server()}) as m:
            status = m.servers["srv"]
            assert status.protocol_version == "2026-07-28"
            assert set(m.tools) == {"mcp:srv:lookup"}
            result = await m.call(m.tools["mcp:srv:lookup"], {"region": "eu"}, timeout_s=5)
    assert result.text == "called lookup"
    assert status.filtered == {"object_header": "invalid_x_mcp_header", "duplicate_header": "invalid_x_mcp_header"}
    shown = {t.name: (t.mounted, t.pin) for t in status.tools}
    assert shown["object_header"][0] is False and shown["object_header"][1].startswith("sha256:")


async def test_naming_a_tool_with_an_invalid_x_mcp_header_in_allow_tools_is_a_start_error(tmp_path: Path) -> None:
    with anyio.fail_after(20), pytest.raises(ServerStartError) as info:
        async with connect(_contract(["lookup", "object_header"]), log_dir=tmp_path, clock=CLOCK,
                           inprocess={"srv": _server()}):  # fmt: skip
            pass
    assert (info.value.server, info.value.tool, info.value.cause) == ("srv", "object_header", "invalid_x_mcp_header")


async def test_a_2026_result_without_result_type_is_read_as_complete(tmp_path: Path, bad_http: str) -> None:
    contract = contract_of(http_server(f"{bad_http}/bare-result/mcp"))
    with anyio.fail_after(20):
        async with connect(contract, log_dir=tmp_path, clock=CLOCK) as m:
            assert m.servers["web"].protocol_version == "2026-07-28"
            result = await m.call(m.tools["mcp:web:echo"], {}, timeout_s=5)
    assert (result.text, result.is_error) == ("no resultType here", False)


async def test_relisting_a_server_that_refuses_new_tool_names_each_time_keeps_the_latest_refusals_only(
    tmp_path: Path,
) -> None:
    # Regression: each listing's refused tools (an invalid x-mcp-header) were added to the
    # connection's refusals and never dropped, so a server listing new refused names on every
    # change grew them for the whole run.
    listings = [0]

    async def list_tools(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        listings[0] += 1
        bad = {"type": "object", "properties": {"data": {"type": "object", "x-mcp-header": "Data"}}}
        fresh = [types.Tool(name=f"bad{listings[0]}_{n}", input_schema=bad) for n in range(50)]
        return types.ListToolsResult(tools=[TOOLS[0], *fresh])

    async def call_tool(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> types.CallToolResult:
        return types.CallToolResult(content=[types.TextContent(type="text", text=f"called {params.name}")])

    server = Server("fresh-refusals", on_list_tools=list_tools, on_call_tool=call_tool)
    with anyio.fail_after(20):
        async with connect(_contract(["lookup"]), log_dir=tmp_path, clock=CLOCK, inprocess={"srv": server}) as m:
            for _ in range(5):
                await m.relist("srv")
            refused = set(m._lives["srv"].refused)  # pyright: ignore[reportPrivateUsage]
            result = await m.call(m.tools["mcp:srv:lookup"], {"region": "eu"}, timeout_s=5)
    assert result.text == "called lookup"
    assert refused == {f"bad{listings[0]}_{n}" for n in range(50)}, len(refused)
