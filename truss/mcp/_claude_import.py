"""Turning a Claude-style ``{"mcpServers": {...}}`` JSON file into ``[[mcp.servers]]`` TOML.

Pure: values in, values and text out; it neither reads files nor connects to servers, and it
does not import the ``mcp`` SDK. The rules (docs/mcp.md):

- a whole-value ``${VAR}`` in ``env`` becomes ``secret_env = ["VAR"]`` (the variable must keep its
  name: Truss passes a secret under its own name); in ``headers`` it becomes
  ``{ secret_env = "VAR", format = "..." }`` (so ``"Bearer ${TOKEN}"`` works);
- a literal value that looks like a secret (by its key or by its shape) is refused, with every
  such place named, and nothing is written;
- ``${...}`` anywhere else (command, args, url, part of a value) is refused: Truss never
  substitutes into commands, URLs or env;
- a URL's password (the arg's one credential) moves into its client's variable (``PGPASSWORD``);
  two different values for one variable anywhere in the file are refused naming both places, as
  Truss passes one value per variable (``_Variables``);
- ``allow_tools`` is the operator's decision. Without tools (no probe), the emitted server has
  ``allow_tools = []``, which ``truss contract check`` refuses until someone fills it in. With the
  advertised tools (``truss mcp import --probe``), read-only tools are listed with their pins
  and every other tool is written commented out.

What it writes (``render_toml``, docs/mcp.md): by default a contract skeleton (``[contract]`` and
the ``[[mcp.servers]]`` tables) that ``truss contract check``, ``truss mcp list``, ``truss mcp pin``
and, once it has an ``[agent]``, ``truss run`` take as written; with ``config=True`` the operator
config form for ``$TRUSS_HOME/config.toml``: server definitions only, no ``allow_tools`` and no
pins, because there a server is a definition that each contract opts into with its own
allowlist (and pins with ``truss mcp pin``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import tomli_w

from truss._credentials import credentials_in_args, url_credentials
from truss._errors import ContractError
from truss._json import as_mapping, str_list

__all__ = ["ImportedServer", "ProbedTool", "contract_name", "convert", "render_toml"]

_SECRET_KEY = re.compile(
    r"(TOKEN|SECRET|PASSW|_PWD\Z|API_?KEY|ACCESS_?KEY|PRIVATE|CREDENTIAL|AUTH|COOKIE|SESSION)", re.I
)
_SECRET_SHAPES = [
    re.compile(p)
    for p in (
        r"^(ghp|gho|ghu|ghs|ghr)_[A-Za-z0-9]{20,}$",
        r"^github_pat_[A-Za-z0-9_]{20,}$",
        r"^sk-[A-Za-z0-9_-]{16,}$",
        r"^xox[abposr]-[A-Za-z0-9-]{10,}$",
        r"^AKIA[0-9A-Z]{16}$",
        r"^eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.",
        r"^(Bearer|Basic|Token)\s+\S{8,}$",
        r"^[A-Za-z0-9+/_=-]{32,}$",
    )
]
_WHOLE_VAR = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}\Z")
_EMBEDDED_VAR = re.compile(r"^(.*)\$\{([A-Za-z_][A-Za-z0-9_]*)\}(.*)\Z")
_SECRET_HEADERS = {"authorization", "proxy-authorization", "cookie", "x-api-key", "api-key"}


@dataclass(frozen=True)
class ProbedTool:
    """One advertised tool, as ``--probe`` saw it."""

    name: str
    pin: str
    read_only: bool
    destructive: bool


@dataclass
class ImportedServer:
    """One server of the file, as a ``[[mcp.servers]]`` table (``table``) plus notes for the operator."""

    source_name: str
    table: dict[str, Any]
    notes: list[str] = field(default_factory=list[str])
    tools: list[ProbedTool] | None = None


_PATH_LIKE = re.compile(r"^(/|\./|\.\./|~/)[^/]|^[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)+/?\Z")


def _looks_secret(key: str, value: str) -> bool:
    if _SECRET_KEY.search(key) and value.strip():
        return True
    if _PATH_LIKE.match(value) and not any(p.search(value) for p in _SECRET_SHAPES[:-1]):
        # A filesystem path (``/tmp/work/repo``, ``./data``, ``src/x``) has the long-random-string shape
        # but is no secret; the specific token shapes still apply to it.
        return False
    return any(p.search(value) for p in _SECRET_SHAPES)


def _server_name(raw: str, taken: set[str]) -> str:
    name = re.sub(r"[^a-z0-9_-]+", "-", raw.lower()).strip("-_")[:32] or "server"
    if not name[0].isalnum():
        name = "s" + name[:31]
    base, n = name, 2
    while name in taken:
        suffix = f"-{n}"
        name = base[: 32 - len(suffix)] + suffix
        n += 1
    return name


def _has_var(value: str) -> bool:
    return "${" in value


def convert(data: Any, *, source: str) -> list[ImportedServer]:
    """The servers of a parsed Claude-style config; raises ``ContractError`` naming every problem."""
    top = as_mapping(data)
    servers = as_mapping(top.get("mcpServers")) if top is not None else None
    if servers is None:
        raise ContractError(
            'expected a JSON object with an "mcpServers" object',
            remedy='The file should look like {"mcpServers": {"name": {"command": ...}}}',
            file=source,
            path="mcpServers",
        )
    problems: list[str] = []
    out: list[ImportedServer] = []
    taken: set[str] = set()
    book = _Variables()
    for raw_name, spec in servers.items():
        where = f"mcpServers.{raw_name}"
        entry = as_mapping(spec)
        if entry is None:
            problems.append(f"{where}: expected an object")
            continue
        name = _server_name(str(raw_name), taken)
        taken.add(name)
        server = ImportedServer(source_name=str(raw_name), table={"name": name})
        if name != raw_name:
            server.notes.append(f"renamed from {raw_name!r} (server names are [a-z0-9_-])")
        kind = str(entry.get("type") or ("http" if "url" in entry else "stdio")).lower()
        if kind == "stdio":
            _stdio(entry, where, server, problems, book)
        elif kind in ("http", "streamable-http", "streamablehttp"):
            _http(entry, where, server, problems, book)
        else:
            problems.append(f"{where}: transport {kind!r} is not supported (Truss speaks stdio and Streamable HTTP)")
            continue
        out.append(server)
    problems += book.conflicts()
    if problems:
        raise ContractError(
            f"{len(problems)} problem(s) importing {source}: " + "; ".join(problems),
            remedy="Move secret values into environment variables and write them as ${VAR}, then import again",
            file=source,
            problems=problems,
        )
    return out


@dataclass
class _Variables:
    """Which places of the file would take a value from each of Truss's environment variables.

    Truss passes a variable under its own name to every server that lists it, so two passwords
    moved out of URLs into one variable (``PGPASSWORD``), or one moved into a variable the file
    already passes as ``${VAR}``, would silently become one value: ``conflicts`` names both places.
    """

    moved: dict[str, list[tuple[str, str]]] = field(default_factory=dict[str, list[tuple[str, str]]])
    passed: dict[str, list[str]] = field(default_factory=dict[str, list[str]])

    def move(self, variable: str, where: str, password: str) -> None:
        self.moved.setdefault(variable, []).append((where, password))

    def pass_through(self, variable: str, where: str) -> None:
        self.passed.setdefault(variable, []).append(where)

    def conflicts(self) -> list[str]:
        out: list[str] = []
        for variable, places in self.moved.items():
            first_where, first = places[0]
            other = next((w for w, password in places[1:] if password != first), None)
            if other is not None:
                out.append(
                    f"{first_where} and {other} hold two different passwords that would both become {variable}: "
                    f"Truss passes one {variable}, so one password would be lost; give one of these servers its "
                    "password another way (a passfile or service file its client reads) and import again"
                )
            for passed in self.passed.get(variable, []):
                out.append(
                    f"{first_where} holds a password that would become {variable}, which {passed} already passes "
                    f"as ${{{variable}}}: one of the two would be lost; take the password out of the URL (if "
                    f"{variable} holds it) or give it another way, and import again"
                )
        return out


def _stdio(entry: Mapping[str, Any], where: str, server: ImportedServer, problems: list[str], book: _Variables) -> None:
    command = entry.get("command")
    if not isinstance(command, str) or not command:
        problems.append(f"{where}.command: a stdio server needs a command")
        return
    if _has_var(command):
        problems.append(f"{where}.command: ${{...}} is not substituted into commands")
    server.table["transport"] = "stdio"
    server.table["command"] = command
    arg_list = str_list(entry.get("args") or [])
    if arg_list is None:
        problems.append(f"{where}.args: expected a list of strings")
        arg_list = []
    for i, arg in enumerate(arg_list):
        if _has_var(arg):
            problems.append(f"{where}.args[{i}]: ${{...}} is not substituted into arguments")
        elif _looks_secret("", arg) and len(arg) >= 20:
            problems.append(f"{where}.args[{i}]: looks like a secret; pass it through an environment variable")
    arg_list, moved = _credentials_out_of_args(arg_list, where, server, problems, book)
    if arg_list:
        server.table["args"] = arg_list
    if isinstance(entry.get("cwd"), str):
        server.table["cwd"] = entry["cwd"]
    env: Mapping[str, Any] | None = as_mapping(entry.get("env") or {})
    literal: dict[str, str] = {}
    secret: list[str] = []
    if env is None:
        problems.append(f"{where}.env: expected an object")
        env = {}
    for key, value in env.items():
        path = f"{where}.env.{key}"
        if not isinstance(value, str):
            problems.append(f"{path}: expected a string")
            continue
        whole = _WHOLE_VAR.match(value)
        if whole:
            if whole.group(1) != key:
                problems.append(
                    f"{path}: ${{{whole.group(1)}}} under another name; Truss passes a secret under its own "
                    f"name, so export {key} instead"
                )
            else:
                secret.append(key)
                book.pass_through(key, path)
        elif _has_var(value):
            problems.append(f"{path}: only a whole value ${{VAR}} can become secret_env")
        elif _looks_secret(key, value):
            problems.append(f"{path}: a literal secret; write it as ${{{key}}} and export it")
        else:
            literal[key] = value
    for name in dict.fromkeys(moved):
        if name in literal:
            problems.append(
                f"{where}.env.{name} is a literal value, and a password in the args would become {name} "
                f"too: one of the two would be lost; remove one of them and import again"
            )
    if literal:
        server.table["env"] = literal
    # Two URLs of one client with one password: one variable (different passwords: _Variables.conflicts).
    secret += [name for name in dict.fromkeys(moved) if name not in secret]
    if secret:
        server.table["secret_env"] = secret


def _credentials_out_of_args(
    args: list[str], where: str, server: ImportedServer, problems: list[str], book: _Variables
) -> tuple[list[str], list[str]]:
    """``args`` without the credentials it holds, and the variables that now carry them (``secret_env``).

    A password in a URL whose client reads it from a known variable (``PGPASSWORD``) is taken out
    of the URL and the variable suggested; any other credential is a problem naming ``secret_env``.
    The value itself is never copied into the contract or a message.
    """
    out = list(args)
    moved: list[str] = []
    for found in credentials_in_args(args):
        path = f"{where}.args[{found.index}]"
        if found.without is not None and found.env is not None and found.password:
            out[found.index] = found.without
            moved.append(found.env)
            book.move(found.env, path, found.password)
            server.notes.append(
                f"args[{found.index}] held {found.what}: it was taken out; export {found.env} (read by the "
                "server's client library) with it, and Truss passes it to this server only (secret_env)"
            )
        else:
            problems.append(
                f"{path}: holds a credential ({found.what}); take it out of the arguments and pass it in an "
                "environment variable the server reads, listed in secret_env"
            )
    return out, moved


def _http(entry: Mapping[str, Any], where: str, server: ImportedServer, problems: list[str], book: _Variables) -> None:
    url = entry.get("url")
    if not isinstance(url, str) or not re.match(r"^https?://\S+\Z", url):
        problems.append(f"{where}.url: an http server needs an http:// or https:// url")
        return
    if _has_var(url):
        problems.append(f"{where}.url: ${{...}} is not substituted into URLs")
    elif found := url_credentials(url):
        problems.append(
            f"{where}.url: holds a credential ({'; '.join(found)}); send it in a header from an environment variable"
        )
    server.table["transport"] = "http"
    server.table["url"] = url
    headers: Mapping[str, Any] | None = as_mapping(entry.get("headers") or {})
    if headers is None:
        problems.append(f"{where}.headers: expected an object")
        headers = {}
    out: dict[str, Any] = {}
    for key, value in headers.items():
        path = f"{where}.headers.{key}"
        if not isinstance(value, str):
            problems.append(f"{path}: expected a string")
            continue
        embedded = _EMBEDDED_VAR.match(value)
        if embedded and not _has_var(embedded.group(1) + embedded.group(3)):
            fmt = embedded.group(1) + "{}" + embedded.group(3)
            spec: dict[str, str] = {"secret_env": embedded.group(2)}
            book.pass_through(embedded.group(2), path)
            if fmt != "{}":
                spec["format"] = fmt
            out[key] = spec
        elif _has_var(value):
            problems.append(f"{path}: only one ${{VAR}} per header value can become secret_env")
        elif key.lower() in _SECRET_HEADERS or _looks_secret(key, value):
            problems.append(f"{path}: a literal secret; write it as ${{VAR}} and export VAR")
        else:
            out[key] = value
    if out:
        server.table["headers"] = out


def _value(value: Any) -> str:
    """One TOML value; tables are written inline so that a server stays one block."""
    items = as_mapping(value)
    if items is not None:
        if not items:
            return "{}"
        return "{ " + ", ".join(f"{_key(k)} = {_value(v)}" for k, v in items.items()) + " }"
    return tomli_w.dumps({"v": value}).strip()[len("v = ") :]


def _key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else _value(key)


def contract_name(source: str) -> str:
    """A valid contract name from the imported file's name (``claude_config.json`` -> ``claude-config``)."""
    stem = source.rsplit("/", 1)[-1].rsplit(".", 1)[0]
    name = re.sub(r"[^a-z0-9-]+", "-", stem.lower()).strip("-")[:64].strip("-")
    return name if name and name[0].isalnum() else "imported"


def render_toml(servers: Sequence[ImportedServer], *, source: str, config: bool = False) -> str:
    """The TOML for ``servers``: a contract skeleton, or with ``config`` the operator config form
    (see the module docstring), with the operator's to-dos as comments."""
    if config:
        lines = [
            f"# Imported by `truss mcp import --config` from {source}: operator config ($TRUSS_HOME/config.toml).",
            "# These are server definitions, not grants: a contract mounts one only by naming it with its",
            '# own allow_tools, e.g.  [[mcp.servers]] name = "..." allow_tools = ["tool"]  (then pin its',
            "# tools with `truss mcp pin CONTRACT --write`).",
            "",
        ]
    else:
        lines = [
            f"# Imported by `truss mcp import` from {source}: a contract skeleton.",
            "# Review every allow_tools, then `truss contract check` this file; add an [agent] table",
            "# (docs/providers.md) to run it.",
            "",
            "[contract]",
            f"name = {_value(contract_name(source))}",
            f"intent = {_value('use the servers imported from ' + source)}",
            "",
        ]
    for server in servers:
        lines.append("[[mcp.servers]]")
        for note in server.notes:
            lines.append(f"# {note}")
        for key, value in server.table.items():
            if key == "headers":
                continue
            lines.append(f"{key} = {_value(value)}")
        if config:
            lines.extend(_offered_lines(server))
            headers_only: dict[str, Any] = server.table.get("headers") or {}
            if headers_only:
                lines.append(f"headers = {_value(headers_only)}")
            lines.append("")
            continue
        lines.extend(_allow_lines(server))
        headers: dict[str, Any] = server.table.get("headers") or {}
        if headers:
            lines.append(f"headers = {_value(headers)}")
        for tool in server.tools or []:
            if tool.read_only:
                lines.extend(["[[mcp.servers.tools]]", f"name = {_value(tool.name)}", f"pin = {_value(tool.pin)}"])
        lines.append("")
    return "\n".join(lines)


def _offered_lines(server: ImportedServer) -> list[str]:
    if not server.tools:
        return []
    out = ["# Tools it advertised at import (a contract chooses among them):"]
    for tool in server.tools:
        hint = "read-only" if tool.read_only else ("destructive" if tool.destructive else "may write")
        out.append(f"#   {tool.name:<38} {hint}")
    return out


def _allow_lines(server: ImportedServer) -> list[str]:
    if server.tools is None:
        name = server.table["name"]
        return [
            f"# Fill in the tools to mount: `truss mcp probe --contract FILE {name}` lists them (or import",
            "# with --probe). An empty list is refused by `truss contract check` until you decide.",
            "allow_tools = []",
        ]
    if not server.tools:
        return ["# The server advertised no tools.", "allow_tools = []"]
    out = ["# Read-only tools are allowed and pinned; uncomment others only after review.", "allow_tools = ["]
    for tool in server.tools:
        hint = "read-only" if tool.read_only else ("destructive" if tool.destructive else "may write")
        entry = f"{_value(tool.name)},"
        out.append(f"  {entry:<40} # {hint}" if tool.read_only else f"  # {entry:<38} # {hint}")
    out.append("]")
    return out
