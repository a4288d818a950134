"""Listing, pinning and mounting one server's tools (DESIGN 3.2-3.4).

``list_all`` follows ``tools/list`` pagination (at most 1,000 pages and ``MAX_MESSAGE_BYTES`` in
all), and leaves the SDK session's per-tool state holding the tools of the whole listing only.

``mount`` keeps the allowlisted tools: each one's pin is the hash of its definition; a contract
``pin`` that differs is refused before any call; an allowlisted name the server does not advertise,
a name advertised twice, an invalid or unpinnable allowlisted tool are start errors; under
``allow_tools = ["*"]`` the invalid and unpinnable ones are filtered instead (with the reason). A
tool the SDK dropped from a 2026-07-28 listing for an invalid ``x-mcp-header`` (``refused``: name
-> (reason, pin)) is filtered as ``invalid_x_mcp_header`` under ``"*"``, and a start error when
``allow_tools`` names it. It also notes which mounted tools declare ``execution.taskSupport``
(``truss.mcp._tasks`` decides which of them run as tasks) and fills in the server's
``ServerStatus``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mcp import Client, types

from truss._errors import PinMismatchError, ServerStartError, ToolNotAdvertisedError
from truss._suggest import did_you_mean
from truss.contract import Server
from truss.ledger.canonical import CanonicalError
from truss.mcp._status import ServerStatus, ToolStatus, tool_definition
from truss.mcp._wire import MAX_MESSAGE_BYTES
from truss.pins import changes, summary
from truss.tools import MountedTool, pin_of

__all__ = ["TOOL_NAME_RE", "UNPINNABLE", "Mounted", "list_all", "mount", "pin_or_none"]

# SEP-986: what a tool name may be. Anything else (spaces, unicode, ':' or '/') is never mounted.
TOOL_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,128}\Z")
UNPINNABLE = "unpinnable"
_MAX_LIST_PAGES = 1000
_MAX_NAMES_IN_ERROR = 30


async def list_all(client: Client) -> list[types.Tool]:
    tools: list[types.Tool] = []
    cursor: str | None = None
    size = 0
    for pages in range(1, _MAX_LIST_PAGES + 1):
        page = await client.list_tools(cursor=cursor)
        size += len(page.model_dump_json(by_alias=True, exclude_none=True))
        if size > MAX_MESSAGE_BYTES:
            raise ServerStartError(
                f"tools/list was over {MAX_MESSAGE_BYTES} bytes after {pages} pages",
                remedy="The server lists more than one message may hold; report it upstream",
                cause="protocol_error",
            )
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            if pages > 1:
                # The session keeps per-tool state (output schemas, header maps) from every page and
                # prunes it to a listing only after a one-page one: a server listing new names in
                # pages on every change would grow it for the whole run. The pages make one listing.
                whole = types.ListToolsResult(tools=list(tools))
                client.session._absorb_tool_listing(whole, complete=True)  # pyright: ignore[reportPrivateUsage]
            return tools
    raise ServerStartError(
        f"tools/list did not end after {_MAX_LIST_PAGES} pages",
        remedy="The server's pagination never ends; report it upstream",
        cause="protocol_error",
    )


def _pin_mismatch(
    server: str,
    tool: str,
    *,
    expected: str,
    actual: str,
    definition: Mapping[str, Any],
    known: Callable[[str], Mapping[str, Any] | None] | None,
) -> PinMismatchError:
    """The mismatch, with what changed when the pinned definition is known (``truss.pins``)."""
    old = known(expected) if known is not None else None
    if old is not None:
        what = f"; changed since the pinned definition: {summary(old, definition)}"
        diff = changes(old, definition)
    else:
        what = "; the pinned definition is not known here, so what changed cannot be shown"
        diff = None
    return PinMismatchError(
        f"tool {tool!r} of MCP server {server!r} has pin {actual}, but the contract pins {expected}{what}",
        remedy="Review the change with `truss mcp pin CONTRACT` (it prints the difference and the new pins), "
        "then write the new pins with `truss mcp pin CONTRACT --write` if the new definition is trusted",
        server=server,
        tool=tool,
        expected=expected,
        actual=actual,
        changes=diff,
    )


def pin_or_none(definition: Mapping[str, Any]) -> str | None:
    """The tool's pin, or None when its definition (from the server) has no RFC 8785 form."""
    try:
        return pin_of(definition)
    except (CanonicalError, RecursionError):
        return None


@dataclass(frozen=True)
class Mounted:
    """What mounting one server gave: its allowlisted tools, the ``taskSupport`` each declares, its status."""

    tools: dict[str, MountedTool]
    task_support: dict[str, str]
    status: ServerStatus


def mount(
    server: Server,
    client: Client,
    tools: list[types.Tool],
    *,
    transport: str,
    connect_ms: float,
    pid: int | None = None,
    log: Path | None = None,
    launcher: dict[str, Any] | None = None,
    auth: dict[str, Any] | None = None,
    refused: Mapping[str, tuple[str, str]] | None = None,
    known: Callable[[str], Mapping[str, Any] | None] | None = None,
) -> Mounted:
    """Mount ``server``'s allowlisted tools from its ``tools/list`` (see the module docstring)."""
    listed = {t.name for t in tools}
    refused = {name: held for name, held in (refused or {}).items() if name not in listed}
    for name, (why, _) in refused.items():
        if name in server.allow_tools:
            raise ServerStartError(
                f"MCP server {server.name!r} advertises tool {name!r} with an invalid x-mcp-header annotation "
                f"({why[:200]}), so it is not mounted (the 2026-07-28 specification says a client must drop it)",
                remedy="Remove it from allow_tools, or have the server's input schema fixed",
                server=server.name,
                tool=name,
                cause="invalid_x_mcp_header",
            )
    mounted_tools: dict[str, MountedTool] = {}
    task_support: dict[str, str] = {}
    by_name: dict[str, types.Tool] = {}
    for tool in tools:
        if tool.name in by_name:
            raise ServerStartError(
                f"MCP server {server.name!r} advertises tool {tool.name!r} twice",
                remedy="Report it upstream; Truss cannot tell which definition a call would reach",
                server=server.name,
                tool=tool.name,
                cause="duplicate_tool",
            )
        by_name[tool.name] = tool
    wildcard = server.allow_tools == ["*"]
    allowed = set(by_name) if wildcard else set(server.allow_tools)
    statuses: list[ToolStatus] = []
    filtered: dict[str, str] = {}
    for name, tool in by_name.items():
        definition = tool_definition(tool)
        maybe_pin = pin_or_none(definition)
        if maybe_pin is None:
            if name in allowed and not wildcard:
                raise ServerStartError(
                    f"MCP server {server.name!r} advertises tool {name!r} with a definition that has no canonical "
                    "JSON form (an integer of magnitude 2**53 or more, or nesting past 128 levels), so it cannot be "
                    "pinned",
                    remedy="Remove it from allow_tools, or have the server's tool definition fixed",
                    server=server.name,
                    tool=name,
                    cause="unpinnable_tool",
                )
            filtered[name] = UNPINNABLE
            statuses.append(ToolStatus(name, False, UNPINNABLE, dict(definition.get("annotations") or {}), definition))
            continue
        pin = maybe_pin
        valid = bool(TOOL_NAME_RE.match(name))
        mounted = name in allowed and valid
        if name in allowed and not valid:
            if not wildcard:
                raise ServerStartError(
                    f"MCP server {server.name!r} advertises tool {name!r}, whose name is not a valid MCP tool "
                    "name (1-128 of A-Z a-z 0-9 _ - .)",
                    remedy="Remove it from allow_tools; Truss does not mount tools with such names",
                    server=server.name,
                    tool=name,
                    cause="invalid_tool_name",
                )
            filtered[name] = "invalid_name"
        elif name not in allowed:
            filtered[name] = "not_allowlisted"
        if mounted:
            settings = server.tool_settings(name)
            if settings is not None and settings.pin is not None and settings.pin != pin:
                raise _pin_mismatch(
                    server.name, name, expected=settings.pin, actual=pin, definition=definition, known=known
                )
            mounted_tools[name] = MountedTool(server=server.name, tool=name, definition=definition, pin=pin)
            if tool.execution is not None and tool.execution.task_support is not None:
                task_support[name] = tool.execution.task_support
        statuses.append(ToolStatus(name, mounted, pin, dict(definition.get("annotations") or {}), definition))
    for name, (_, refused_pin) in refused.items():
        filtered[name] = "invalid_x_mcp_header"
        statuses.append(ToolStatus(name, False, refused_pin, {}))
    if not wildcard:
        missing = [name for name in server.allow_tools if name not in by_name]
        what, fix = "allowlisted tool(s)", "Fix allow_tools in the contract"
    else:
        # Under "*" the contract loaded without a list to check these names against: a misspelt one
        # would leave its pin unchecked or its budget_calls unenforced, so it stops the start here.
        named = [t.name for t in server.tools] + list(server.retry_in_doubt) + [a.tool for a in server.async_]
        missing = list(dict.fromkeys(name for name in named if name not in by_name))
        what, fix = "tool(s) its settings name", "Fix the tool names in [[mcp.servers.tools]], retry_in_doubt or async"
    if missing:
        advertised = sorted(by_name)
        raise ToolNotAdvertisedError(
            f"MCP server {server.name!r} does not advertise {what} {', '.join(map(repr, missing))}; "
            f"it advertises {', '.join(map(repr, advertised[:_MAX_NAMES_IN_ERROR])) or 'no tools'}",
            remedy=did_you_mean(missing, advertised) + fix + " (names are case-sensitive)",
            server=server.name,
            tool=missing[0],
            missing=missing,
            advertised=advertised[:_MAX_NAMES_IN_ERROR],
        )
    info = client.server_info
    status = ServerStatus(
        name=server.name,
        transport=transport,
        protocol_version=client.protocol_version,
        server_info=info.model_dump(mode="json", exclude_none=True) if info is not None else None,
        capabilities=client.server_capabilities.model_dump(by_alias=True, mode="json", exclude_none=True),
        instructions=client.instructions,
        connect_ms=connect_ms,
        tools=statuses,
        filtered=filtered,
        pid=pid,
        stderr_log=str(log) if log is not None else None,
        launcher=launcher,
        auth=auth,
    )
    return Mounted(mounted_tools, task_support, status)
