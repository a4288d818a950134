"""A tool transport driven by a plain handler, for tests of the gate, the loop and code built on them.

``FakeTransport(handler)`` implements ``truss.tools.ToolTransport``: each call awaits
``handler(tool, arguments)``, which returns a ``ToolResult`` or a wire-form dict (``content``,
``structuredContent``, ``isError``) or raises a Truss error (``ToolCallError`` ...). The
transport records every call, enforces ``max_result_bytes`` the way the real MCP tier does (an
``isError`` result with ``extra["refused"]``, which the gate records as a ``result_too_large``
failure), and
honours ``timeout_s`` (a handler that does not finish in time raises ``ToolCallError`` with
``cause="timeout"``). ``mounted_tool`` and ``mounted_tools`` build ``MountedTool`` values with
real pins.

It does not speak MCP and does not import the ``mcp`` SDK.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import anyio

from truss._errors import ToolCallError
from truss.ledger.canonical import canonical
from truss.tools import MountedTool, ProgressFn, ToolResult, pin_of

__all__ = ["FakeCall", "FakeTransport", "Handler", "mounted_tool", "mounted_tools", "text_result"]

Handler = Callable[[MountedTool, Mapping[str, Any]], Awaitable[ToolResult | Mapping[str, Any]]]


def mounted_tool(
    server: str,
    tool: str,
    *,
    description: str = "",
    input_schema: Mapping[str, Any] | None = None,
    output_schema: Mapping[str, Any] | None = None,
    annotations: Mapping[str, Any] | None = None,
    title: str | None = None,
) -> MountedTool:
    """A ``MountedTool`` whose pin is computed from its definition, as the MCP tier does."""
    definition: dict[str, Any] = {"name": tool, "inputSchema": dict(input_schema or {"type": "object"})}
    if title is not None:
        definition["title"] = title
    if description:
        definition["description"] = description
    if output_schema is not None:
        definition["outputSchema"] = dict(output_schema)
    if annotations is not None:
        definition["annotations"] = dict(annotations)
    return MountedTool(server=server, tool=tool, definition=definition, pin=pin_of(definition))


def mounted_tools(*tools: MountedTool) -> dict[str, MountedTool]:
    """Namespaced name -> tool, the shape of ``Mounts.tools``."""
    return {t.name: t for t in tools}


def text_result(text: str, *, is_error: bool = False, structured: Any = None) -> ToolResult:
    """A result with one text block (and ``structuredContent`` when given)."""
    wire: dict[str, Any] = {"content": [{"type": "text", "text": text}], "isError": is_error}
    if structured is not None:
        wire["structuredContent"] = structured
    return ToolResult(wire)


@dataclass(frozen=True)
class FakeCall:
    """One call the transport received."""

    tool: str  # namespaced
    arguments: Mapping[str, Any]
    timeout_s: float


class FakeTransport:
    """``ToolTransport`` over a handler; ``calls`` lists what it was asked, in order."""

    def __init__(
        self, handler: Handler, *, max_result_bytes: int = 1_048_576, tools: Iterable[MountedTool] = ()
    ) -> None:
        self._handler = handler
        self._max_result_bytes = max_result_bytes
        self.calls: list[FakeCall] = []
        self.tools: dict[str, MountedTool] = {t.name: t for t in tools}
        self.by_provider_name: dict[str, str] = {t.provider_name: t.name for t in self.tools.values()}

    def pins(self) -> dict[str, str]:
        return {name: tool.pin for name, tool in sorted(self.tools.items())}

    async def call(
        self,
        tool: MountedTool,
        arguments: Mapping[str, Any],
        *,
        timeout_s: float,
        progress: ProgressFn | None = None,
    ) -> ToolResult:
        self.calls.append(FakeCall(tool.name, dict(arguments), timeout_s))
        answer: ToolResult | Mapping[str, Any] | None = None
        with anyio.move_on_after(timeout_s):
            answer = await self._handler(tool, arguments)
        if answer is None:
            raise ToolCallError(
                f"calling tool {tool.tool!r} on MCP server {tool.server!r} failed: no answer within {timeout_s} s",
                retryable=True,
                server=tool.server,
                tool=tool.tool,
                cause="timeout",
            )
        result = answer if isinstance(answer, ToolResult) else ToolResult(dict(answer))
        wire = {k: v for k, v in result.wire.items() if k != "_meta"}
        size = len(canonical(wire))
        if size > self._max_result_bytes:
            text = (
                f"The result of tool {tool.tool!r} from MCP server {tool.server!r} is {size} bytes, "
                f"over the contract's max_result_bytes of {self._max_result_bytes}; it was refused."
            )
            return ToolResult(
                {"content": [{"type": "text", "text": text}], "isError": True},
                extra={"refused": "max_result_bytes", "result_bytes": size},
            )
        return ToolResult(wire, extra=result.extra)
