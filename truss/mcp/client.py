"""The MCP client tier: connect a contract's servers, list and pin their tools, mount the
allowlisted ones, and call them (DESIGN section 3).

``connect(contract, ...)`` starts every declared server at once (stdio or Streamable HTTP, either
protocol era), each bounded by its ``connect_timeout``, and yields ``Mounts``: the allowlisted
tools with their definition hashes (pins), and ``Mounts.call``, which the gate uses as its
``ToolTransport`` (and ``start_task``/``task_result`` for tools that run as MCP tasks). Each
server lives in its own task, so one server dying never takes the others down; every exception
the SDK, httpx2, anyio or the OS raises is mapped to a Truss error naming the server and the tool
(``truss.mcp._errmap``). When ``connect`` exits, by any path, every stdio server and its whole
process group is ended (``truss.mcp._procs``).

The tier's parts: ``truss.mcp._connection`` (one server's life: transport, launcher, auth flow,
stderr, list changes, processes), ``truss.mcp._mount`` (listing, pinning, mounting),
``truss.mcp._results`` (a call's answer in the gate's form), ``truss.mcp._tasks`` (MCP Tasks),
``truss.mcp._status`` (what ``truss mcp list`` shows), and the two seams an embedding program
may fill: ``truss.mcp.launch`` (what command line runs a stdio server) and ``truss.mcp.auth``
(the HTTP auth flow).

What this module does not do: decide whether a call is allowed, charge budgets, write the
ledger, or re-send anything. Those belong to the gate. It never puts a secret value (``secret_env``,
secret headers) in a message, a log or a field.
"""

from __future__ import annotations

import os
from collections.abc import AsyncGenerator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import anyio
from mcp import Client

from truss._clock import Clock
from truss._errors import McpError, PinMismatchError, ServerStartError, ToolCallError
from truss.contract import Contract, Server
from truss.elicitation import CallElicitations
from truss.mcp import _tasks
from truss.mcp._authfail import call_refusal
from truss.mcp._connection import CALLING, ELICITING, Live, Reach, ServerEvents, quiet_sdk_logs, run_server
from truss.mcp._errmap import to_call_error
from truss.mcp._results import closed, result_of, safe_progress, too_large
from truss.mcp._schema import check_output
from truss.mcp._status import ServerStatus, ToolStatus, tool_definition
from truss.mcp._wire import CALL_SLOT, CallSlot
from truss.mcp.auth import HttpAuth, StaticHeaders
from truss.mcp.launch import Launcher
from truss.mcp.sandbox import SandboxLauncher, profile_of
from truss.pins import DefinitionStore
from truss.tools import MountedTool, ProgressFn, ToolResult, namespaced

__all__ = ["Mounts", "ServerStatus", "ToolStatus", "connect", "tool_definition"]

_MIN_SECRET_LEN = 4  # as the gate's redactor: shorter values would match ordinary text


class Mounts:
    """The mounted tools of a contract's servers; implements ``truss.tools.ToolTransport`` and
    ``truss.pending.TaskTransport``.

    ``tools`` maps namespaced names (``mcp:<server>:<tool>``) to allowlisted tools only;
    ``by_provider_name`` maps the provider-safe names back; ``servers`` holds what each server
    said at connect time.
    """

    def __init__(
        self,
        lives: list[Live],
        *,
        max_result_bytes: int,
        clock: Clock,
        no_wait: bool = False,
        secrets: Sequence[str] = (),
    ) -> None:
        self._lives = {live.name: live for live in lives}
        self._secrets = [s for s in secrets if len(s) >= _MIN_SECRET_LEN]
        self._max_result_bytes = max_result_bytes
        self._clock = clock
        self._no_wait = no_wait
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
            raise live.dead or closed(server, "ping")
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
        ``max_result_bytes`` comes back as an ``error_result``; a call during which the server's sandbox
        reached a kernel limit fails with ``cause="sandbox_limit"`` (``limit``, ``evidence``), whatever
        the server answered. Elicitation requests the server made
        during the call (answered by its ``[mcp.servers.elicitation]`` policy) come back as
        ``extra["elicitations"]`` (a ``truss.elicitation.CallElicitations``), or the error's field of that name."""
        live, client = self._checked(tool)
        if live.sink is not None:  # the server may echo a secret argument on its stderr
            live.sink.remember(self._secret_arguments(tool, arguments))
        started = self._clock.monotonic()
        elicited = CallElicitations()
        key = id(elicited)
        reached = live.limits_before_call()  # a limit first seen after this call started counts against it
        live.inflight[key] = elicited
        slot = CallSlot()
        token = CALLING.set((tool.server, tool.tool))
        eliciting = ELICITING.set(elicited)
        slot_token = CALL_SLOT.set(slot)
        refusals = live.auth_refusals
        try:
            # The SDK's per-request timer bounds the call (also against a body that drips bytes
            # forever) and sends the courtesy cancel; an extra cancel scope here would only add cost.
            result = await client.call_tool(
                tool.tool,
                dict(arguments),
                read_timeout_seconds=timeout_s,
                progress_callback=safe_progress(progress) if progress is not None else None,
            )
        except PinMismatchError:
            raise
        except Exception as exc:
            refusal = live.wire.refusal(exc) if live.wire is not None else None
            if refusal is not None and refusal.reason == "too_large":
                refused = too_large(tool, refusal.size, self._max_result_bytes, at_least=True)
                return self._with_elicitations(refused, elicited)
            error = self._call_error(
                live, tool, exc, timeout_s, slot, unparsable=refusal is not None, refused=live.auth_refusals > refusals
            )
            ended = error.fields.get("cause") in ("connection_closed", "transport")
            error = await live.limit_error(tool.tool, reached, ended=ended) or error
            if elicited.records:
                error.fields["elicitations"] = elicited  # for the record, not for --json (not plain JSON)
            raise error from None
        finally:
            CALL_SLOT.reset(slot_token)
            ELICITING.reset(eliciting)
            CALLING.reset(token)
            del live.inflight[key]
        try:
            # Whatever a server answered while the kernel stopped it at a limit, the call failed there.
            limited = await live.limit_error(tool.tool, reached, ended=False)
            if limited is not None:
                raise limited
            answer = result_of(tool, result, self._max_result_bytes)
            if answer.extra.get("refused") is None:
                left = timeout_s - (self._clock.monotonic() - started)
                await check_output(live.schemas, tool, answer.wire, timeout_s=left)
        except ToolCallError as error:  # a result that cannot be recorded or fails its schema: the exchanges still are
            if elicited.records:
                error.fields["elicitations"] = elicited
            raise
        return self._with_elicitations(answer, elicited)

    @staticmethod
    def _with_elicitations(answer: ToolResult, elicited: CallElicitations) -> ToolResult:
        if elicited.records:
            return ToolResult(answer.wire, {**answer.extra, "elicitations": elicited})
        return answer

    def _call_error(
        self,
        live: Live,
        tool: MountedTool,
        exc: Exception,
        timeout_s: float,
        slot: CallSlot,
        *,
        unparsable: bool,
        refused: bool,
    ) -> McpError:
        if unparsable:
            error: McpError = ToolCallError(
                f"calling tool {tool.tool!r} on MCP server {tool.server!r} failed: the server answered with a "
                "message that is not valid JSON-RPC (not JSON, or nested deeper than the parser reads)",
                remedy="The server's answer broke the MCP schema; report it upstream",
                server=tool.server,
                tool=tool.tool,
                cause="invalid_result",
            )
        else:
            # An OAuth flow that failed (login needed) says so; else a 401/403 during the call is an
            # authentication failure with its status, not the JSON-RPC error the SDK makes of it.
            error = call_refusal(
                live.auth_flow, live.settings, tool.tool, refused=refused, challenge=live.auth_challenge
            ) or to_call_error(exc, server=tool.server, tool=tool.tool, timeout_s=timeout_s, answered=slot.server_error)
        if live.log is not None and error.fields.get("cause") in ("connection_closed", "transport"):
            error.fields["stderr_log"] = str(live.log)
            error.remedy = f"The server exited or failed; its stderr is in {live.log}"
        if live.garbage:
            error.fields["garbage_lines"] = live.garbage
            error.message += f" (the server also wrote {live.garbage} line(s) that are not MCP messages)"
        return error

    def _secret_arguments(self, tool: MountedTool, arguments: Mapping[str, Any]) -> list[str]:
        """The string values of ``tool``'s server's ``secret_args`` fields in ``arguments``."""
        live = self._lives[tool.server]
        found: list[str] = []
        for spec in live.settings.secret_args:
            parts = spec[1:].split("/") if spec.startswith("/") else None
            path = [p.replace("~1", "/").replace("~0", "~") for p in parts] if parts is not None else [spec]
            value: Any = arguments
            for part in path:
                value = cast(Mapping[str, Any], value).get(part) if isinstance(value, Mapping) else None
            _strings(value, found)
        return found

    # -- MCP tasks (truss.mcp._tasks: which tools, TTL, polling, task ids) --------------------------

    async def start_task(self, tool: MountedTool, arguments: Mapping[str, Any], *, timeout_s: float) -> str | None:
        """Start ``tool`` as an MCP task when it runs as one; the task id, else None (call it)."""
        live = self._lives.get(tool.server)
        if live is None or not _tasks.runs_as_task(live.offers_tasks, live.task_support.get(tool.tool)):
            return None
        _, client = self._checked(tool)
        task_id = await _tasks.start(client, tool, arguments, timeout_s=timeout_s)
        if any(secret in task_id for secret in self._secrets):
            # A task id is recorded (signed) and shown: one holding a secret value cannot be used.
            raise ToolCallError(
                f"MCP server {tool.server!r} answered tool {tool.tool!r} with a task id that holds a secret value "
                "of the contract",
                remedy="Report it upstream; Truss records task ids, so it cannot follow this one",
                server=tool.server,
                tool=tool.tool,
                cause="protocol_error",
            )
        return task_id

    async def task_result(
        self, tool: MountedTool, task_id: str, *, timeout_s: float, progress: ProgressFn | None = None
    ) -> ToolResult | None:
        """Task ``task_id``'s result once it ended; None while it still runs after ``timeout_s`` (or at
        the first look, with ``no_wait``). An id the server does not know is ``cause="task_unknown"``."""
        live, client = self._checked(tool)
        started = self._clock.monotonic()
        answer = await _tasks.result(client, tool, task_id, timeout_s=timeout_s,
                                     max_result_bytes=self._max_result_bytes, no_wait=self._no_wait,
                                     progress=progress)  # fmt: skip
        if answer is not None and answer.extra.get("refused") is None:
            left = timeout_s - (self._clock.monotonic() - started)
            await check_output(live.schemas, tool, answer.wire, timeout_s=max(left, 1.0))
        return answer

    def _checked(self, tool: MountedTool) -> tuple[Live, Client]:
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
            raise closed(tool.server, tool.tool, live.dead)
        return live, client


def _strings(value: Any, out: list[str]) -> None:
    if isinstance(value, str):
        out.append(value)
    elif isinstance(value, Mapping):
        for item in cast(Mapping[str, Any], value).values():
            _strings(item, out)
    elif isinstance(value, list):
        for item in cast(list[Any], value):
            _strings(item, out)


async def _launcher_for(
    servers: Sequence[Server],
    launcher: Launcher | None,
    *,
    log_dir: Path,
    protected: Sequence[str | os.PathLike[str]],
    clock: Clock,
) -> Launcher:
    if launcher is not None:
        confined = [s.name for s in servers if profile_of(s) is not None]
        if confined and not isinstance(launcher, SandboxLauncher):
            raise ServerStartError(
                f"MCP server {confined[0]!r} is confined by its sandbox table, and the launcher given "
                f"({type(launcher).__name__}) is not Truss's sandbox launcher",
                remedy="Let connect() choose the launcher, or pass a truss.mcp.sandbox.SandboxLauncher",
                server=confined[0],
                cause="bad_launcher",
            )
        return launcher
    guarded = [*protected, log_dir]
    if log_dir.parent.name == "logs":  # HOME/logs/<session>: the run's Truss home
        guarded.append(log_dir.parent.parent)
    return await SandboxLauncher.create(servers, protected=guarded, clock=clock)


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
    launcher: Launcher | None = None,
    auth: HttpAuth | None = None,
    no_wait: bool = False,
    on_event: ServerEvents | None = None,
    definitions: DefinitionStore | None = None,
    protected: Sequence[str | os.PathLike[str]] = (),
) -> AsyncGenerator[Mounts]:
    """Connect every server of ``contract`` (or the ``only`` named ones) at once and yield ``Mounts``.

    ``environ`` is where ``secret_env`` values come from (default ``os.environ``); each server
    gets only its own. Server stderr goes to ``log_dir/<server>.stderr.log``. ``inprocess`` maps
    a server name to an ``mcp`` server object to connect in-process instead (tests). ``launcher``
    decides what command line runs each stdio server (default ``SandboxLauncher``: confined where
    the server's effective ``sandbox`` says so, as declared otherwise; another launcher is refused
    for a confined server, which never runs unconfined because of it); ``protected`` are paths
    a sandbox never shows (Truss's home, key and ledger; ``log_dir`` and, when it is
    ``HOME/logs/<id>``, that home are always added);
    ``auth`` gives each HTTP server its auth flow (default ``StaticHeaders``: the contract's
    headers only); both describe themselves in each ``ServerStatus`` (``launcher``, ``auth``).
    ``no_wait``: an MCP task not finished at the first look is left running (``task_result``
    returns None). ``on_event(server, name, attributes)`` receives what launchers and auth flows
    report. ``definitions``: where every advertised tool's definition is kept by pin
    (``truss.pins``), so that a pin mismatch can say what changed since the pinned definition.

    Raises ``ServerStartError``, ``ToolNotAdvertisedError`` or ``PinMismatchError`` (the first
    failing server in declaration order; ``others`` names the rest) before yielding. On exit, by
    any path, every server is closed and every stdio server's process group is ended.
    """
    if not verbose:
        quiet_sdk_logs()
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
    launcher = await _launcher_for(declared, launcher, log_dir=log_dir, protected=protected, clock=clock)
    reach = Reach(contract=contract, log_dir=log_dir, environ=env, clock=clock, verbose=verbose,
                  launcher=launcher, auth=auth or StaticHeaders(), on_event=on_event,
                  definitions=definitions)  # fmt: skip
    lives = [Live(s, (inprocess or {}).get(s.name)) for s in declared]
    body_error: BaseException | None = None
    async with anyio.create_task_group() as tg:
        for live in lives:
            tg.start_soon(run_server, live, reach)
        try:
            for live in lives:
                await live.ready.wait()
            failed: list[McpError] = [live.error for live in lives if live.error is not None]
            if failed:
                first = failed[0]
                if len(failed) > 1:
                    first.fields["others"] = [e.fields.get("server") for e in failed[1:]]
                raise first
            mounts = Mounts(lives, max_result_bytes=contract.budget.max_result_bytes, clock=clock, no_wait=no_wait,
                            secrets=reach.secrets())  # fmt: skip
            yield mounts
        except BaseException as exc:
            # Raised outside the task group so callers see it as is, not wrapped in a group.
            body_error = exc
        finally:
            for live in lives:
                live.stop.set()
    if body_error is not None:
        raise body_error
