"""``truss mcp list|probe|import``: look at MCP servers before trusting them with a run.

``list`` connects a contract's servers and shows, per server, its transport, protocol version and
server info, and per tool whether it is mounted or filtered, its annotations and its pin.
``probe`` connects one server (from a contract, a command or a URL) and reports everything it
says about itself, a round-trip time and, with ``--against``, how its live pins differ from a
contract's. ``import`` turns a Claude-style ``{"mcpServers": ...}`` file into ``[[mcp.servers]]``
TOML. The MCP SDK is imported inside the handlers only. Exit codes: 0 ok, 1 pin drift
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

from truss._errors import ContractError, UsageError
from truss.contract import Contract, Harness, effective_sandbox, load_contract

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

    imp = commands.add_parser("import", help="turn a Claude-style mcpServers JSON file into [[mcp.servers]] TOML")
    imp.add_argument("file", metavar="FILE", help="the JSON file")
    imp.add_argument("-o", "--output", metavar="OUT", help="write the TOML here (refuses to overwrite)")
    imp.add_argument(
        "--probe", action="store_true", help="connect each server and list its tools (read-only ones allowed)"
    )
    imp.set_defaults(handler=run_import)

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


def _log_dir(ctx: Ctx) -> Path:
    return ctx.home / "logs" / ctx.clock.new_id("mcp")


# -- list ----------------------------------------------------------------------------------------


def run_list(args: argparse.Namespace, ctx: Ctx) -> int:
    contract = load_from_args(args, ctx)
    if not contract.mcp.servers:
        ctx.emit({"servers": []}, "the contract declares no MCP servers")
        return 0
    from truss.mcp.client import ServerStatus, connect

    reached = _Reached()

    async def work() -> list[ServerStatus]:
        async with connect(
            contract, log_dir=_log_dir(ctx), clock=ctx.clock, verbose=ctx.verbose, on_event=reached.add
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


def _operator_harness(ctx: Ctx) -> Harness:
    """The operator config's ``[harness]`` (its sandbox level and baseline), or the defaults."""
    import tomllib

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
    server, own_contract = _probe_target(args, ctx)
    _probe_sandbox(server, own_contract, args, ctx)
    against = load_contract(Path(args.against), home=ctx.home) if args.against else own_contract
    contract = _contract_with(server)
    from truss.mcp.client import connect

    reached = _Reached()

    async def work() -> dict[str, Any]:
        async with connect(
            contract, log_dir=_log_dir(ctx), clock=ctx.clock, verbose=ctx.verbose, on_event=reached.add
        ) as mounts:
            status = mounts.servers[server["name"]]
            rtt, method = await mounts.round_trip(server["name"])
        data = {**status.to_json(), **reached.json(status)}
        data["round_trip_ms"] = round(rtt, 2)
        data["round_trip_method"] = method
        return data

    data = _run(work)
    drift = _drift(against, server["name"], data) if against is not None else None
    if drift is not None:
        data["drift"] = drift
    ctx.emit(data, _probe_text(data))
    if drift is not None and any(d["state"] in ("changed", "missing") for d in drift["tools"]):
        return 1
    return 0


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
    if data["transport"] == "stdio":
        lines.extend(_sandbox_lines(data.get("launcher"), data.get("egress") or []))
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
            async with connect(contract, log_dir=_log_dir(ctx), clock=ctx.clock, verbose=ctx.verbose) as mounts:
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
