"""``truss mcp list|probe|import|login|logout|auth status``: look at MCP servers before trusting them with a run.

``list`` connects a contract's servers and shows, per server, its transport, protocol version and
server info, and per tool whether it is mounted or filtered, its annotations and its pin.
``probe`` connects one server (from a contract, a command or a URL) and reports everything it
says about itself, a round-trip time and, with ``--against``, how its live pins differ from a
contract's. ``import`` turns a Claude-style ``{"mcpServers": ...}`` file into ``[[mcp.servers]]``
TOML. ``login`` runs the OAuth authorization code flow once for a server with
``[mcp.servers.oauth]`` (a person, a browser or a pasted redirect), ``logout`` forgets its tokens,
``auth status`` lists the stored grants (issuer, scopes, expiry; never a token): docs/oauth.md.
The MCP SDK is imported inside the handlers only. Exit codes: 0 ok, 1 pin drift
(``probe --against``), 2 bad input, 4 a server failed, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import anyio
import pydantic
from truss_cli._ctx import Ctx, table
from truss_cli.cmd_contract import add_contract_args, load_from_args

from truss._errors import ContractError, ServerStartError, UsageError
from truss.contract import Contract, load_contract

T = TypeVar("T")

_HINTS = (
    ("readOnlyHint", "read-only"),
    ("destructiveHint", "destructive"),
    ("idempotentHint", "idempotent"),
    ("openWorldHint", "open-world"),
)


def register(sub: Any) -> None:
    parser: argparse.ArgumentParser = sub.add_parser("mcp", help="list, probe and import MCP servers")
    commands = parser.add_subparsers(dest="mcp_command", metavar="SUBCOMMAND")

    listing = commands.add_parser("list", help="connect a contract's servers and show their tools and pins")
    add_contract_args(listing)
    listing.set_defaults(handler=run_list)

    probe = commands.add_parser(
        "probe",
        help="connect one server and report what it says about itself",
        description="Connect one MCP server: --contract FILE SERVER, --url URL, or --command CMD [ARG...] "
        "(last: everything after it goes to the server; put -- before server arguments such as -v).",
    )
    probe.add_argument("--contract", nargs=2, metavar=("FILE", "SERVER"), help="a server declared in a contract")
    probe.add_argument("--url", help="a Streamable HTTP endpoint")
    probe.add_argument(
        "--header-env",
        action="append",
        default=[],
        metavar="NAME=ENV[:FORMAT]",
        help="an HTTP header whose value is environment variable ENV (FORMAT like 'Bearer {}')",
    )
    probe.add_argument("--secret-env", action="append", default=[], metavar="NAME", help="pass NAME to a --command")
    probe.add_argument("--against", metavar="CONTRACT", help="compare live pins with this contract's")
    probe.add_argument("--name", default=None, help="the server's name (default: SERVER, else 'probe')")
    probe.add_argument("--timeout", default="30s", help="connect timeout (default 30s)")
    probe.add_argument("--command", nargs=argparse.REMAINDER, metavar="CMD", help="a stdio server command line")
    probe.set_defaults(handler=run_probe)

    imp = commands.add_parser("import", help="turn a Claude-style mcpServers JSON file into [[mcp.servers]] TOML")
    imp.add_argument("file", metavar="FILE", help="the JSON file")
    imp.add_argument("-o", "--output", metavar="OUT", help="write the TOML here (refuses to overwrite)")
    imp.add_argument(
        "--probe", action="store_true", help="connect each server and list its tools (read-only ones allowed)"
    )
    imp.set_defaults(handler=run_import)

    log_in = commands.add_parser("login", help="log in to an OAuth MCP server once (a browser or a pasted redirect)")
    log_in.add_argument("server", metavar="SERVER", help="the server's name")
    log_in.add_argument("--contract", metavar="FILE", help="the contract declaring it (default: the operator config)")
    log_in.add_argument("--paste", action="store_true", help="no loopback listener: paste the URL the browser lands on")
    log_in.add_argument("--no-browser", action="store_true", help="print the authorization URL, do not open it")
    log_in.add_argument("--timeout", default="5m", help="how long to wait for the person (default 5m)")
    log_in.set_defaults(handler=run_login)

    log_out = commands.add_parser("logout", help="forget the OAuth tokens stored for a server")
    log_out.add_argument("server", metavar="SERVER", help="the server's name")
    log_out.add_argument("--contract", metavar="FILE", help="the contract declaring it (default: the operator config)")
    log_out.set_defaults(handler=run_logout)

    auth = commands.add_parser("auth", help="the OAuth credentials Truss holds")
    auth_commands = auth.add_subparsers(dest="auth_command", metavar="SUBCOMMAND")
    auth_status = auth_commands.add_parser("status", help="which servers have credentials: issuer, scopes, expiry")
    auth_status.set_defaults(handler=run_auth_status)

    def auth_usage(args: argparse.Namespace, ctx: Ctx) -> int:
        auth.print_help()
        return 2

    auth.set_defaults(handler=auth_usage)

    def usage(args: argparse.Namespace, ctx: Ctx) -> int:
        parser.print_help()
        return 2

    parser.set_defaults(handler=usage)


# -- running with signals --------------------------------------------------------------------------


class _Interrupted(Exception):
    pass


def _run(fn: Callable[[], Awaitable[T]]) -> T:
    """Run ``fn``; Ctrl-C or SIGTERM cancels it, which ends every server the MCP tier started."""

    async def main() -> T:
        box: list[T] = []
        error: list[BaseException] = []
        received: list[int] = []
        async with anyio.create_task_group() as group:

            async def watch() -> None:
                with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    async for signum in signals:
                        received.append(signum)
                        group.cancel_scope.cancel()
                        return

            async def work() -> None:
                try:
                    box.append(await fn())
                except Exception as exc:
                    error.append(exc)
                group.cancel_scope.cancel()

            group.start_soon(watch)
            group.start_soon(work)
        if received:
            raise _Interrupted(signal.Signals(received[0]).name)
        if error:
            raise error[0]
        return box[0]

    try:
        return anyio.run(main)
    except _Interrupted as exc:
        raise KeyboardInterrupt(str(exc)) from None


def _auth(ctx: Ctx) -> Any:
    from truss.mcp.oauth import OAuthFlows

    return OAuthFlows.for_home(ctx.home, ctx.clock)


def _log_dir(ctx: Ctx) -> Path:
    return ctx.home / "logs" / ctx.clock.new_id("mcp")


# -- list ----------------------------------------------------------------------------------------


def run_list(args: argparse.Namespace, ctx: Ctx) -> int:
    contract = load_from_args(args, ctx)
    if not contract.mcp.servers:
        ctx.emit({"servers": []}, "the contract declares no MCP servers")
        return 0
    from truss.mcp.client import ServerStatus, connect

    async def work() -> list[ServerStatus]:
        async with connect(contract, log_dir=_log_dir(ctx), clock=ctx.clock, verbose=ctx.verbose,
                           auth=_auth(ctx)) as mounts:  # fmt: skip
            return [mounts.servers[s.name] for s in contract.mcp.servers]

    statuses = _run(work)
    blocks = [_server_block(s, full_pins=False) for s in statuses]
    ctx.emit({"servers": [s.to_json() for s in statuses]}, "\n\n".join(blocks))
    return 0


def _hints(annotations: Mapping[str, Any]) -> str:
    words = [word for key, word in _HINTS if annotations.get(key) is True]
    return ", ".join(words) or "-"


def _info(info: Mapping[str, Any] | None) -> str:
    if not info:
        return "(no server info)"
    return _clean(f"{info.get('name', '?')} {info.get('version', '')}".strip())


def _clean(text: str) -> str:
    # Server-provided text: no control characters (terminal escapes) reach the terminal.
    return "".join(c if c.isprintable() else "?" for c in text)


def _server_block(status: Any, *, full_pins: bool) -> str:
    head = (
        f"{status.name}  {status.transport}  {status.protocol_version}  {_info(status.server_info)}  "
        f"connect {status.connect_ms:.0f} ms"
    )
    rows: list[list[str]] = []
    for tool in status.tools:
        state = "mounted" if tool.mounted else f"filtered ({status.filtered.get(tool.name, '?')})"
        pin = tool.pin if full_pins else tool.pin[:19] + "…"
        rows.append([_printable(tool.name), state, _hints(tool.annotations), pin])
    body = table(rows, ["TOOL", "STATE", "HINTS", "PIN"]) if rows else "(no tools)"
    return head + "\n" + "\n".join("  " + line for line in body.splitlines())


def _printable(text: str) -> str:
    # Tool names come from the server: show control characters escaped, never raw.
    return text if text.isprintable() else repr(text)


# -- probe ---------------------------------------------------------------------------------------


def _probe_target(args: argparse.Namespace, ctx: Ctx) -> tuple[dict[str, Any], Contract | None]:
    chosen = [flag for flag in ("contract", "url", "command") if getattr(args, flag)]
    if len(chosen) != 1:
        raise UsageError(
            "truss mcp probe: give exactly one of --contract FILE SERVER, --url URL, --command CMD [ARG...]",
            remedy="See 'truss mcp probe --help'",
        )
    timeout = args.timeout
    if args.contract:
        file, name = args.contract
        contract = load_contract(Path(file), home=ctx.home)
        server = contract.mcp.server(name)
        if server is None:
            declared = ", ".join(s.name for s in contract.mcp.servers) or "none"
            raise UsageError(f"{file} declares no MCP server {name!r} (declared: {declared})")
        data = server.model_dump(by_alias=True, mode="json", exclude_none=True)
        data.update({"allow_tools": ["*"], "tools": [], "connect_timeout": timeout})
        return data, contract
    name = args.name or "probe"
    if args.url:
        headers: dict[str, Any] = {}
        for item in args.header_env:
            header, sep, spec = item.partition("=")
            env, _, fmt = spec.partition(":")
            if not sep or not header or not env:
                raise UsageError(f"--header-env {item!r}: write NAME=ENV or NAME=ENV:FORMAT")
            headers[header] = {"secret_env": env, **({"format": fmt} if fmt else {})}
        return {
            "name": name,
            "transport": "http",
            "url": args.url,
            "headers": headers,
            "allow_tools": ["*"],
            "connect_timeout": timeout,
        }, None
    command: list[str] = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise UsageError("--command needs the server's command line")
    return {
        "name": name,
        "command": command[0],
        "args": command[1:],
        "secret_env": list(args.secret_env),
        "allow_tools": ["*"],
        "connect_timeout": timeout,
    }, None


def _contract_with(server: dict[str, Any]) -> Contract:
    try:
        return Contract.model_validate({"contract": {"name": "probe", "intent": "probe"}, "mcp": {"servers": [server]}})
    except ValueError as exc:
        raise UsageError(f"truss mcp probe: {_first_error(exc)}") from None


def _first_error(exc: ValueError) -> str:
    if isinstance(exc, pydantic.ValidationError) and exc.errors():
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return f"{where}: {first['msg']}"
    return str(exc)


def run_probe(args: argparse.Namespace, ctx: Ctx) -> int:
    server, own_contract = _probe_target(args, ctx)
    against = load_contract(Path(args.against), home=ctx.home) if args.against else own_contract
    contract = _contract_with(server)
    from truss.mcp.client import connect

    async def work() -> dict[str, Any]:
        async with connect(contract, log_dir=_log_dir(ctx), clock=ctx.clock, verbose=ctx.verbose,
                           auth=_auth(ctx)) as mounts:  # fmt: skip
            status = mounts.servers[server["name"]]
            rtt, method = await mounts.round_trip(server["name"])
        data = status.to_json()
        data["round_trip_ms"] = round(rtt, 2)
        data["round_trip_method"] = method
        return data

    try:
        data = _run(work)
    except ServerStartError as exc:
        found = _oauth_found(server, exc)
        if found is None:
            raise
        ctx.emit(found, _oauth_text(found))
        return 0
    drift = _drift(against, server["name"], data) if against is not None else None
    if drift is not None:
        data["drift"] = drift
    ctx.emit(data, _probe_text(data))
    if drift is not None and any(d["state"] in ("changed", "missing") for d in drift["tools"]):
        return 1
    return 0


def _oauth_found(server: Mapping[str, Any], exc: ServerStartError) -> dict[str, Any] | None:
    """An http server that refused to connect without OAuth: what it says about its OAuth, or None."""
    if server.get("transport") != "http" or not (
        exc.fields.get("status") in (401, 403) or exc.kind == "login_required"
    ):
        return None
    from truss.contract.fields import duration_ms
    from truss.mcp.oauth.discover import discover

    url, timeout_s = str(server["url"]), duration_ms(str(server["connect_timeout"])) / 1000.0
    try:
        oauth = _run(lambda: discover(url, timeout_s=timeout_s))
    except Exception:
        return None
    if oauth is None:
        return None
    return {"server": server["name"], "url": url, "connected": False, "needs": "oauth", "oauth": oauth}


def _oauth_text(found: Mapping[str, Any]) -> str:
    oauth: Mapping[str, Any] = found["oauth"]
    authz: Mapping[str, Any] = oauth.get("authorization_server") or {}
    lines = [
        f"server        {found['server']} ({found['url']}): asks for OAuth (HTTP {oauth['status']}), not connected",
        f"resource      {oauth.get('resource') or '(no protected resource metadata)'}",
        f"authorization {', '.join(oauth.get('authorization_servers') or []) or '(none advertised)'}",
        f"issuer        {authz.get('issuer') or '(no authorization server metadata)'}",
        f"grants        {' '.join(authz.get('grant_types_supported') or []) or '-'}",
        f"scopes        {' '.join(oauth.get('scopes_supported') or authz.get('scopes_supported') or []) or '-'}"
        + (f" (the challenge asks for: {oauth['challenge_scope']})" if oauth.get("challenge_scope") else ""),
        f"registration  {'dynamic' if authz.get('dynamic_registration') else 'no dynamic registration'}"
        + (", client ID metadata documents" if authz.get("client_id_metadata_document_supported") else ""),
        "declare [mcp.servers.oauth] for it and run `truss mcp login SERVER` (docs/oauth.md)",
    ]
    return "\n".join(lines)


def _drift(contract: Contract, name: str, live: Mapping[str, Any]) -> dict[str, Any]:
    declared = contract.mcp.server(name)
    if declared is None and len(contract.mcp.servers) == 1:
        declared = contract.mcp.servers[0]
    if declared is None:
        raise UsageError(
            f"the --against contract declares no MCP server {name!r}",
            remedy="Name the probed server with --name to match the contract's server",
        )
    pins: dict[str, str] = {t["name"]: t["pin"] for t in live["tools"]}
    names = list(pins) if declared.allow_tools == ["*"] else list(declared.allow_tools)
    names += [t.name for t in declared.tools if t.name not in names]
    rows: list[dict[str, Any]] = []
    for tool in names:
        settings = declared.tool_settings(tool)
        expected = settings.pin if settings is not None else None
        actual = pins.get(tool)
        if actual is None:
            state = "missing"
        elif expected is None:
            state = "unpinned"
        else:
            state = "ok" if expected == actual else "changed"
        rows.append({"tool": tool, "state": state, "expected": expected, "actual": actual})
    return {"server": declared.name, "tools": rows}


def _probe_text(data: Mapping[str, Any]) -> str:
    capabilities: Mapping[str, Any] = data.get("capabilities") or {}
    caps = ", ".join(sorted(k for k, v in capabilities.items() if v is not None)) or "-"
    lines = [
        f"server        {data['name']} ({data['transport']})",
        f"info          {_info(data.get('server_info'))}",
        f"protocol      {data['protocol_version']}",
        f"connect       {data['connect_ms']:.0f} ms",
        f"round trip    {data['round_trip_ms']:.1f} ms ({data['round_trip_method']})",
        f"capabilities  {caps}",
    ]
    instructions = data.get("instructions")
    if instructions:
        first = _clean(" ".join(str(instructions).split()))
        lines.append(f"instructions  {first[:100]}{'…' if len(first) > 100 else ''}")
    if data.get("stderr_log"):
        lines.append(f"stderr log    {data['stderr_log']}")
    rows = [[_printable(t["name"]), _hints(t["annotations"]), t["pin"]] for t in data["tools"]]
    lines.append(f"tools         {len(rows)}")
    if rows:
        lines.extend("  " + line for line in table(rows, ["TOOL", "HINTS", "PIN"]).splitlines())
    drift = data.get("drift")
    if drift is not None:
        lines.append(f"pins against the contract's server {drift['server']!r}:")
        drift_rows = [[d["tool"], d["state"], d["expected"] or "-", d["actual"] or "-"] for d in drift["tools"]]
        lines.extend("  " + line for line in table(drift_rows, ["TOOL", "STATE", "CONTRACT", "LIVE"]).splitlines())
    return "\n".join(lines)


# -- import --------------------------------------------------------------------------------------


def run_import(args: argparse.Namespace, ctx: Ctx) -> int:
    from truss.mcp._claude_import import ImportedServer, ProbedTool, convert, render_toml

    source = Path(args.file)
    try:
        text = source.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ContractError(f"cannot read {source}: {type(exc).__name__}", file=str(source)) from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ContractError(f"not JSON: {exc}", file=str(source)) from None
    servers: list[ImportedServer] = convert(data, source=str(source))
    out = Path(args.output) if args.output else None
    if out is not None and out.exists():
        raise UsageError(f"{out} exists; Truss does not overwrite it", remedy="Choose another --output file")
    if args.probe and servers:
        from truss.mcp.client import connect

        contract = _contract_with_all([s.table for s in servers])

        async def work() -> dict[str, list[ProbedTool]]:
            found: dict[str, list[ProbedTool]] = {}
            async with connect(contract, log_dir=_log_dir(ctx), clock=ctx.clock, verbose=ctx.verbose,
                           auth=_auth(ctx)) as mounts:  # fmt: skip
                for name, status in mounts.servers.items():
                    found[name] = [
                        ProbedTool(
                            t.name,
                            t.pin,
                            t.annotations.get("readOnlyHint") is True,
                            t.annotations.get("destructiveHint") is not False,
                        )
                        for t in status.tools
                        if t.mounted
                    ]
            return found

        probed = _run(work)
        for server in servers:
            server.tools = probed.get(server.table["name"], [])
    rendered = render_toml(servers, source=source.name)
    if out is not None:
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(rendered, encoding="utf-8")
        os.replace(tmp, out)
    summary = {
        "servers": [
            {
                "name": s.table["name"],
                "from": s.source_name,
                "transport": s.table.get("transport"),
                "secret_env": s.table.get("secret_env", []),
                "notes": s.notes,
                "tools": None if s.tools is None else [t.name for t in s.tools],
            }
            for s in servers
        ],
        "output": str(out) if out is not None else None,
        "toml": rendered,
    }
    human = rendered if out is None else f"wrote {len(servers)} server(s) to {out}; review allow_tools before use"
    ctx.emit(summary, human)
    return 0


def _contract_with_all(tables: list[dict[str, Any]]) -> Contract:
    servers = [{**table, "allow_tools": ["*"]} for table in tables]
    try:
        return Contract.model_validate({"contract": {"name": "import", "intent": "probe"}, "mcp": {"servers": servers}})
    except ValueError as exc:
        raise UsageError(f"truss mcp import: {_first_error(exc)}") from None


# -- OAuth: login, logout, auth status -------------------------------------------------------------


def _servers_contract(args: argparse.Namespace, ctx: Ctx) -> Contract:
    """The contract named by ``--contract``, else the servers of the operator config alone."""
    if args.contract:
        return load_contract(Path(args.contract), home=ctx.home)
    from truss.contract import load_contract_text

    config = ctx.config_file
    if not config.exists():
        raise UsageError(
            f"truss mcp {args.mcp_command}: no --contract given and no operator config at {config}",
            remedy="Name the contract that declares the server: --contract FILE",
        )
    text = '[contract]\nname = "login"\nintent = "log in to an MCP server"\n'
    return load_contract_text(text, source="(login)", config=(str(config), config.read_text(encoding="utf-8")))


def _seconds(text: str) -> float:
    from truss.contract.fields import duration_ms

    try:
        return duration_ms(text) / 1000.0
    except ValueError:
        raise UsageError(f"--timeout {text!r} is not a duration like 90s or 5m") from None


def _when(ms: Any) -> str:
    if not isinstance(ms, int):
        return "no expiry given"
    import datetime

    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def run_login(args: argparse.Namespace, ctx: Ctx) -> int:
    import sys

    from truss.mcp.oauth import TokenStore
    from truss.mcp.oauth.login import login

    contract = _servers_contract(args, ctx)
    timeout_s = _seconds(args.timeout)
    store = TokenStore(ctx.home / "oauth")

    async def work() -> dict[str, Any]:
        return await login(
            contract, args.server, store=store, clock=ctx.clock, log_dir=_log_dir(ctx), say=ctx.progress,
            read_line=sys.stdin.readline, paste=args.paste, browser=not args.no_browser, timeout_s=timeout_s,
        )  # fmt: skip

    facts = _run(work)
    facts = {**facts, "store": store.backend}
    human = (
        f"logged in to {args.server}: issuer {facts['issuer']}, scopes {' '.join(facts['scopes']) or '(none)'}, "
        f"expires {_when(facts.get('expires_at_ms'))}{', refreshable' if facts.get('refreshable') else ''} "
        f"(kept in the {store.backend} store)"
    )
    ctx.emit(facts, human)
    return 0


def run_logout(args: argparse.Namespace, ctx: Ctx) -> int:
    from truss.mcp.oauth import TokenStore, resource_of

    contract = _servers_contract(args, ctx)
    server = contract.mcp.server(args.server)
    if server is None or server.transport != "http":
        raise UsageError(f"no http MCP server named {args.server!r} is declared")
    store = TokenStore(ctx.home / "oauth")
    issuer = server.oauth.issuer if server.oauth is not None else None
    removed = store.delete(resource_of(server), issuer)
    ctx.emit(
        {"server": args.server, "removed": removed},
        f"forgot {len(removed)} stored grant(s) for {args.server}" if removed else f"nothing stored for {args.server}",
    )
    return 0


def run_auth_status(args: argparse.Namespace, ctx: Ctx) -> int:
    from truss.mcp.oauth import TokenStore

    store = TokenStore(ctx.home / "oauth")
    grants = store.facts()
    now = ctx.clock.now_ms()
    for grant in grants:
        expires = grant.get("expires_at_ms")
        grant["expired"] = isinstance(expires, int) and expires <= now
    rows = [
        [str(g.get("server")), str(g.get("issuer")), " ".join(g.get("scopes") or []) or "-",
         ("expired " if g["expired"] else "") + _when(g.get("expires_at_ms")),
         "yes" if g.get("refreshable") else "no"]
        for g in grants
    ]  # fmt: skip
    human = (
        table(rows, ["server", "issuer", "scopes", "expires", "refreshable"]) if rows else "no OAuth credentials stored"
    )
    ctx.emit({"store": store.backend, "grants": grants}, human + f"\n(store: {store.backend})")
    return 0
