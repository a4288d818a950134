"""The MCP client tier: connect a contract's servers, list and pin their tools, mount the
allowlisted ones, and call them (DESIGN section 3).

``connect(contract, ...)`` starts every declared server at once (stdio or Streamable HTTP, either
protocol era), each bounded by its ``connect_timeout``, and yields ``Mounts``: the allowlisted
tools with their definition hashes (pins), and ``Mounts.call``, which the gate uses as its
``ToolTransport``. Each server lives in its own task, so one server dying never takes the others
down; every exception the SDK, httpx2, anyio or the OS raises is mapped to a Truss error naming
the server and the tool (``truss.mcp._errmap``). When ``connect`` exits, by any path, every stdio
server and its whole process group is ended (``truss.mcp._procs``).

What this module does not do: decide whether a call is allowed, charge budgets, write the
ledger, or re-send anything. Those belong to the gate. It never puts a secret value (``secret_env``,
secret headers) in a message, a log or a field.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import math
import os
import re
import sys
from collections.abc import AsyncGenerator, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import anyio
import anyio.abc
import anyio.to_thread
import httpx2
from mcp import Client, StdioServerParameters, types
from mcp.client.caching import CacheMode
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.dispatcher import ProgressFnT

from truss import __version__ as _truss_version
from truss._clock import Clock
from truss._errors import (
    McpError,
    PinMismatchError,
    ServerStartError,
    ToolCallError,
    ToolNotAdvertisedError,
)
from truss.contract import Contract, SecretHeader, Server, duration_ms
from truss.ledger.canonical import CanonicalError, canonical, is_plain
from truss.mcp import _procs
from truss.mcp._errmap import leaves, safe_url, to_call_error, to_start_error
from truss.mcp._stderr import StderrSink
from truss.tools import MountedTool, ProgressFn, ToolResult, namespaced, pin_of

__all__ = ["Mounts", "ServerStatus", "ToolStatus", "connect", "tool_definition"]

# SEP-986: what a tool name may be. Anything else (spaces, unicode, ':' or '/') is never mounted.
TOOL_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
_MAX_LIST_PAGES = 1000
_MAX_NAMES_IN_ERROR = 30
_LISTEN_ACK_S = 5.0

_calling: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar("truss_mcp_calling", default=None)


class ToolStatus(NamedTuple):
    """One advertised tool of a server as ``truss mcp list`` shows it."""

    name: str
    mounted: bool
    pin: str
    annotations: Mapping[str, Any]


@dataclass(frozen=True)
class ServerStatus:
    """What a connected server said about itself, and which of its tools are mounted.

    ``filtered`` gives, for each advertised tool that is not mounted, why (``not_allowlisted``,
    ``invalid_name``). ``pid`` is the stdio server's process (and process group) id when known.
    """

    name: str
    transport: str
    protocol_version: str
    server_info: dict[str, Any] | None
    capabilities: dict[str, Any]
    instructions: str | None
    connect_ms: float
    tools: list[ToolStatus]
    filtered: dict[str, str] = field(default_factory=dict[str, str])
    pid: int | None = None
    stderr_log: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "transport": self.transport,
            "protocol_version": self.protocol_version,
            "server_info": self.server_info,
            "capabilities": self.capabilities,
            "instructions": self.instructions,
            "connect_ms": round(self.connect_ms, 1),
            "tools": [
                {
                    "name": t.name,
                    "mounted": t.mounted,
                    "pin": t.pin,
                    "annotations": dict(t.annotations),
                    **({"filtered": self.filtered[t.name]} if t.name in self.filtered else {}),
                }
                for t in self.tools
            ],
            **({"stderr_log": self.stderr_log} if self.stderr_log else {}),
        }


def tool_definition(tool: types.Tool) -> dict[str, Any]:
    """The wire-form members of a tool that its pin covers (DESIGN 3.3)."""
    wire = tool.model_dump(by_alias=True, mode="json", exclude_none=True)
    keys = ("name", "title", "description", "inputSchema", "outputSchema", "annotations")
    return {k: wire[k] for k in keys if k in wire}


@dataclass
class _TrussClient(Client):
    """``mcp.Client`` that shows Truss every tools/list page, including the SDK's own re-lists."""

    _: KW_ONLY
    on_tools_page: Callable[[types.ListToolsResult], None] | None = None

    async def list_tools(
        self,
        *,
        cursor: str | None = None,
        meta: types.RequestParamsMeta | None = None,
        cache_mode: CacheMode = "use",
    ) -> types.ListToolsResult:
        page = await super().list_tools(cursor=cursor, meta=meta, cache_mode=cache_mode)
        if self.on_tools_page is not None:
            self.on_tools_page(page)
        return page


class _Live:
    """One server's connection, owned by one task from start to end."""

    def __init__(self, settings: Server, inprocess: Any = None) -> None:
        self.settings = settings
        self.name = settings.name
        self.inprocess = inprocess
        self.client: _TrussClient | None = None
        self.status: ServerStatus | None = None
        self.mounted: dict[str, MountedTool] = {}
        self.changed: dict[str, str | None] = {}  # tool -> new pin (None: no longer advertised)
        self.error: McpError | None = None
        self.dead: McpError | None = None
        self.ready = anyio.Event()
        self.stop = anyio.Event()
        self.relist_wanted = anyio.Event()
        self.relists = 0
        self.relisted = anyio.Event()
        self.garbage = 0
        self.pid: int | None = None
        self.log: Path | None = None
        self.sink: StderrSink | None = None
        self.verbose = False
        self.http_statuses: list[int] = []
        self.task_required: set[str] = set()

    # -- list changes ---------------------------------------------------------------------

    def absorb_page(self, page: types.ListToolsResult) -> None:
        for tool in page.tools:
            mounted = self.mounted.get(tool.name)
            if mounted is None:
                continue
            pin = _pin_or_none(tool_definition(tool)) or _UNPINNABLE  # unpinnable now: changed, refused
            # Sticky: a definition that changes back is still refused (a rug pull may revert to
            # look innocent), and ``changed`` keeps the last pin seen.
            if pin != mounted.pin or tool.name in self.changed:
                self.changed[tool.name] = pin
        current = _calling.get()
        if current is not None and current[0] == self.name and current[1] in self.changed:
            # The SDK is re-listing inside a call (HEADER_MISMATCH recovery) and would re-send to a
            # tool whose definition changed: stop here, before the re-send.
            raise self.pin_error(current[1])

    def absorb_full(self, tools: list[types.Tool]) -> None:
        advertised = {t.name for t in tools}
        for name in self.mounted:
            if name not in advertised:
                self.changed[name] = None

    def pin_error(self, tool: str) -> PinMismatchError:
        expected = self.mounted[tool].pin
        actual = self.changed.get(tool)
        if actual is None:
            what = "is no longer advertised"
        elif actual == expected:
            what = "changed its definition during the run and changed it back"
        else:
            what = "changed its definition"
        return PinMismatchError(
            f"tool {tool!r} of MCP server {self.name!r} {what} after it was mounted "
            f"(mounted pin {expected}, now {actual or 'absent'}); calls to it are refused for the rest of the run",
            remedy="Review the new definition with `truss mcp probe`; if it is trusted, start a new run",
            server=self.name,
            tool=tool,
            expected=expected,
            actual=actual,
        )

    async def relist(self) -> None:
        client = self.client
        if client is None or self.dead is not None:
            return
        tools = await _list_all(client)
        self.absorb_full(tools)
        self.relists += 1
        self.relisted.set()
        self.relisted = anyio.Event()

    async def on_message(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self.relist_wanted.set()
        elif isinstance(message, Exception):
            self.garbage += 1


async def _list_all(client: Client) -> list[types.Tool]:
    tools: list[types.Tool] = []
    cursor: str | None = None
    for _ in range(_MAX_LIST_PAGES):
        page = await client.list_tools(cursor=cursor)
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            return tools
    raise ServerStartError(
        f"tools/list did not end after {_MAX_LIST_PAGES} pages",
        remedy="The server's pagination never ends; report it upstream",
        cause="protocol_error",
    )


class Mounts:
    """The mounted tools of a contract's servers; implements ``truss.tools.ToolTransport``.

    ``tools`` maps namespaced names (``mcp:<server>:<tool>``) to allowlisted tools only;
    ``by_provider_name`` maps the provider-safe names back; ``servers`` holds what each server
    said at connect time.
    """

    def __init__(self, lives: list[_Live], *, max_result_bytes: int, clock: Clock) -> None:
        self._lives = {live.name: live for live in lives}
        self._max_result_bytes = max_result_bytes
        self._clock = clock
        self.tools: dict[str, MountedTool] = {}
        self.servers: dict[str, ServerStatus] = {}
        self.by_provider_name: dict[str, str] = {}
        for live in lives:
            assert live.status is not None
            self.servers[live.name] = live.status
            for tool in live.mounted.values():
                self.tools[tool.name] = tool
                other = self.by_provider_name.get(tool.provider_name)
                if other is not None:
                    raise ServerStartError(
                        f"tools {other!r} and {tool.name!r} map to the same provider name {tool.provider_name!r}",
                        remedy="Rename one of the servers in the contract",
                        server=live.name,
                        tool=tool.tool,
                        cause="provider_name_collision",
                    )
                self.by_provider_name[tool.provider_name] = tool.name

    def pins(self) -> dict[str, str]:
        """Namespaced name -> pin of every mounted tool (recorded in ``session_started``)."""
        return {name: tool.pin for name, tool in sorted(self.tools.items())}

    def changed(self) -> dict[str, tuple[str, str | None]]:
        """Mounted tools whose definition changed since connect: name -> (pin at mount, pin now)."""
        out: dict[str, tuple[str, str | None]] = {}
        for live in self._lives.values():
            for tool, pin in live.changed.items():
                out[namespaced(live.name, tool)] = (live.mounted[tool].pin, pin)
        return out

    def pids(self) -> dict[str, int]:
        """Server name -> process (group) id of each stdio server whose pid is known."""
        return {name: live.pid for name, live in self._lives.items() if live.pid is not None}

    async def relist(self, server: str | None = None) -> dict[str, tuple[str, str | None]]:
        """List tools again (one server or all) and return the changed pins, as ``changed()``."""
        for live in self._lives.values():
            if server is None or live.name == server:
                try:
                    await live.relist()
                except Exception as exc:
                    raise to_call_error(exc, server=live.name, tool="tools/list") from None
        return self.changed()

    async def wait_relisted(self, server: str, count: int) -> None:
        """Wait until ``server`` has re-listed its tools ``count`` times (after list_changed)."""
        live = self._lives[server]
        while live.relists < count:
            await live.relisted.wait()

    async def round_trip(self, server: str, *, timeout_s: float = 10.0) -> tuple[float, str]:
        """Milliseconds of one request/response with ``server``, and the method used.

        ``ping`` on the 2025-11-25 handshake era; 2026-07-28 removed ping, so there it is the first
        page of ``tools/list`` (never cached: Truss runs the SDK without its response cache).
        """
        live = self._lives[server]
        client = live.client
        if client is None or live.dead is not None:
            raise live.dead or _closed(server, "ping")
        modern = client.protocol_version >= "2026-07-28"
        method = "tools/list" if modern else "ping"
        start = self._clock.monotonic()
        try:
            with anyio.fail_after(timeout_s):
                if modern:
                    await client.list_tools()
                else:
                    await client.session.send_ping()
        except Exception as exc:
            raise to_call_error(exc, server=server, tool=method) from None
        return (self._clock.monotonic() - start) * 1000.0, method

    async def call(
        self,
        tool: MountedTool,
        arguments: Mapping[str, Any],
        *,
        timeout_s: float,
        progress: ProgressFn | None = None,
    ) -> ToolResult:
        """Call a mounted tool. Failures below the tool raise ``ToolCallError`` (``PinMismatchError``
        when its definition changed); a tool's own error is an ``isError`` result; a result over
        ``max_result_bytes`` comes back as an ``error_result``."""
        live, client = self._checked(tool)

        token = _calling.set((tool.server, tool.tool))
        try:
            # The SDK's per-request timer bounds the call (also against a body that drips bytes
            # forever) and sends the courtesy cancel; an extra cancel scope here would only add cost.
            result = await client.call_tool(
                tool.tool,
                dict(arguments),
                read_timeout_seconds=timeout_s,
                progress_callback=_safe_progress(progress) if progress is not None else None,
            )
        except PinMismatchError:
            raise
        except Exception as exc:
            error = to_call_error(exc, server=tool.server, tool=tool.tool, timeout_s=timeout_s)
            if live.log is not None and error.cause in ("connection_closed", "transport"):
                error.fields["stderr_log"] = str(live.log)
                error.remedy = f"The server exited or failed; its stderr is in {live.log}"
            if live.garbage:
                error.fields["garbage_lines"] = live.garbage
                error.message += f" (the server also wrote {live.garbage} line(s) that are not MCP messages)"
            raise error from None
        finally:
            _calling.reset(token)
        return self._result(tool, result)

    # -- MCP tasks (2025-11-25: task-augmented tools/call, tasks/get, tasks/result) ---------------

    def _checked(self, tool: MountedTool) -> tuple[_Live, Client]:
        """The tool's live server and client, or the error that refuses the call before it is sent."""
        live = self._lives.get(tool.server)
        mounted = live.mounted.get(tool.tool) if live is not None else None
        if live is None or mounted is None:
            raise ToolCallError(
                f"tool {tool.name!r} is not mounted",
                remedy="Call only tools listed in Mounts.tools",
                server=tool.server,
                tool=tool.tool,
                cause="not_mounted",
            )
        if tool.pin != mounted.pin:
            raise PinMismatchError(
                f"tool {tool.tool!r} of MCP server {tool.server!r} was given with pin {tool.pin}, "
                f"but the mounted definition has pin {mounted.pin}",
                server=tool.server,
                tool=tool.tool,
                expected=tool.pin,
                actual=mounted.pin,
            )
        if tool.tool in live.changed:
            raise live.pin_error(tool.tool)
        client = live.client
        if client is None or live.dead is not None:
            raise _closed(tool.server, tool.tool, live.dead)
        return live, client

    async def _raw(self, client: Client, method: str, params: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        # The SDK has no tasks API and validates a tools/call answer as a CallToolResult, so task
        # requests go one level down, to the session's dispatcher (mcp 2.3's documented raw path).
        dispatcher: Any = client.session._dispatcher  # pyright: ignore[reportPrivateUsage]
        raw: dict[str, Any] = await dispatcher.send_raw_request(method, params, {"timeout": timeout_s})
        return raw

    async def start_task(self, tool: MountedTool, arguments: Mapping[str, Any], *, timeout_s: float) -> str | None:
        """Start ``tool`` as an MCP task when the server requires it; the task id, else None (call it)."""
        live = self._lives.get(tool.server)
        if live is None or tool.tool not in live.task_required:
            return None
        _, client = self._checked(tool)
        params = {"name": tool.tool, "arguments": dict(arguments), "task": {"ttl": int(max(timeout_s, 60) * 1000)}}
        try:
            raw = await self._raw(client, "tools/call", params, timeout_s)
            created = types.CreateTaskResult.model_validate(raw, by_name=False)
        except Exception as exc:
            raise to_call_error(exc, server=tool.server, tool=tool.tool, timeout_s=timeout_s) from None
        return created.task.task_id

    async def task_result(
        self, tool: MountedTool, task_id: str, *, timeout_s: float, progress: ProgressFn | None = None
    ) -> ToolResult | None:
        """Poll task ``task_id`` (backoff 0.1 s to 2 s) until it ends or ``timeout_s`` passes (None: still
        running). An id the server does not know is ``ToolCallError(cause="task_unknown")``."""
        _, client = self._checked(tool)
        deadline = self._clock.monotonic() + timeout_s
        delay = 0.1
        while True:
            left = deadline - self._clock.monotonic()
            if left <= 0:
                return None
            try:
                raw = await self._raw(client, "tasks/get", {"taskId": task_id}, min(left, 30.0))
                task = types.GetTaskResult.model_validate(raw, by_name=False)
            except Exception as exc:
                raise self._task_error(exc, tool, task_id, left) from None
            if task.status in ("completed", "failed"):
                break
            if task.status in ("cancelled", "input_required"):
                raise ToolCallError(
                    f"task {task_id!r} of tool {tool.tool!r} on MCP server {tool.server!r} ended as {task.status}",
                    server=tool.server,
                    tool=tool.tool,
                    cause=f"task_{task.status}",
                    task=task_id,
                )
            if progress is not None and task.status_message:
                with contextlib.suppress(Exception):
                    await progress(0.0, None, task.status_message)
            hinted = (task.poll_interval or 0) / 1000.0
            await anyio.sleep(min(max(delay, hinted), max(0.0, deadline - self._clock.monotonic())))
            delay = min(delay * 2, 2.0)
        try:
            raw = await self._raw(
                client, "tasks/result", {"taskId": task_id}, max(1.0, deadline - self._clock.monotonic())
            )
            result = types.CallToolResult.model_validate(raw, by_name=False)
        except Exception as exc:
            raise self._task_error(exc, tool, task_id, timeout_s) from None
        return self._result(tool, result)

    def _task_error(self, exc: BaseException, tool: MountedTool, task_id: str, timeout_s: float) -> McpError:
        error = to_call_error(exc, server=tool.server, tool=tool.tool, timeout_s=timeout_s)
        error.fields["task"] = task_id
        if error.fields.get("code") == types.INVALID_PARAMS:
            error.fields["cause"] = "task_unknown"
            error.retryable = False
            error.message = f"MCP server {tool.server!r} does not know task {task_id!r} of tool {tool.tool!r}"
        return error

    def _result(self, tool: MountedTool, result: types.CallToolResult) -> ToolResult:
        wire = result.model_dump(by_alias=True, mode="json", exclude_none=True)
        content: list[Any] = []
        blocks: list[Any] = wire.get("content") or []
        for block in blocks:
            if isinstance(block, dict):
                typed: dict[str, Any] = block  # pyright: ignore[reportUnknownVariableType]
                content.append({k: v for k, v in typed.items() if k != "_meta"})
        out: dict[str, Any] = {"content": content, "isError": bool(wire.get("isError", False))}
        if "structuredContent" in wire:
            out["structuredContent"] = wire["structuredContent"]
        _check_recordable(tool, out)
        if _text_only_bound(content) <= self._max_result_bytes and "structuredContent" not in out:
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
        if size > self._max_result_bytes:
            text = (
                f"The result of tool {tool.tool!r} from MCP server {tool.server!r} is {size} bytes, "
                f"over the contract's max_result_bytes of {self._max_result_bytes}; it was refused."
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
        typed: dict[str, Any] = block  # pyright: ignore[reportUnknownVariableType]
        text = typed.get("text")
        if set(typed) - {"type", "text"} or not isinstance(text, str):
            return 1 << 62
        total += 6 * len(text) + 32
    return total


def _closed(server: str, tool: str, cause: McpError | None = None) -> ToolCallError:
    why = f": {cause.message}" if cause is not None else ""
    return ToolCallError(
        f"MCP server {server!r} is no longer connected, so tool {tool!r} cannot be called{why}",
        remedy="The server exited or its transport failed; its stderr log says why",
        server=server,
        tool=tool,
        cause="connection_closed",
    )


def _safe_progress(sink: ProgressFn) -> ProgressFnT:
    async def report(progress: float, total: float | None, message: str | None) -> None:
        # Progress is advisory: a failing display must not fail the call.
        with contextlib.suppress(Exception):
            await sink(progress, total, message)

    return report


# -- connect --------------------------------------------------------------------------------


def _seconds(value: str | None) -> float | None:
    return duration_ms(value) / 1000.0 if value is not None else None


def _longest_call_s(contract: Contract, server: Server) -> float:
    candidates = [_seconds(contract.budget.call_timeout), _seconds(server.call_timeout)]
    candidates += [_seconds(t.call_timeout) for t in server.tools]
    return max(c for c in candidates if c is not None)


_UNPINNABLE = "unpinnable"


def _pin_or_none(definition: Mapping[str, Any]) -> str | None:
    """The tool's pin, or None when its definition (from the server) has no RFC 8785 form."""
    try:
        return pin_of(definition)
    except (CanonicalError, RecursionError):
        return None


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


def _resolve_secret(server: Server, name: str, environ: Mapping[str, str], where: str) -> str:
    value = environ.get(name)
    if value is None or value == "":
        raise ServerStartError(
            f"MCP server {server.name!r} needs the secret environment variable {name} ({where}), which is not set",
            remedy=f"Export {name} in Truss's environment before the run",
            server=server.name,
            cause="missing_secret",
            variable=name,
        )
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in value) and where.startswith("header"):
        raise ServerStartError(
            f"the secret environment variable {name} for MCP server {server.name!r} holds control characters, "
            "which a header value may not",
            remedy=f"Check the value of {name}",
            server=server.name,
            cause="bad_secret",
            variable=name,
        )
    return value


def _stdio_env(server: Server, environ: Mapping[str, str], marker: str) -> dict[str, str]:
    env = dict(server.env)
    for name in server.secret_env:
        env[name] = _resolve_secret(server, name, environ, "secret_env")
    env[_procs.MARKER_ENV] = marker
    return env


def _http_headers(server: Server, environ: Mapping[str, str]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for key, value in server.headers.items():
        if isinstance(value, SecretHeader):
            secret = _resolve_secret(server, value.secret_env, environ, f"header {key}")
            headers[key] = value.format.replace("{}", secret)
        else:
            headers[key] = value
    for name in server.secret_env:
        _resolve_secret(server, name, environ, "secret_env")
    return headers


@asynccontextmanager
async def _tracked_stdio(
    params: StdioServerParameters, sink: StderrSink, live: _Live, marker: str
) -> AsyncGenerator[Any]:
    assert sink.writer is not None
    async with stdio_client(params, errlog=sink.writer) as streams:
        sink.spawned()
        # Rarely (a loaded machine) the child's /proc entry is not readable at once: retry, bounded.
        for _ in range(50):
            live.pid = _procs.find_marked_child(marker)
            if live.pid is not None:
                break
            await anyio.sleep(0.01)
        yield streams


def _client_info() -> types.Implementation:
    return types.Implementation(name="truss", version=_truss_version)


async def _open(
    live: _Live, stack: AsyncExitStack, *, contract: Contract, log_dir: Path, environ: Mapping[str, str], clock: Clock
) -> _TrussClient:
    server = live.settings
    connect_s = duration_ms(server.connect_timeout) / 1000.0
    target: Any
    if live.inprocess is not None:
        target = live.inprocess
    elif server.transport == "stdio":
        assert server.command is not None
        marker = clock.new_id("spawn")
        env = _stdio_env(server, environ, marker)
        log_dir.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 - once per server, at connect
        sink = StderrSink(
            log_dir / f"{server.name}.stderr.log",
            name=server.name,
            echo=sys.stderr if live.verbose else None,
            secrets=[env[name] for name in server.secret_env],  # a server may print what it was given
        )
        live.sink = sink
        stack.callback(sink.spawned)
        # "replace": with "strict", one non-UTF-8 byte stalls the SDK's reader for good (it drains
        # stdout until EOF); replaced bytes make a line that fails to parse, which is counted and
        # reported with the call's error instead.
        params = StdioServerParameters(
            command=server.command,
            args=list(server.args),
            env=env,
            cwd=server.cwd,
            encoding_error_handler="replace",
        )
        target = _tracked_stdio(params, sink, live, marker)
    else:
        assert server.url is not None
        headers = _http_headers(server, environ)

        async def on_response(response: httpx2.Response) -> None:
            if not live.ready.is_set():  # only connect-time statuses are reported
                live.http_statuses.append(response.status_code)

        http = httpx2.AsyncClient(
            headers=headers,
            timeout=httpx2.Timeout(connect_s, read=_longest_call_s(contract, server) + 30.0),
            event_hooks={"response": [on_response]},
        )
        await stack.enter_async_context(http)
        target = streamable_http_client(server.url, http_client=http, terminate_on_close=True)
    client = _TrussClient(
        target,
        mode="auto",
        cache=None,
        read_timeout_seconds=connect_s,
        client_info=_client_info(),
        message_handler=live.on_message,
        on_tools_page=live.absorb_page,
    )
    await stack.enter_async_context(client)
    return client


def _mount(live: _Live, client: Client, tools: list[types.Tool], connect_ms: float, log: Path | None) -> None:
    server = live.settings
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
        maybe_pin = _pin_or_none(definition)
        if maybe_pin is None:
            if name in allowed and not wildcard:
                raise ServerStartError(
                    f"MCP server {server.name!r} advertises tool {name!r} with a definition that has no canonical "
                    "JSON form (an integer beyond 2**53 or nesting past 128 levels), so it cannot be pinned",
                    remedy="Remove it from allow_tools, or have the server's tool definition fixed",
                    server=server.name,
                    tool=name,
                    cause="unpinnable_tool",
                )
            filtered[name] = "unpinnable"
            statuses.append(ToolStatus(name, False, _UNPINNABLE, dict(definition.get("annotations") or {})))
            continue
        pin = maybe_pin
        valid = bool(TOOL_NAME_RE.match(name))
        mount = name in allowed and valid
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
        if mount:
            settings = server.tool_settings(name)
            if settings is not None and settings.pin is not None and settings.pin != pin:
                raise PinMismatchError(
                    f"tool {name!r} of MCP server {server.name!r} has pin {pin}, but the contract pins {settings.pin}",
                    remedy="The tool's definition changed since it was pinned: review it with `truss mcp probe "
                    "--against`, then update the pin if it is trusted",
                    server=server.name,
                    tool=name,
                    expected=settings.pin,
                    actual=pin,
                )
            live.mounted[name] = MountedTool(server=server.name, tool=name, definition=definition, pin=pin)
            if tool.execution is not None and tool.execution.task_support == "required":
                live.task_required.add(name)
        statuses.append(ToolStatus(name, mount, pin, dict(definition.get("annotations") or {})))
    if not wildcard:
        missing = [name for name in server.allow_tools if name not in by_name]
        if missing:
            advertised = sorted(by_name)
            raise ToolNotAdvertisedError(
                f"MCP server {server.name!r} does not advertise allowlisted tool(s) {', '.join(map(repr, missing))}; "
                f"it advertises {', '.join(map(repr, advertised[:_MAX_NAMES_IN_ERROR])) or 'no tools'}",
                remedy="Fix allow_tools in the contract (names are case-sensitive)",
                server=server.name,
                tool=missing[0],
                missing=missing,
                advertised=advertised[:_MAX_NAMES_IN_ERROR],
            )
    info = client.server_info
    live.status = ServerStatus(
        name=server.name,
        transport="inprocess" if live.inprocess is not None else server.transport,
        protocol_version=client.protocol_version,
        server_info=info.model_dump(mode="json", exclude_none=True) if info is not None else None,
        capabilities=client.server_capabilities.model_dump(by_alias=True, mode="json", exclude_none=True),
        instructions=client.instructions,
        connect_ms=connect_ms,
        tools=statuses,
        filtered=filtered,
        pid=live.pid,
        stderr_log=str(log) if log is not None else None,
    )


async def _watch_changes(live: _Live, client: Client, connect_scope: anyio.CancelScope) -> None:
    """Mark the server ready, then re-list whenever it says its tools changed: a 2025-11-25
    notification, or a 2026-07-28 ``subscriptions/listen`` event. The subscription is
    acknowledged before ``connect`` yields, so no change after that can be missed."""

    async def relister() -> None:
        while True:
            await live.relist_wanted.wait()
            live.relist_wanted = anyio.Event()
            try:
                await live.relist()
            except Exception:
                live.dead = live.dead or _closed(live.name, "tools/list")
                return

    async def listener(*, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        started = False
        # A server that offers subscriptions but never acknowledges one must not use up the whole
        # connect timeout: without the subscription, notifications and re-lists still work.
        ack = anyio.CancelScope(deadline=anyio.current_time() + _LISTEN_ACK_S)
        try:
            with ack:
                async with client.listen(tools_list_changed=True) as subscription:
                    ack.deadline = math.inf
                    task_status.started()
                    started = True
                    async for _event in subscription:
                        live.relist_wanted.set()
        except Exception:  # noqa: S110 - a refused or lost subscription is not fatal (see above)
            pass
        finally:
            if not started:
                task_status.started()

    async with anyio.create_task_group() as tg:
        tg.start_soon(relister)
        caps = client.server_capabilities.tools
        if client.protocol_version >= "2026-07-28" and caps is not None and caps.list_changed:
            await tg.start(listener)
        connect_scope.deadline = math.inf
        live.ready.set()
        await live.stop.wait()
        tg.cancel_scope.cancel()


async def _run(live: _Live, contract: Contract, log_dir: Path, environ: Mapping[str, str], clock: Clock) -> None:
    """Own one server from spawn to exit; report readiness or the start error through ``live``."""
    server = live.settings
    connect_s = duration_ms(server.connect_timeout) / 1000.0
    scope = anyio.CancelScope(deadline=anyio.current_time() + connect_s)
    start = clock.monotonic()
    log = log_dir / f"{server.name}.stderr.log" if server.transport == "stdio" and live.inprocess is None else None
    live.log = log
    try:
        with scope:
            async with AsyncExitStack() as stack:
                client = await _open(live, stack, contract=contract, log_dir=log_dir, environ=environ, clock=clock)
                live.client = client
                tools = await _list_all(client)
                _mount(live, client, tools, (clock.monotonic() - start) * 1000.0, log)
                await _watch_changes(live, client, scope)
        if not live.ready.is_set():
            where = f" in {log}" if log is not None else ""
            live.error = ServerStartError(
                f"MCP server {server.name!r} did not finish connecting within its connect_timeout of "
                f"{server.connect_timeout}",
                remedy=f"Check that the command starts an MCP server on stdout (see its stderr log{where}), or "
                "raise connect_timeout",
                retryable=True,
                server=server.name,
                cause="timeout",
            )
    except Exception as exc:
        if live.ready.is_set():
            live.dead = to_call_error(exc, server=server.name, tool="*")
        else:
            live.error = _start_error(exc, live)
    finally:
        live.client = None
        if live.pid is not None:
            await _procs.end_group(live.pid)
        if live.sink is not None:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(live.sink.close)
        live.ready.set()


def _start_error(exc: BaseException, live: _Live) -> McpError:
    server = live.settings
    errors = [s for s in live.http_statuses if s >= 400]
    fields: dict[str, Any] = {}
    if errors:
        fields["status"] = errors[0]
    if server.transport == "http" and live.inprocess is None and server.url:
        fields["url"] = safe_url(server.url)
    elif server.command is not None:
        fields["command"] = server.command
        if live.log is not None:
            fields["stderr_log"] = str(live.log)
    for leaf in leaves(exc):
        if isinstance(leaf, McpError):
            for key, value in fields.items():
                leaf.fields.setdefault(key, value)
            leaf.fields.setdefault("server", server.name)
            return leaf
    return to_start_error(exc, server=server.name, **fields)


def _quiet_sdk_logs() -> None:
    # The SDK logs a server's garbage output and teardown noise at ERROR. With no handler anywhere,
    # Python's last-resort handler would print it on the terminal; Truss reports through its errors.
    sdk = logging.getLogger("mcp")
    if not sdk.handlers:
        sdk.addHandler(logging.NullHandler())


@asynccontextmanager
async def connect(
    contract: Contract,
    *,
    log_dir: Path,
    environ: Mapping[str, str] | None = None,
    clock: Clock,
    verbose: bool = False,
    only: list[str] | None = None,
    inprocess: Mapping[str, Any] | None = None,
) -> AsyncGenerator[Mounts]:
    """Connect every server of ``contract`` (or the ``only`` named ones) at once and yield ``Mounts``.

    ``environ`` is where ``secret_env`` values come from (default ``os.environ``); each server
    gets only its own. Server stderr goes to ``log_dir/<server>.stderr.log``. ``inprocess`` maps
    a server name to an ``mcp`` server object to connect in-process instead (tests).

    Raises ``ServerStartError``, ``ToolNotAdvertisedError`` or ``PinMismatchError`` (the first
    failing server in declaration order; ``others`` names the rest) before yielding. On exit, by
    any path, every server is closed and every stdio server's process group is ended.
    """
    if not verbose:
        _quiet_sdk_logs()
    env = os.environ if environ is None else environ
    declared = contract.mcp.servers
    if only is not None:
        unknown = [name for name in only if contract.mcp.server(name) is None]
        if unknown:
            raise ServerStartError(
                f"the contract declares no MCP server named {', '.join(map(repr, unknown))}",
                remedy=f"Declared servers: {', '.join(s.name for s in declared) or 'none'}",
                server=unknown[0],
                cause="not_declared",
            )
        declared = [s for s in declared if s.name in only]
    lives = [_Live(s, (inprocess or {}).get(s.name)) for s in declared]
    for live in lives:
        live.verbose = verbose
    body_error: BaseException | None = None
    async with anyio.create_task_group() as tg:
        for live in lives:
            tg.start_soon(_run, live, contract, log_dir, env, clock)
        try:
            for live in lives:
                await live.ready.wait()
            failed = [live.error for live in lives if live.error is not None]
            if failed:
                first = failed[0]
                if len(failed) > 1:
                    first.fields["others"] = [e.fields.get("server") for e in failed[1:]]
                raise first
            mounts = Mounts(lives, max_result_bytes=contract.budget.max_result_bytes, clock=clock)
            yield mounts
        except BaseException as exc:
            # Raised outside the task group so callers see it as is, not wrapped in a group.
            body_error = exc
        finally:
            for live in lives:
                live.stop.set()
    if body_error is not None:
        raise body_error
