"""A tool's answer as the gate receives it: ``_meta`` removed, recordable, within ``max_result_bytes``.

``result_of`` turns the SDK's ``CallToolResult`` into a ``ToolResult`` with exactly ``content``
(each block without ``_meta``), ``isError`` and ``structuredContent`` when present. A result the
ledger cannot record (no RFC 8785 form: an integer of magnitude 2**53 or more, NaN or an infinity, or nesting
deeper than ``RESULT_MAX_DEPTH``) is a ``ToolCallError`` (``cause="invalid_result"``); one larger
than ``max_result_bytes`` comes back as an ``isError`` result with ``extra = {"refused":
"max_result_bytes", "result_bytes": n}`` (``too_large``; with ``"partial": true`` when the stdio
reader refused the message before it was whole, so it was longer than ``n``), which the gate
records as a ``result_too_large`` failure. Also here: the errors and the progress wrapper every
call path shares.
"""

from __future__ import annotations

import contextlib
import json
import math
from typing import Any, cast

from mcp import types
from mcp.shared.dispatcher import ProgressFnT

from truss._errors import McpError, ToolCallError
from truss.ledger.canonical import MAX_DEPTH, CanonicalError, canonical, is_plain
from truss.tools import MountedTool, ProgressFn, ToolResult

__all__ = ["RESULT_MAX_DEPTH", "closed", "result_of", "safe_progress", "too_large"]

RESULT_MAX_DEPTH = MAX_DEPTH - 8
"""The deepest a result (its wire form, the root at depth 0) may nest. A result is stored up to
six levels deeper than it arrives (its ``structuredContent`` inside a model turn's messages, a
part of it that a scripted step passes on inside that step's recorded call), and the ledger's
encoding stops at ``MAX_DEPTH``: the margin keeps every place a result is stored recordable."""


def result_of(tool: MountedTool, result: types.CallToolResult, max_result_bytes: int) -> ToolResult:
    """The gate's form of a tool's answer (see the module docstring)."""
    _refuse_non_finite(tool, result)
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
        return too_large(tool, size, max_result_bytes)
    return ToolResult(out)


def too_large(tool: MountedTool, size: int, max_result_bytes: int, *, at_least: bool = False) -> ToolResult:
    """The refused form of a result of ``size`` bytes (``at_least``: the message was refused before
    it was whole, so it was longer than that)."""
    measured = f"more than {size}" if at_least else str(size)
    text = (
        f"The result of tool {tool.tool!r} from MCP server {tool.server!r} is {measured} bytes, "
        f"over the contract's max_result_bytes of {max_result_bytes}; it was refused."
    )
    extra: dict[str, Any] = {"refused": "max_result_bytes", "result_bytes": size}
    if at_least:
        extra["partial"] = True
    return ToolResult({"content": [{"type": "text", "text": text}], "isError": True}, extra=extra)


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

    A server may answer with an integer of 2**53 or more (a 64-bit id), NaN, or nesting deeper than
    ``RESULT_MAX_DEPTH``; recording it (or the model turn that carries it on) would fail after the
    call, so it becomes a failed call (``invalid_result``) instead. ``is_plain`` is a cheap walk
    that clears almost every result; only the rest pay for a full encoding.
    """
    depth = _depth_over(out, RESULT_MAX_DEPTH)
    if depth is not None:
        raise ToolCallError(
            f"tool {tool.tool!r} of MCP server {tool.server!r} returned a result nested deeper than "
            f"{RESULT_MAX_DEPTH} levels (at {depth}), which cannot be recorded",
            remedy="Have the server return flatter results; the ledger records at most "
            f"{RESULT_MAX_DEPTH} levels of a result",
            server=tool.server,
            tool=tool.tool,
            cause="invalid_result",
        )
    if is_plain(out):
        return
    try:
        canonical(out)
    except (CanonicalError, RecursionError) as exc:
        where = f" at {exc.pointer or '/'}" if isinstance(exc, CanonicalError) else ""
        raise ToolCallError(
            f"tool {tool.tool!r} of MCP server {tool.server!r} returned a result that cannot be "
            f"recorded{where}: {type(exc).__name__}",
            remedy="The server sent a number the ledger cannot record exactly (an integer of 2**53 or more, NaN, "
            "infinite) or a lone surrogate; report it upstream",
            server=tool.server,
            tool=tool.tool,
            cause="invalid_result",
        ) from None


def _refuse_non_finite(tool: MountedTool, result: types.CallToolResult) -> None:
    """Refuse NaN and the infinities (``1e400`` parses as one) before the JSON dump turns them into null."""
    values: list[Any] = [result.structured_content]
    values += [block.model_dump(exclude_none=True) for block in result.content if block.annotations is not None]
    stack = values
    while stack:
        item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise ToolCallError(
                f"tool {tool.tool!r} of MCP server {tool.server!r} returned a result holding {item!r}, "
                "which JSON cannot carry (a number too large for a double, or NaN) and the ledger cannot record",
                remedy="Have the server send finite numbers; report it upstream",
                server=tool.server,
                tool=tool.tool,
                cause="invalid_result",
            )
        if isinstance(item, dict):
            stack.extend(cast(dict[str, Any], item).values())
        elif isinstance(item, list):
            stack.extend(cast(list[Any], item))


def _depth_over(value: Any, limit: int) -> str | None:
    """The JSON pointer of the first value deeper than ``limit`` (root: depth 0), or None."""
    stack: list[tuple[Any, int, str]] = [(value, 0, "")]
    while stack:
        item, depth, pointer = stack.pop()
        if depth > limit:
            return pointer or "/"
        if isinstance(item, dict):
            for key, child in cast(dict[str, Any], item).items():
                if isinstance(child, dict | list):
                    stack.append((cast(Any, child), depth + 1, f"{pointer}/{key}"))
                elif depth + 1 > limit:
                    return f"{pointer}/{key}"
        elif isinstance(item, list):
            for index, child in enumerate(cast(list[Any], item)):
                if isinstance(child, dict | list):
                    stack.append((cast(Any, child), depth + 1, f"{pointer}/{index}"))
                elif depth + 1 > limit:
                    return f"{pointer}/{index}"
    return None


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
