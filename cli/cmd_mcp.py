"""``truss mcp list|probe|pin|import|login|logout|auth status``: look at MCP servers before trusting them with a run.

``list`` connects a contract's servers and shows, per server, its transport, protocol version and
server info, and per tool whether it is mounted or filtered, its annotations and its pin.
``probe`` connects one server (from a contract, a command or a URL) and reports everything it
says about itself, a round-trip time and, with ``--against``, how its live pins differ from a
contract's. ``pin`` writes the live pins into a contract's tool entries (a text edit, after
printing what changed). ``import`` turns a Claude-style ``{"mcpServers": ...}`` file into ``[[mcp.servers]]``
TOML. ``login`` runs the OAuth authorization code flow once for a server with
``[mcp.servers.oauth]`` (a person, a browser or a pasted redirect), ``logout`` forgets its tokens,
``auth status`` lists the stored grants (issuer, scopes, expiry; never a token): docs/oauth.md.
The MCP SDK is imported inside the handlers only. Exit codes: 0 ok, 1 pin drift
(``probe --against``, ``pin`` without ``--write``), 2 bad input, 4 a server failed, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from truss_cli._ctx import Ctx, table
from truss_cli.cmd_contract import add_contract_args, load_from_args

from truss._errors import ContractError, ServerStartError, UsageError
from truss._suggest import closest

if TYPE_CHECKING:  # the contract models (pydantic) load only in the handlers that read a contract
    from truss.contract import Contract, Harness

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
    probe.add_argument(
        "--sandbox",
        action="store_true",
        help="start the stdio server confined (its contract's sandbox, else the operator's baseline) and show "
        "the profile and what it tried to reach",
    )
    probe.add_argument("--command", nargs=argparse.REMAINDER, metavar="CMD", help="a stdio server command line")
    probe.set_defaults(handler=run_probe)

    pin = commands.add_parser(
        "pin",
        help="connect a contract's servers and write their current pins into its tool entries",
        description="Connect CONTRACT's servers (their pins ignored), compare each allowlisted tool's live "
        "pin with the contract's and print what changed (the definitions' difference where Truss has seen "
        "the pinned one). With --write, set the new pins in CONTRACT's [[mcp.servers.tools]] entries, "
        "editing the text in place (comments and layout kept). Exit 0 all current or written, 1 pins "
        "differ and --write was not given, 2 bad input, 4 a server failed.",
    )
    add_contract_args(pin)
    pin.add_argument("--write", action="store_true", help="write the new pins into CONTRACT (default: only print)")
    pin.add_argument("--server", action="append", default=[], metavar="NAME", help="only this server (repeatable)")
    pin.set_defaults(handler=run_pin)

    imp = commands.add_parser(
        "import",
        help="turn a Claude-style mcpServers JSON file into a contract skeleton (or operator config)",
        description='Read a Claude-style {"mcpServers": ...} file and write a contract skeleton ([contract] '
        "and [[mcp.servers]]; allow_tools left to you, or the read-only tools allowed and pinned with "
        "--probe), or with --config the server definitions for HOME/config.toml.",
    )
    imp.add_argument("file", metavar="FILE", help="the JSON file")
    imp.add_argument("-o", "--output", metavar="OUT", help="write the TOML here (refuses to overwrite)")
    imp.add_argument(
        "--probe", action="store_true", help="connect each server and list its tools (read-only ones allowed)"
    )
    imp.add_argument(
        "--config",
        action="store_true",
        help="write operator config (server definitions for HOME/config.toml) instead of a contract skeleton",
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
    import anyio

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
    contract = load_from_args(args, ctx, require_params=False)  # params reach no server: only a run needs them
    if not contract.mcp.servers:
        ctx.emit({"servers": []}, "the contract declares no MCP servers")
        return 0
    from truss.mcp.client import ServerStatus, connect

    reached = _Reached()

    async def work() -> list[ServerStatus]:
        async with connect(
            contract,
            log_dir=_log_dir(ctx),
            clock=ctx.clock,
            verbose=ctx.verbose,
            definitions=ctx.definitions(),
            auth=_auth(ctx),
            on_event=reached.add,
        ) as mounts:
            return [mounts.servers[s.name] for s in contract.mcp.servers]

    statuses = _run(work)
    blocks = [_server_block(s, full_pins=False, egress=reached.of(s.name)) for s in statuses]
    servers = [{**s.to_json(), **reached.json(s)} for s in statuses]
    ctx.emit({"servers": servers}, "\n\n".join(blocks))
    return 0


class _Reached:
    """What each server tried to reach through its sandbox's egress proxy (``sandbox_egress`` reports)."""

    def __init__(self) -> None:
        self.attempts: dict[str, list[dict[str, Any]]] = {}

    def add(self, server: str, name: str, attributes: Mapping[str, Any]) -> None:
        if name == "sandbox_egress":
            self.attempts.setdefault(server, []).append(dict(attributes))

    def of(self, server: str) -> list[dict[str, Any]]:
        return self.attempts.get(server, [])

    def json(self, status: Any) -> dict[str, Any]:
        launcher: Mapping[str, Any] = status.launcher or {}
        return {"egress": self.of(status.name)} if launcher.get("kind") == "sandbox" else {}


def _size(value: Any) -> str:
    if not isinstance(value, int):
        return "-"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= size and value % size == 0:
            return f"{value // size} {unit}"
    return f"{value} B"


def _sandbox_lines(launcher: Mapping[str, Any] | None, egress: list[dict[str, Any]]) -> list[str]:
    """The sandbox a stdio server got, and what it tried to reach, as ``(label, text)`` lines."""
    if not launcher or launcher.get("kind") != "sandbox":
        return [f"sandbox       none ({(launcher or {}).get('kind', 'plain')}: runs with Truss's authority)"]
    box: Mapping[str, Any] = launcher.get("sandbox") or {}
    if box.get("confined") is False:
        return [f"sandbox       NOT CONFINED: bubblewrap cannot run here ({box.get('fallback')}), required = false"]
    limits: Mapping[str, Any] = box.get("limits") or {}
    shown = [f"memory {_size(limits.get('memory'))}" if limits.get("memory") else "",
             f"processes {limits['processes']}" if limits.get("processes") else "",
             f"cpu {limits['cpu_s']}s" if limits.get("cpu_s") else "",
             f"file_size {_size(limits.get('file_size'))}" if limits.get("file_size") else ""]  # fmt: skip
    network = str(box.get("network"))
    if network == "allow":
        network += " to " + (", ".join(map(str, box.get("allow_hosts") or [])) or "no host")
    binds: list[Mapping[str, Any]] = list(box.get("binds") or [])
    masked: list[Any] = list(box.get("masked") or [])
    lines = [
        f"sandbox       bubblewrap {box.get('bwrap_version')}, network {network}, "
        f"limits {', '.join(x for x in shown if x) or 'none'}, required {str(box.get('required')).lower()}",
        *(f"  {b.get('mode')}  {_clean(str(b.get('path')))}  ({b.get('why')})" for b in binds),
        *(f"  masked  {_clean(str(m))}" for m in masked),
    ]
    if not egress:
        lines.append("reached       nothing through the egress proxy")
    for e in egress:
        what = f"{e.get('decision')} {_clean(str(e.get('host')))}:{e.get('port')}"
        if e.get("summary"):
            what += f" x{e.get('attempts')} (summary)"
        elif e.get("reason"):
            what += f" ({e.get('reason')})"
        lines.append(f"reached       {what}")
    return lines


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


def _server_block(status: Any, *, full_pins: bool, egress: list[dict[str, Any]] | None = None) -> str:
    head = (
        f"{status.name}  {status.transport}  {status.protocol_version}  {_info(status.server_info)}  "
        f"connect {status.connect_ms:.0f} ms"
    )
    if status.transport == "stdio":
        head += "\n" + "\n".join("  " + line for line in _sandbox_lines(status.launcher, egress or []))
    tools: list[dict[str, Any]] = status.to_json()["tools"]
    if not tools:
        return head + "\n  (no tools)"
    lines = [head]
    for tool in tools:
        state = "mounted" if tool["mounted"] else f"filtered ({status.filtered.get(tool['name'], '?')})"
        lines.extend(_tool_lines(tool, state, full_pin=full_pins))
    return "\n".join(lines)


def _printable(text: str) -> str:
    # Tool names come from the server: show control characters escaped, never raw.
    return text if text.isprintable() else repr(text)


_DESCRIPTION_CHARS = 300
_ARG_DESCRIPTION_CHARS = 100
_MAX_ARGS = 40


def _bounded(text: Any, limit: int) -> str:
    """Server-provided text for people: one line, no control characters, at most ``limit`` characters."""
    flat = _clean(" ".join(str(text).split()))
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _type_of(schema: Any) -> str:
    if not isinstance(schema, Mapping):
        return "any"
    spec = cast(Mapping[str, Any], schema)
    kind: Any = spec.get("type")
    if isinstance(kind, list):
        return "|".join(str(k) for k in cast(list[Any], kind))
    if isinstance(kind, str):
        if kind == "array" and isinstance(spec.get("items"), Mapping):
            return f"array of {_type_of(spec['items'])}"
        return kind
    if "enum" in spec:
        return "enum"
    for key in ("anyOf", "oneOf"):
        options: Any = spec.get(key)
        if isinstance(options, list):
            return "|".join(_type_of(o) for o in cast(list[Any], options))
    return "any"


def argument_rows(input_schema: Any) -> list[list[str]]:
    """[name, type, required|optional, description] per top-level property of a tool's input schema."""
    if not isinstance(input_schema, Mapping):
        return []
    schema = cast(Mapping[str, Any], input_schema)
    properties: Any = schema.get("properties")
    if not isinstance(properties, Mapping):
        return []
    required_any: Any = schema.get("required")
    required = {str(r) for r in cast(list[Any], required_any)} if isinstance(required_any, list) else set[str]()
    rows: list[list[str]] = []
    for name, spec in cast(Mapping[str, Any], properties).items():
        description: Any = cast(Mapping[str, Any], spec).get("description") if isinstance(spec, Mapping) else None
        rows.append([
            _bounded(name, 64),
            _bounded(_type_of(spec), 40),
            "required" if name in required else "optional",
            _bounded(description, _ARG_DESCRIPTION_CHARS) if description else "",
        ])  # fmt: skip
    return rows


def _tool_lines(tool: Mapping[str, Any], state: str | None, *, full_pin: bool) -> list[str]:
    """A tool for people: name, state, hints, pin; its description; its arguments as an aligned list."""
    pin = str(tool["pin"])
    pin = pin if full_pin or len(pin) <= 20 else pin[:19] + "…"
    head = [_printable(str(tool["name"]))] + ([state] if state else []) + [_hints(tool["annotations"]), pin]
    lines = ["  " + "  ".join(head)]
    if tool.get("title"):
        lines.append(f"      title: {_bounded(tool['title'], 120)}")
    if tool.get("description"):
        lines.append(f"      {_bounded(tool['description'], _DESCRIPTION_CHARS)}")
    rows = argument_rows(tool.get("input_schema"))
    if rows:
        shown = rows[:_MAX_ARGS]
        lines.append("      arguments:")
        lines.extend("        " + line.rstrip() for line in table(shown).splitlines())
        if len(rows) > len(shown):
            lines.append(f"        (and {len(rows) - len(shown)} more; --json shows the whole schema)")
    elif tool.get("input_schema") is not None:
        lines.append("      arguments: none")
    if tool.get("output_schema") is not None:
        lines.append("      structured output: yes (--json shows its schema)")
    return lines


# -- probe ---------------------------------------------------------------------------------------


def _probe_target(args: argparse.Namespace, ctx: Ctx) -> tuple[dict[str, Any], Contract | None]:
    from truss.contract import load_contract

    chosen = [flag for flag in ("contract", "url", "command") if getattr(args, flag)]
    if len(chosen) != 1:
        raise UsageError(
            "truss mcp probe: give exactly one of --contract FILE SERVER, --url URL, --command CMD [ARG...]",
            remedy="See 'truss mcp probe --help'",
        )
    timeout = args.timeout
    if args.contract:
        file, name = args.contract
        try:
            contract = load_contract(Path(file), home=ctx.home, require_params=False)
        except ContractError as exc:
            # Probing is how allow_tools gets decided: a contract that is refused only for that (an
            # imported skeleton's `allow_tools = []`) can still have its server probed as written.
            raw = _raw_server(Path(file), name)
            if raw is None or not _only_allowlist_problem(exc):
                raise
            ctx.progress(f"truss: note: {file} does not load yet ({exc.message}); probing server {name!r} as written")
            raw.update({"allow_tools": ["*"], "tools": [], "connect_timeout": timeout})
            return raw, None
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


def _only_allowlist_problem(exc: ContractError) -> bool:
    path = str(exc.fields.get("path") or "")
    return path.startswith("mcp.servers[") and "allow_tools is empty" in exc.message


def _raw_server(path: Path, name: str) -> dict[str, Any] | None:
    """Server ``name``'s table as the file writes it (no layers), or None."""
    import tomllib

    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    servers: Any = cast(dict[str, Any], data.get("mcp") or {}).get("servers")
    for entry in cast(list[Any], servers) if isinstance(servers, list) else []:
        if isinstance(entry, dict) and cast(dict[str, Any], entry).get("name") == name:
            return dict(cast(dict[str, Any], entry))
    return None


def _contract_with(server: dict[str, Any]) -> Contract:
    from truss.contract import Contract

    try:
        return Contract.model_validate({"contract": {"name": "probe", "intent": "probe"}, "mcp": {"servers": [server]}})
    except ValueError as exc:
        raise UsageError(f"truss mcp probe: {_first_error(exc)}") from None


def _first_error(exc: ValueError) -> str:
    import pydantic

    if isinstance(exc, pydantic.ValidationError) and exc.errors():
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return f"{where}: {first['msg']}"
    return str(exc)


def _operator_harness(ctx: Ctx) -> Harness:
    """The operator config's ``[harness]`` (its sandbox level and baseline), or the defaults."""
    import tomllib

    from truss.contract import Harness
    from truss.contract.layers import read_toml_file

    if not ctx.config_file.exists():
        return Harness()
    try:
        data = tomllib.loads(read_toml_file(ctx.config_file, role="operator config"))
        return Harness.model_validate(data.get("harness") or {})
    except ValueError as exc:  # tomllib.TOMLDecodeError too
        raise UsageError(
            f"{ctx.config_file}: {_first_error(exc)}",
            remedy="Check it with: truss contract check CONTRACT",
        ) from None


def _probe_sandbox(server: dict[str, Any], contract: Contract | None, args: argparse.Namespace, ctx: Ctx) -> None:
    """Give the probed stdio server the sandbox a run would (a contract's server: its effective one;
    ``--command``: the operator's level and baseline); ``--sandbox`` confines it whatever they say."""
    from truss.contract import effective_sandbox

    if server.get("transport", "stdio") != "stdio":
        if args.sandbox:
            raise UsageError(
                "truss mcp probe --sandbox: a sandbox confines a stdio server Truss starts; an HTTP server is not "
                "a process Truss starts",
                remedy="Drop --sandbox; the operator's [harness] allow_hosts says which hosts HTTP servers may be",
            )
        return
    harness = contract.harness if contract is not None else _operator_harness(ctx)
    current = server.get("sandbox")
    if contract is not None and not args.sandbox:
        return  # the effective contract already decided
    if args.sandbox and current is not None and current.get("enabled") is not False:
        return
    level = "enforced" if args.sandbox else harness.sandbox
    chosen = effective_sandbox(level, harness.sandbox_profile, None, None)
    if chosen is None:
        server.pop("sandbox", None)
    else:
        server["sandbox"] = chosen.model_dump(mode="json", exclude_none=True)


def run_probe(args: argparse.Namespace, ctx: Ctx) -> int:
    from truss.contract import load_contract

    server, own_contract = _probe_target(args, ctx)
    _probe_sandbox(server, own_contract, args, ctx)
    against = load_contract(Path(args.against), home=ctx.home, require_params=False) if args.against else own_contract
    contract = _contract_with(server)
    from truss.mcp.client import connect

    reached = _Reached()

    async def work() -> dict[str, Any]:
        async with connect(
            contract,
            log_dir=_log_dir(ctx),
            clock=ctx.clock,
            verbose=ctx.verbose,
            definitions=ctx.definitions(),
            auth=_auth(ctx),
            on_event=reached.add,
        ) as mounts:
            status = mounts.servers[server["name"]]
            rtt, method = await mounts.round_trip(server["name"])
        data = {**status.to_json(), **reached.json(status)}
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
    if oauth is None or not (
        oauth.get("resource") or oauth.get("authorization_servers") or oauth.get("authorization_server")
    ):
        # No OAuth metadata behind the refusal: a credential problem (or a broken OAuth setup), reported
        # as the failed connect it is, with the advice of truss.mcp._authfail.
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
        row: dict[str, Any] = {"tool": tool, "state": state, "expected": expected, "actual": actual}
        if actual is None:
            close = closest(tool, sorted(pins))
            if close is not None:
                row["did_you_mean"] = close
        rows.append(row)
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
    if data["transport"] == "stdio":
        lines.extend(_sandbox_lines(data.get("launcher"), data.get("egress") or []))
    lines.append(f"tools         {len(data['tools'])}")
    for tool in data["tools"]:
        lines.extend(_tool_lines(tool, None, full_pin=True))
    drift = data.get("drift")
    if drift is not None:
        lines.append(f"pins against the contract's server {drift['server']!r}:")
        drift_rows = [
            [d["tool"], d["state"] + (f" (did you mean {d['did_you_mean']!r}?)" if d.get("did_you_mean") else ""),
             d["expected"] or "-", d["actual"] or "-"]
            for d in drift["tools"]
        ]  # fmt: skip
        lines.extend("  " + line for line in table(drift_rows, ["TOOL", "STATE", "CONTRACT", "LIVE"]).splitlines())
    return "\n".join(lines)


# -- pin -------------------------------------------------------------------------------------------


def run_pin(args: argparse.Namespace, ctx: Ctx) -> int:
    from truss.pins import PinWriteError, changes, set_pins

    contract = load_from_args(args, ctx, require_params=False)
    wanted = list(args.server) or [s.name for s in contract.mcp.servers]
    unknown = [name for name in wanted if contract.mcp.server(name) is None]
    if unknown:
        declared = ", ".join(s.name for s in contract.mcp.servers) or "none"
        raise UsageError(f"--server {unknown[0]!r}: the contract declares no such server (declared: {declared})")
    if not wanted:
        ctx.emit({"servers": [], "written": False}, "the contract declares no MCP servers")
        return 0
    unpinned: list[dict[str, Any]] = []
    for name in wanted:
        server = contract.mcp.server(name)
        assert server is not None
        data = server.model_dump(by_alias=True, mode="json", exclude_none=True)
        entries: list[dict[str, Any]] = list(data.get("tools") or [])
        data["tools"] = [{k: v for k, v in t.items() if k != "pin"} for t in entries]
        unpinned.append(data)
    probe = _contract_with_all(unpinned, keep_allow=True, command="pin")
    from truss.mcp.client import ServerStatus, connect

    async def work() -> list[ServerStatus]:
        async with connect(
            probe, log_dir=_log_dir(ctx), clock=ctx.clock, verbose=ctx.verbose, definitions=ctx.definitions()
        ) as mounts:
            return [mounts.servers[name] for name in wanted]

    statuses = _run(work)
    store = ctx.definitions()
    report: list[dict[str, Any]] = []
    updates: dict[str, dict[str, str]] = {}
    for status in statuses:
        declared = contract.mcp.server(status.name)
        assert declared is not None
        rows: list[dict[str, Any]] = []
        for tool in status.tools:
            if not tool.mounted:
                continue
            settings = declared.tool_settings(tool.name)
            old = settings.pin if settings is not None else None
            row: dict[str, Any] = {"tool": tool.name, "contract": old, "live": tool.pin}
            if old == tool.pin:
                row["state"] = "ok"
            else:
                row["state"] = "unpinned" if old is None else "changed"
                updates.setdefault(status.name, {})[tool.name] = tool.pin
                if old is not None:
                    before = store.get(old)
                    row["changes"] = changes(before, tool.definition) if before is not None else None
            rows.append(row)
        report.append({"server": status.name, "tools": rows})
    written: list[str] = []
    if updates and args.write:
        path = Path(args.contract)
        text = _read_text(path)
        edited = text
        for server_name, pins in updates.items():
            try:
                edited = set_pins(edited, server_name, pins)
            except PinWriteError as exc:
                raise ContractError(
                    f"cannot write the pins of server {server_name!r}: {exc}",
                    remedy="Write the pins shown above by hand, or declare the server in this file",
                    file=str(path),
                ) from None
            written.append(server_name)
        tmp = path.with_name(f".{path.name}.pin.tmp")
        tmp.write_text(edited, encoding="utf-8")
        os.replace(tmp, path)
    data_out = {"servers": report, "written": bool(written), "file": args.contract}
    ctx.emit(data_out, _pin_text(report, updates, written=bool(written), file=args.contract))
    return 1 if updates and not written else 0


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ContractError(f"cannot read {path}: {type(exc).__name__}", file=str(path)) from None


def _pin_text(report: list[dict[str, Any]], updates: Mapping[str, Any], *, written: bool, file: str) -> str:
    lines: list[str] = []
    for server in report:
        lines.append(f"server {server['server']}")
        for row in server["tools"]:
            name = _printable(row["tool"])
            if row["state"] == "ok":
                lines.append(f"  = {name}  {row['live']}")
                continue
            was = row["contract"] or "(unpinned)"
            lines.append(f"  {'+' if row['state'] == 'unpinned' else '~'} {name}  {was} -> {row['live']}")
            if row["state"] == "changed":
                diff = row.get("changes")
                if diff is None:
                    lines.append("      (the pinned definition was never seen here: review the new one with "
                                 "`truss mcp probe --contract FILE SERVER`)")  # fmt: skip
                else:
                    lines.extend(f"      {line}" for line in diff or ["(no difference in the pinned members)"])
    count = sum(len(p) for p in updates.values())
    if not count:
        lines.append("every pin is current; nothing to write")
    elif written:
        lines.append(f"wrote {count} pin(s) into {file}")
    else:
        lines.append(f"{count} pin(s) differ; review the changes, then write them with: truss mcp pin {file} --write")
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
            async with connect(
                contract,
                log_dir=_log_dir(ctx),
                clock=ctx.clock,
                verbose=ctx.verbose,
                definitions=ctx.definitions(),
                auth=_auth(ctx),
            ) as mounts:
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
    rendered = render_toml(servers, source=source.name, config=bool(args.config))
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
        "form": "config" if args.config else "contract",
        "toml": rendered,
    }
    if out is None:
        human = rendered
    elif args.config:
        human = (f"wrote {len(servers)} server definition(s) to {out}; as HOME/config.toml they are offered to "
                 "every contract, which mounts one by naming it with its own allow_tools")  # fmt: skip
    else:
        names = [s.table["name"] for s in servers]
        todo = ("check it with: truss contract check " + str(out) if args.probe
                else f"fill in allow_tools (truss mcp probe --contract {out} {names[0] if names else 'NAME'} "
                "lists the tools), then: truss contract check " + str(out))  # fmt: skip
        human = f"wrote a contract skeleton with {len(servers)} server(s) to {out}; {todo}"
    ctx.emit(summary, human)
    return 0


def _contract_with_all(tables: list[dict[str, Any]], *, keep_allow: bool = False, command: str = "import") -> Contract:
    from truss.contract import Contract

    servers = [table if keep_allow else {**table, "allow_tools": ["*"]} for table in tables]
    try:
        return Contract.model_validate({"contract": {"name": command, "intent": "probe"}, "mcp": {"servers": servers}})
    except ValueError as exc:
        raise UsageError(f"truss mcp {command}: {_first_error(exc)}") from None


# -- OAuth: login, logout, auth status -------------------------------------------------------------


def _servers_contract(args: argparse.Namespace, ctx: Ctx) -> Contract:
    """The contract named by ``--contract``, else the servers of the operator config alone."""
    from truss.contract import load_contract

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
