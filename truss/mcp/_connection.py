"""One server's connection, from spawn to exit: transport, launcher, auth, stderr, list changes, processes.

``run_server(live, reach)`` owns one server for the whole run, in its own task: it opens the
transport (stdio through the run's ``Launcher`` and Truss's bounded reader, ``truss.mcp._stdio``;
Streamable HTTP through an ``httpx2.AsyncClient`` with the contract's headers and the run's
``HttpAuth`` flow; or an in-process server in tests), lists and mounts the tools
(``truss.mcp._mount``), reports readiness or the start error through ``Live``, then re-lists
whenever the server says its tools changed, until ``connect`` exits. Whatever way it ends, the
stdio server's process group is ended (``truss.mcp._procs``) before the launcher tears its helpers
down, and the stderr log is closed. Every message goes through the connection's
``truss.mcp._wire.Wire``, which tells a server's own JSON-RPC errors from the SDK's. The SDK's
``outputSchema`` check is turned off: Truss checks results itself, bounded and off the event loop
(``truss.mcp._schema``).

Elicitation: a server with an ``[mcp.servers.elicitation]`` table gets an elicitation callback (and
so the client declares the capability); each request is answered by ``truss.elicitation.answer``
and collected for the call it belongs to (``Live.on_elicit``), which the gate records. A server
without the table is not offered elicitation: the SDK refuses its requests with an error.

Tool listings are read as the server sent them (``TrussClient.list_tools``): on 2026-07-28 the SDK
drops tools whose ``x-mcp-header`` annotations are invalid, and Truss keeps the reasons
(``Live.refused``) so that such a tool shows as filtered, and naming it in ``allow_tools`` is a clear
start error instead of "not advertised".

Secrets: ``secret_env`` and secret header values are resolved here from the given environment and
passed to their own server only; they never reach a message, a log or a field. What a server says
about itself (server info, instructions, capabilities, tool annotations and names) is scrubbed of
every secret value the contract names before anyone records or prints it (``Reach.secrets``).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
import os
import sys
from collections.abc import AsyncGenerator, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import KW_ONLY, dataclass
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

import anyio
import anyio.abc
import anyio.to_thread
import httpx2
from mcp import Client, StdioServerParameters, types
from mcp.client.caching import CacheMode
from mcp.client.session import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.inbound import find_invalid_x_mcp_header

from truss import __version__ as _truss_version
from truss import elicitation
from truss._clock import Clock
from truss._credentials import display_url
from truss._errors import McpError, PinMismatchError, ServerStartError, ToolCallError
from truss.contract import Contract, SecretHeader, Server, duration_ms
from truss.ledger.canonical import CanonicalError, canonical
from truss.mcp import _procs
from truss.mcp._authfail import flow_failure, refused_at_connect
from truss.mcp._errmap import leaves, to_call_error, to_start_error
from truss.mcp._mount import UNPINNABLE, list_all, mount, pin_or_none
from truss.mcp._results import closed
from truss.mcp._schema import SchemaChecks
from truss.mcp._status import ServerStatus, scrub_value, scrubbed_status, tool_definition
from truss.mcp._stderr import StderrSink
from truss.mcp._stdio import stdio_transport
from truss.mcp._tasks import offers_tasks
from truss.mcp._wire import ENVELOPE_BYTES, TapRead, TapWrite, Wire
from truss.mcp.auth import HttpAuth
from truss.mcp.launch import Confinement, Launch, Launcher, Report
from truss.pins import DefinitionStore
from truss.tools import MountedTool

__all__ = ["CALLING", "ELICITING", "Live", "Reach", "quiet_sdk_logs", "run_server"]

_LISTEN_ACK_S = 5.0
_LIMIT_WAIT_S = 2.0  # for a server that died of a limit, until its exit status is known
_NO_LIMITS: frozenset[tuple[str, str]] = frozenset()

# (server, tool) of the call in progress in this task: a re-list inside it must not re-send to a changed tool.
CALLING: contextvars.ContextVar[tuple[str, str] | None] = contextvars.ContextVar("truss_mcp_calling", default=None)
# Where an elicitation answered inside the calling task (2026-07-28: the SDK's input_required driver
# runs in it) is collected; requests that arrive on the session's own task find the call in ``Live.inflight``.
ELICITING: contextvars.ContextVar[elicitation.CallElicitations | None] = contextvars.ContextVar(
    "truss_mcp_eliciting", default=None
)

ServerEvents = Callable[[str, str, Mapping[str, Any]], None]


@dataclass(frozen=True)
class Reach:
    """How this run reaches its servers (the same for every server of one ``connect``)."""

    contract: Contract
    log_dir: Path
    environ: Mapping[str, str]
    clock: Clock
    verbose: bool
    launcher: Launcher
    auth: HttpAuth
    on_event: ServerEvents | None = None
    definitions: DefinitionStore | None = None  # every advertised definition, kept by pin (truss.pins)

    def secrets(self) -> list[str]:
        """Every secret value the contract names that is set (``secret_env``, secret headers), longest first."""
        names: list[str] = []
        for server in self.contract.mcp.servers:
            names += server.secret_env
            names += [h.secret_env for h in server.headers.values() if isinstance(h, SecretHeader)]
        values = {v for v in (self.environ.get(name) for name in names) if v}
        return sorted(values, key=len, reverse=True)

    def report(self, server: str) -> Report:
        """What a launcher or auth flow of ``server`` calls to report an event (never raises)."""
        on_event = self.on_event

        def report(name: str, attributes: Mapping[str, Any]) -> None:
            if on_event is not None:
                with contextlib.suppress(Exception):  # an observer must not break a server's connection
                    on_event(server, name, dict(attributes))

        return report


class _CompleteByDefault:
    """The session's dispatcher, with one rule of 2026-07-28 (SEP-2322) the SDK does not apply: a
    result without ``resultType`` is ``complete``. The SDK validates 2026 results with the field
    required, so a server that leaves it out would otherwise fail every call (``invalid_result``)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def send_raw_request(self, method: str, params: Any, opts: Any = None, **more: Any) -> Any:
        raw: Any = await self._inner.send_raw_request(method, params, opts, **more)
        if isinstance(raw, dict) and "resultType" not in raw:
            cast(dict[str, Any], raw)["resultType"] = "complete"
        return cast(object, raw)


@dataclass
class TrussClient(Client):
    """``mcp.Client`` that shows Truss every tools/list page, including the SDK's own re-lists (and the
    tools the SDK drops from them), and reads a 2026-07-28 result without ``resultType`` as complete."""

    _: KW_ONLY
    on_tools_page: Callable[[types.ListToolsResult], None] | None = None
    on_refused: Callable[[list[tuple[types.Tool, str]]], None] | None = None

    async def __aenter__(self) -> TrussClient:
        await super().__aenter__()
        if self.protocol_version >= "2026-07-28":
            session: Any = self.session
            session._dispatcher = _CompleteByDefault(session._dispatcher)
        # The SDK would check each result against its tool's outputSchema on the event loop with a
        # backtracking regex engine and no bound; Truss checks it itself (truss.mcp._schema).
        object.__setattr__(self.session, "validate_tool_result", _unchecked)
        return self

    async def list_tools(
        self,
        *,
        cursor: str | None = None,
        meta: types.RequestParamsMeta | None = None,
        cache_mode: CacheMode = "use",
    ) -> types.ListToolsResult:
        # What ``Client.list_tools`` does without a response cache (Truss never has one), with the
        # listing seen before the session filters it: the session drops 2026-07-28 tools whose
        # x-mcp-header is invalid (and stops mirroring headers for them), and Truss wants the reasons.
        raw = await self.session.send_request(
            types.ListToolsRequest(params=types.PaginatedRequestParams(cursor=cursor, _meta=meta)),
            types.ListToolsResult,
        )
        if self.on_refused is not None and self.protocol_version >= "2026-07-28":
            self.on_refused([(t, r) for t in raw.tools if (r := find_invalid_x_mcp_header(t.input_schema)) is not None])
        complete = cursor is None and raw.next_cursor is None
        page = self.session._absorb_tool_listing(raw, complete=complete)  # pyright: ignore[reportPrivateUsage]
        if self.on_tools_page is not None:
            self.on_tools_page(page)
        return page


async def _unchecked(name: str, result: types.CallToolResult) -> None:
    return None


class Live:
    """One server's connection, owned by one task from start to end."""

    def __init__(self, settings: Server, inprocess: Any = None) -> None:
        self.settings = settings
        self.name = settings.name
        self.inprocess = inprocess
        self.client: TrussClient | None = None
        self.status: ServerStatus | None = None
        self.mounted: dict[str, MountedTool] = {}
        self.task_support: dict[str, str] = {}  # mounted tool -> its declared execution.taskSupport
        self.offers_tasks = False  # capabilities.tasks.requests.tools.call at connect
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
        self.http_statuses: list[int] = []
        self.auth_refusals = 0  # 401/403 responses so far (a call compares before and after)
        self.auth_challenge: tuple[int, str | None] | None = None  # the last one: status, WWW-Authenticate
        self.launcher_json: dict[str, Any] | None = None
        self.auth_json: dict[str, Any] | None = None
        self.auth_flow: httpx2.Auth | None = None
        self.refused: dict[str, tuple[str, str]] = {}  # tool -> (why the SDK dropped it from the listing, pin)
        self.inflight: dict[int, elicitation.CallElicitations] = {}  # Mounts.call in progress -> its elicitations
        self.report: Report | None = None
        self.wire: Wire | None = None
        self.schemas = SchemaChecks()
        self.confinement: Confinement | None = None  # the launcher's, when it confines the server
        # The limits seen reached after the last call: the next call's baseline, so that a call
        # reads the sandbox's counters once (after it), not twice. None: not read yet (the first
        # call reads them before it starts, so that hits of the start-up are not blamed on it).
        self.limits_seen: frozenset[tuple[str, str]] | None = None

    # -- sandbox limits (truss.mcp.launch.Confinement) ------------------------------------------

    def limits_before_call(self) -> frozenset[tuple[str, str]]:
        """The baseline a call's new limit hits are measured against."""
        if self.limits_seen is None and self.confinement is not None:
            self.limits_seen = self.limits_reached()
        return self.limits_seen or _NO_LIMITS

    def limits_reached(self) -> frozenset[tuple[str, str]]:
        """(limit, evidence) of every kernel limit the server's sandbox has reached so far."""
        confinement = self.confinement
        if confinement is None:
            return frozenset()
        with contextlib.suppress(OSError):
            hits = confinement.limit_hits()
            if hits:  # the usual answer, none, is not built anew after every call
                return frozenset((hit.limit, hit.evidence) for hit in hits)
        return _NO_LIMITS

    async def limit_error(self, tool: str, before: frozenset[tuple[str, str]], *, ended: bool) -> ToolCallError | None:
        """The ``sandbox_limit`` failure of a call during which the sandbox reached a limit, else None.

        ``ended``: the connection closed, so the server is ending; its exit status (a limit's own
        signal) is known once its processes are gone, which is waited for (bounded).
        """
        if self.confinement is None:
            return None
        if ended and self.pid is not None:
            await _procs.wait_gone(self.pid, _LIMIT_WAIT_S)
        now = self.limits_reached()
        seen = self.limits_seen
        if seen is not None and now <= before:
            # The usual answer: nothing reached, or only what was reached before the call (which
            # ``limits_seen`` holds already: it only grows, from the baseline ``before`` was).
            return None
        self.limits_seen = now | (seen or frozenset())
        new = sorted(now - before)
        if not new:
            return None
        limit, evidence = new[0]
        return ToolCallError(
            f"the call to tool {tool!r} of MCP server {self.name!r} stopped at its sandbox's {limit} limit "
            f"({evidence})",
            remedy=f"Raise limits.{limit} in the server's [mcp.servers.sandbox] table, or ask the tool for less work",
            server=self.name,
            tool=tool,
            cause="sandbox_limit",
            limit=limit,
            evidence=evidence,
        )

    # -- elicitation (truss.elicitation) ------------------------------------------------------

    def absorb_refused(self, refused: list[tuple[types.Tool, str]]) -> None:
        for tool, reason in refused:
            self.refused[tool.name] = (reason, pin_or_none(tool_definition(tool)) or UNPINNABLE)

    async def on_elicit(
        self, context: ClientRequestContext, params: types.ElicitRequestParams
    ) -> types.ElicitResult | types.ErrorData:
        """Answer one elicitation request by the server's policy and collect it for its call."""
        policy = self.settings.elicitation
        current = ELICITING.get()
        targets = [current] if current is not None else list(self.inflight.values())
        if isinstance(params, types.ElicitRequestURLParams):
            mode, schema, url = "url", None, elicitation.url_sha256(params.url)
        else:
            mode, schema, url = "form", params.requested_schema, None
        if policy is None or not targets:
            # No call of this run is waiting on it (or no policy): nothing could record the answer.
            answer = elicitation.declined("no_call", "no call of the run was in progress on this server")
            if self.report is not None:
                self.report("elicitation_declined", {"reason": answer.reason, "mode": mode})
        elif all(t.full() for t in targets):
            answer = elicitation.declined("too_many", f"over {elicitation.MAX_PER_CALL} elicitations in one call")
        else:
            answer = elicitation.answer(policy, mode=mode, message=params.message, requested_schema=schema)
        record = elicitation.Elicited(mode, params.message, schema, url, answer, calls_in_flight=len(targets))
        for target in targets:
            target.add(record)
        return types.ElicitResult(action=answer.action, content=answer.content)

    # -- list changes ---------------------------------------------------------------------

    def absorb_page(self, page: types.ListToolsResult) -> None:
        for tool in page.tools:
            mounted = self.mounted.get(tool.name)
            if mounted is None:
                continue
            pin = pin_or_none(tool_definition(tool)) or UNPINNABLE  # unpinnable now: changed, refused
            # Sticky: a definition that changes back is still refused (a rug pull may revert to
            # look innocent), and ``changed`` keeps the last pin seen.
            if pin != mounted.pin or tool.name in self.changed:
                self.changed[tool.name] = pin
        current = CALLING.get()
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
        self.refused = {}  # the refusals of this listing only: a server may name new tools every time
        tools = await list_all(client)
        self.absorb_full(tools)
        self.relists += 1
        self.relisted.set()
        self.relisted = anyio.Event()

    async def on_message(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            self.relist_wanted.set()
        elif isinstance(message, Exception):
            self.garbage += 1


# -- opening a transport ------------------------------------------------------------------------


def _seconds(value: str | None) -> float | None:
    return duration_ms(value) / 1000.0 if value is not None else None


def _longest_call_s(contract: Contract, server: Server) -> float:
    candidates = [_seconds(contract.budget.call_timeout), _seconds(server.call_timeout)]
    candidates += [_seconds(t.call_timeout) for t in server.tools]
    return max(c for c in candidates if c is not None)


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


def _description(server: Server, seam: str, value: Any) -> dict[str, Any]:
    """A launcher's or auth flow's description, checked to be recordable JSON."""
    try:
        if not isinstance(value, dict):
            raise TypeError(type(value).__name__)
        canonical(value)
    except (CanonicalError, RecursionError, TypeError) as exc:
        raise ServerStartError(
            f"the {seam} for MCP server {server.name!r} describes itself with something that is not "
            f"recordable JSON ({type(exc).__name__})",
            remedy=f"Fix the {seam}'s describe(): a JSON object that RFC 8785 can encode "
            "(integers within +/-(2**53 - 1))",
            server=server.name,
            cause=f"bad_{seam.replace(' ', '_')}",
        ) from None
    return cast(dict[str, Any], value)


@asynccontextmanager
async def _tracked_stdio(
    reach: Reach, live: Live, declared: Launch, sink: StderrSink, *, marker: str, wire: Wire
) -> AsyncGenerator[Any]:
    assert sink.writer is not None
    async with reach.launcher.launch(live.settings, declared, reach.report(live.name)) as actual:
        live.confinement = actual.confinement
        # Bytes that are not UTF-8 become replacement characters: the line then fails to parse,
        # which is counted and reported with the call's error instead of ending the connection.
        params = StdioServerParameters(command=actual.command, args=list(actual.args), env=dict(actual.env),
                                       cwd=actual.cwd)  # fmt: skip
        try:
            async with stdio_transport(params, errlog=sink.writer, wire=wire) as (read, write):
                sink.spawned()
                # Rarely (a loaded machine) the child's /proc entry is not readable at once: retry, bounded.
                for _ in range(50):
                    live.pid = _procs.find_marked_child(marker)
                    if live.pid is not None:
                        break
                    await anyio.sleep(0.01)
                yield read, TapWrite(write, wire)
        finally:
            if live.pid is not None:  # the server's processes end before the launcher's helpers
                await _procs.end_group(live.pid)


@asynccontextmanager
async def _tapped(transport: Any, wire: Wire) -> AsyncGenerator[Any]:
    async with transport as (read, write):
        yield TapRead(read, wire), TapWrite(write, wire)


def _client_info() -> types.Implementation:
    return types.Implementation(name="truss", version=_truss_version)


async def _open(live: Live, stack: AsyncExitStack, reach: Reach) -> TrussClient:
    server = live.settings
    connect_s = duration_ms(server.connect_timeout) / 1000.0
    target: Any
    wire = Wire(reach.clock.new_id("wire"), reach.contract.budget.max_result_bytes + ENVELOPE_BYTES)
    if live.inprocess is not None:
        target = live.inprocess
    elif server.transport == "stdio":
        assert server.command is not None
        live.launcher_json = _description(server, "launcher", reach.launcher.describe(server))
        marker = reach.clock.new_id("spawn")
        env = _stdio_env(server, reach.environ, marker)
        reach.log_dir.mkdir(parents=True, exist_ok=True)
        sink = StderrSink(
            reach.log_dir / f"{server.name}.stderr.log",
            name=server.name,
            echo=sys.stderr if reach.verbose else None,
            secrets=reach.secrets(),  # a server may print what it was given
        )
        live.sink = sink
        stack.callback(sink.spawned)
        declared = Launch(command=server.command, args=tuple(server.args), env=env, cwd=server.cwd)
        live.wire = wire
        target = _tracked_stdio(reach, live, declared, sink, marker=marker, wire=wire)
    else:
        assert server.url is not None
        live.auth_json = _description(server, "auth flow", reach.auth.describe(server))
        headers = _http_headers(server, reach.environ)

        async def on_response(response: httpx2.Response) -> None:
            if not live.ready.is_set():  # only connect-time statuses are reported
                live.http_statuses.append(response.status_code)
            if response.status_code in (401, 403):
                live.auth_refusals += 1
                live.auth_challenge = (response.status_code, response.headers.get("www-authenticate"))

        live.auth_flow = reach.auth.flow(server, reach.report(server.name))
        http = httpx2.AsyncClient(
            headers=headers,
            auth=live.auth_flow,
            timeout=httpx2.Timeout(connect_s, read=_longest_call_s(reach.contract, server) + 30.0),
            event_hooks={"response": [on_response]},
        )
        await stack.enter_async_context(http)
        live.wire = wire
        target = _tapped(streamable_http_client(server.url, http_client=http, terminate_on_close=True), wire)
    client = TrussClient(
        target,
        mode="auto",
        cache=None,
        read_timeout_seconds=connect_s,
        client_info=_client_info(),
        message_handler=live.on_message,
        elicitation_callback=live.on_elicit if server.elicitation is not None else None,
        on_tools_page=live.absorb_page,
        on_refused=live.absorb_refused,
    )
    await stack.enter_async_context(client)
    return client


# -- one server's life ----------------------------------------------------------------------------


async def _watch_changes(live: Live, client: Client, connect_scope: anyio.CancelScope) -> None:
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
                live.dead = live.dead or closed(live.name, "tools/list")
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


async def run_server(live: Live, reach: Reach) -> None:
    """Own one server from spawn to exit; report readiness or the start error through ``live``."""
    server = live.settings
    clock = reach.clock
    connect_s = duration_ms(server.connect_timeout) / 1000.0
    scope = anyio.CancelScope(deadline=anyio.current_time() + connect_s)
    start = clock.monotonic()
    stdio = server.transport == "stdio" and live.inprocess is None
    log = reach.log_dir / f"{server.name}.stderr.log" if stdio else None
    live.log = log
    live.report = reach.report(server.name)
    try:
        with scope:
            async with AsyncExitStack() as stack:
                client = await _open(live, stack, reach)
                live.client = client
                tools = await list_all(client)
                store = reach.definitions
                if store is not None:
                    # The cache holds definitions as sent (its files hash to their pins), so one that
                    # carries a known secret is not kept at all: a pin diff then says it was never seen.
                    secrets = reach.secrets()
                    kept = [d for d in map(tool_definition, tools) if scrub_value(d, secrets) == d]
                    await anyio.to_thread.run_sync(lambda: [store.put(d) for d in kept])
                mounted = mount(
                    server, client, tools, transport="inprocess" if live.inprocess is not None else server.transport,
                    connect_ms=(clock.monotonic() - start) * 1000.0, pid=live.pid, log=log,
                    launcher=live.launcher_json, auth=live.auth_json, refused=live.refused,
                    known=store.get if store is not None else None,
                )  # fmt: skip
                live.mounted, live.task_support = mounted.tools, mounted.task_support
                live.status = scrubbed_status(mounted.status, reach.secrets())
                live.offers_tasks = offers_tasks(mounted.status.capabilities)
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
        if live.error is not None and live.confinement is not None:
            _explain_sandbox(live.error, live.confinement)
        if live.sink is not None:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(live.sink.close)
        live.ready.set()


def _explain_sandbox(error: McpError, confinement: Confinement) -> None:
    """Add what the sandbox can tell about a failed start (exit status, limits, paths not visible inside)."""
    with contextlib.suppress(Exception):  # an explanation must never hide the error itself
        note = confinement.diagnose()
        if note and "sandbox" not in error.fields:
            error.fields["sandbox"] = note
            error.message += f"; in its sandbox: {note}"


def _start_error(exc: BaseException, live: Live) -> McpError:
    server = live.settings
    failure = flow_failure(live.auth_flow)
    if failure is not None:
        return failure
    errors = [s for s in live.http_statuses if s >= 400]
    fields: dict[str, Any] = {}
    if errors:
        fields["status"] = errors[0]
    http = server.transport == "http" and live.inprocess is None and server.url
    if http:
        fields["url"] = display_url(server.url or "")
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
    status = fields.get("status")
    if http and status in (401, 403):
        challenge = live.auth_challenge[1] if live.auth_challenge is not None else None
        return refused_at_connect(exc, server, status, challenge, fields)
    if http and status == 404:
        url = fields["url"]
        if urlsplit(url).path in ("", "/"):
            remedy = (
                f"The URL has no path; MCP servers usually serve Streamable HTTP at /mcp: try {url.rstrip('/')}/mcp"
            )
        else:
            remedy = f"Nothing answers at {url}; check the URL's path (MCP servers often use /mcp)"
        return to_start_error(exc, server=server.name, text=f"HTTP status 404 at {url}", remedy=remedy, **fields)
    found = [leaf for leaf in leaves(exc) if isinstance(leaf, FileNotFoundError)]
    if not http and server.command is not None and found:
        text, remedy = _not_found(server)
        return to_start_error(exc, server=server.name, text=text, remedy=remedy, **fields)
    if http:
        error = to_start_error(exc, server=server.name, **fields)
        if error.fields.get("cause") == "transport" and fields["url"] not in error.message:
            error.message += f" reaching {fields['url']}"
        return error
    return to_start_error(exc, server=server.name, **fields)


def _not_found(server: Server) -> tuple[str, str]:
    """Where a stdio server's command was looked for: a path (against ``cwd``) or the child's PATH."""
    command = server.command or ""
    if "/" in command:
        base = Path(server.cwd) if server.cwd else Path.cwd()
        where = Path(command) if Path(command).is_absolute() else base / command
        return (f"the command {command!r} was not found (no file {where})",
                "Check the path, or give the command's absolute path")  # fmt: skip
    path = server.env.get("PATH") or os.environ.get("PATH") or os.defpath
    shown = path if len(path) <= 400 else path[:399] + "…"
    return (f"the command {command!r} was not found on the server's PATH ({shown})",
            f"Install {command}, give its absolute path, or set PATH in the server's env")  # fmt: skip


def quiet_sdk_logs() -> None:
    # The SDK logs a server's garbage output and teardown noise at ERROR. With no handler anywhere,
    # Python's last-resort handler would print it on the terminal; Truss reports through its errors.
    sdk = logging.getLogger("mcp")
    if not sdk.handlers:
        sdk.addHandler(logging.NullHandler())
