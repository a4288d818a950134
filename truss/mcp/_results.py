"""A tool's answer as the gate receives it: ``_meta`` removed, recordable, within ``max_result_bytes``.

``result_of`` turns the SDK's ``CallToolResult`` into a ``ToolResult`` with exactly ``content``
(each block without ``_meta``), ``isError`` and ``structuredContent`` when present. A result the
ledger cannot record (no RFC 8785 form: an integer beyond 2**53, nesting past the encoder's limit)
is a ``ToolCallError`` (``cause="invalid_result"``); one larger than ``max_result_bytes`` comes
back as an ``isError`` result with ``extra = {"refused": "max_result_bytes", "result_bytes": n}``,
which the gate records as a ``result_too_large`` failure. Also here: the errors and the progress
wrapper every call path shares.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any, cast

from mcp import types
from mcp.shared.dispatcher import ProgressFnT

from truss._errors import McpError, ToolCallError
from truss.ledger.canonical import CanonicalError, canonical, is_plain
from truss.tools import MountedTool, ProgressFn, ToolResult

__all__ = ["closed", "result_of", "safe_progress"]


def result_of(tool: MountedTool, result: types.CallToolResult, max_result_bytes: int) -> ToolResult:
    """The gate's form of a tool's answer (see the module docstring)."""
    wire = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    content: list[Any] = []
    blocks: list[Any] = wire.get("content") or []
    for block in blocks:
        if isinstance(block, dict):
            typed = cast(dict[str, Any], block)
            content.append({k: v for k, v in typed.items() if k != "_meta"})
    out: dict[str, Any] = {"content": content, "isError": bool(wire.get("isError", False))}
    if "structuredContent" in wire:
        out["structuredContent"] = wire["structuredContent"]
    _check_recordable(tool, out)
    if _text_only_bound(content) <= max_result_bytes and "structuredContent" not in out:
        return ToolResult(out)
    try:
        # The compact JSON form has the length of the canonical bytes for everything a result
        # holds but unusual number spellings, and costs a fraction of canonicalising a large text.
        size = len(json.dumps(out, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode())
    except (ValueError, TypeError, UnicodeEncodeError) as exc:
        raise ToolCallError(
            f"tool {tool.tool!r} of MCP server {tool.server!r} returned a result that cannot be "
            f"canonicalised ({type(exc).__name__})",
            server=tool.server,
            tool=tool.tool,
            cause="invalid_result",
        ) from None
    if size > max_result_bytes:
        text = (
            f"The result of tool {tool.tool!r} from MCP server {tool.server!r} is {size} bytes, "
            f"over the contract's max_result_bytes of {max_result_bytes}; it was refused."
        )
        return ToolResult(
            {"content": [{"type": "text", "text": text}], "isError": True},
            extra={"refused": "max_result_bytes", "result_bytes": size},
        )
    return ToolResult(out)


def _text_only_bound(content: list[Any]) -> int:
    """An upper bound of the JSON size of text-only content (any other block: unbounded).

    A JSON string takes at most 6 bytes per character (a ``\\u00XX`` escape), so small text
    results skip measuring, which is most of the tier's cost on a small call.
    """
    total = 64
    for block in content:
        if not isinstance(block, dict):
            return 1 << 62
        typed = cast(dict[str, Any], block)
        text = typed.get("text")
        if set(typed) - {"type", "text"} or not isinstance(text, str):
            return 1 << 62
        total += 6 * len(text) + 32
    return total


def _check_recordable(tool: MountedTool, out: dict[str, Any]) -> None:
    """Refuse a result the ledger cannot record: valid JSON that RFC 8785 has no form for.

    A server may answer with an integer beyond 2**53 (a 64-bit id), or nesting deeper than the
    canonical encoder's limit; recording it would fail after the call, so it becomes a failed
    call (``invalid_result``) instead. ``is_plain`` is a cheap walk that clears almost every
    result; only the rest pay for a full encoding.
    """
    if is_plain(out):
        return
    try:
        canonical(out)
    except (CanonicalError, RecursionError) as exc:
        where = f" at {exc.pointer or '/'}" if isinstance(exc, CanonicalError) else ""
        raise ToolCallError(
            f"tool {tool.tool!r} of MCP server {tool.server!r} returned a result that cannot be "
            f"recorded{where}: {type(exc).__name__}",
            server=tool.server,
            tool=tool.tool,
            cause="invalid_result",
        ) from None


def closed(server: str, tool: str, cause: McpError | None = None) -> ToolCallError:
    """The error of a call to a server that is no longer connected."""
    why = f": {cause.message}" if cause is not None else ""
    return ToolCallError(
        f"MCP server {server!r} is no longer connected, so tool {tool!r} cannot be called{why}",
        remedy="The server exited or its transport failed; its stderr log says why",
        server=server,
        tool=tool,
        cause="connection_closed",
    )


def safe_progress(sink: ProgressFn) -> ProgressFnT:
    """``sink`` for the SDK: progress is advisory, so a failing display never fails the call."""

    async def report(progress: float, total: float | None, message: str | None) -> None:
        with contextlib.suppress(Exception):
            await sink(progress, total, message)

    return report
