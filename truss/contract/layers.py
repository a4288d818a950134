"""The layers of a contract: reading each file, checking its values, and merging them into the effective data.

The loader (``truss.contract.loading``) builds the effective contract from its layers, most
general first::

    built-in defaults (the models) <- $TRUSS_HOME/config.toml <- --agent FILE <- the contract
                                   <- --mcp-config FILE (overlay)

Tables merge key by key, arrays are replaced whole, and ``[[mcp.servers]]`` merge by ``name``.
Operator-config servers are definitions that apply only to servers the contract names (their
``sandbox`` tables excepted: those are ceilings, applied by the loader); an overlay may only refine
servers the contract has; ``[harness]`` is read only from the operator config.
``[telemetry]`` too, and it stays out of the effective contract (``truss.contract.telemetry``), as
does ``[harness] db`` (the ledger, ``truss.contract.harness_db``).
Each parsed file is a ``Layer`` kept with its text, so that an error found in the merged data is
blamed on the layer that supplied the value (``error_in``) with its line. Reading files
(``read_toml_file``) is the only I/O in the contract package.
"""

from __future__ import annotations

import datetime
import math
import re
import stat
import tomllib
from pathlib import Path
from typing import Any, cast

from pydantic import BaseModel

from truss._errors import ContractError
from truss.contract.locating import KeyPath, format_path, key_lines
from truss.contract.servers import Server
from truss.ledger.canonical import number_problem

__all__ = [
    "CONFIG_KEYS",
    "MAX_FILE_BYTES",
    "MAX_NESTING",
    "OPERATOR_ONLY",
    "Layer",
    "allowed_remedy",
    "decode_toml_bytes",
    "error_in",
    "field_keys",
    "harness_settings",
    "merge_layers",
    "parse_layer",
    "read_toml_file",
    "servers_of",
    "short",
]

MAX_FILE_BYTES = 1 << 20
"""A contract, config, agent or overlay file larger than this is refused unread."""

MAX_NESTING = 32
"""Tables and arrays nested deeper than this are refused (the canonical encoder stops at 128)."""

CONFIG_KEYS = ("agent", "budget", "policy", "mcp", "ledger", "harness", "telemetry")
"""The tables the operator config may hold."""

OPERATOR_ONLY = ("telemetry",)
"""Operator-config tables that are not part of the effective contract (never hashed or recorded)."""


class Layer:
    """One parsed file of the stack, kept with its text so errors can point at lines."""

    def __init__(self, role: str, file: str, text: str, data: dict[str, Any]) -> None:
        self.role = role
        self.file = file
        self.text = text
        self.data = data
        self._lines: dict[KeyPath, tuple[int, int]] | None = None

    def where(self, path: KeyPath) -> tuple[int | None, int | None]:
        """Line and column of the deepest prefix of ``path`` that the source text shows."""
        if self._lines is None:
            self._lines = key_lines(self.text)
        for end in range(len(path), 0, -1):
            found = self._lines.get(path[:end])
            if found is not None:
                return found
        return None, None

    def error(self, message: str, path: KeyPath = (), *, remedy: str | None = None, **fields: Any) -> ContractError:
        line, column = self.where(path) if path else (None, None)
        return ContractError(
            message, remedy=remedy, file=self.file, path=format_path(path) or None, line=line, column=column, **fields
        )


def read_toml_file(path: Path | str, *, role: str = "contract") -> str:
    """The text of a TOML file, or a ``ContractError`` saying plainly why it cannot be used."""
    file = str(path)
    where = Path(path)
    try:
        info = where.stat()
    except FileNotFoundError:
        raise ContractError(
            f"the {role} file does not exist", file=file, remedy="Check the path and the current directory"
        ) from None
    except OSError as exc:
        raise ContractError(
            f"cannot read the {role} file: {exc.strerror or exc}", file=file, remedy="Check the path and permissions"
        ) from None
    if stat.S_ISDIR(info.st_mode):
        raise ContractError(
            f"the {role} path is a directory, not a TOML file", file=file, remedy="Name the .toml file itself"
        )
    if not stat.S_ISREG(info.st_mode):
        raise ContractError(
            f"the {role} path is not a regular file", file=file, remedy="Name a plain .toml file (not a pipe or device)"
        )
    if info.st_size > MAX_FILE_BYTES:
        raise ContractError(
            f"the {role} file is {info.st_size} bytes, over the {MAX_FILE_BYTES}-byte limit",
            file=file,
            remedy="A contract is a short TOML file; move data out of it",
        )
    try:
        with where.open("rb") as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ContractError(
            f"cannot read the {role} file: {exc.strerror or exc}",
            file=file,
            remedy="Check that the file is readable by this user",
        ) from None
    if len(data) > MAX_FILE_BYTES:
        raise ContractError(
            f"the {role} file is over the {MAX_FILE_BYTES}-byte limit",
            file=file,
            remedy="A contract is a short TOML file; move data out of it",
        )
    return decode_toml_bytes(data, file=file, role=role)


def decode_toml_bytes(data: bytes, *, file: str, role: str = "contract") -> str:
    """UTF-8 text of a TOML file (a leading byte-order mark is dropped); invalid bytes are located."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise ContractError(
            f"the {role} file is not UTF-8 text (byte 0x{data[exc.start]:02x})",
            file=file,
            line=line,
            column=column,
            remedy="Save the file as UTF-8",
        ) from None


def parse_layer(text: str, *, file: str, role: str) -> Layer:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        line: int | None = None
        column: int | None = None
        found = re.search(r"\(at line (\d+), column (\d+)\)$", message)
        if found:
            line, column = int(found.group(1)), int(found.group(2))
        elif message.endswith("(at end of document)"):
            line = text.count("\n") + 1
        base = re.sub(r"\s*\(at [^)]*\)$", "", message)
        raise ContractError(
            f"TOML syntax error: {base}",
            file=file,
            line=line,
            column=column,
            remedy="Fix the TOML at that place (quote strings, one value per key, close every bracket)",
        ) from None
    except RecursionError:
        raise ContractError(
            "the TOML nests too deeply to read",
            file=file,
            remedy=f"Keep tables and arrays under {MAX_NESTING} levels deep",
        ) from None
    layer = Layer(role, file, text, data)
    _check_values(layer, data, ())
    return layer


def _check_values(layer: Layer, value: Any, path: KeyPath) -> None:
    """Refuse values that have no exact JSON form (so cannot be hashed) before anything else."""
    if len(path) > MAX_NESTING:
        raise layer.error(
            f"nested more than {MAX_NESTING} levels deep", path, remedy="Flatten the value; contracts stay shallow"
        )
    if isinstance(value, dict):
        for key, item in cast(dict[str, Any], value).items():
            _check_values(layer, item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(cast(list[Any], value)):
            _check_values(layer, item, (*path, i))
    elif isinstance(value, datetime.date | datetime.time):
        raise layer.error(
            "TOML dates and times are not supported in contracts",
            path,
            remedy='Write the value as a quoted string, e.g. "2026-01-31"',
        )
    elif isinstance(value, float) and not math.isfinite(value):
        raise layer.error("nan and inf have no JSON form", path, remedy="Use a finite number")
    elif (problem := number_problem(value)) is not None:
        raise layer.error(
            f"{problem}, so the contract cannot be hashed and recorded exactly",
            path,
            remedy="Use a number within +/-(2**53 - 1), or write it as a string",
        )


def servers_of(layer: Layer) -> list[dict[str, Any]]:
    """The ``[[mcp.servers]]`` tables of one layer, each checked for a name and known keys."""
    mcp = layer.data.get("mcp")
    if mcp is None:
        return []
    if not isinstance(mcp, dict):
        raise layer.error("[mcp] must be a table", ("mcp",), remedy="Declare servers as [[mcp.servers]] tables")
    servers = cast(dict[str, Any], mcp).get("servers", [])
    if not isinstance(servers, list) or not all(isinstance(s, dict) for s in cast(list[Any], servers)):
        raise layer.error(
            "mcp.servers must be an array of tables",
            ("mcp", "servers"),
            remedy="Declare each server under its own [[mcp.servers]] header",
        )
    known = field_keys(Server)
    seen: dict[str, int] = {}
    out = cast(list[dict[str, Any]], servers)
    for i, server in enumerate(out):
        name = server.get("name")
        if not isinstance(name, str):
            raise layer.error(
                "a server needs a name (a string)",
                ("mcp", "servers", i),
                remedy='Add name = "..." to this [[mcp.servers]] table',
            )
        if name in seen:
            raise layer.error(
                f"server name {name!r} is declared twice (also mcp.servers[{seen[name]}])",
                ("mcp", "servers", i, "name"),
                remedy="Give each server a unique name, or merge the two tables",
            )
        seen[name] = i
        for key in server:
            if key not in known:
                raise layer.error(
                    f"unknown key {key!r} in server {name!r}",
                    ("mcp", "servers", i, key),
                    remedy=allowed_remedy(sorted(known)),
                )
    return out


def _only_servers(layer: Layer, what: str) -> None:
    """The layer's ``[mcp]`` table, if any, holds nothing but ``servers``."""
    mcp: Any = layer.data.get("mcp", {})
    if not isinstance(mcp, dict):
        raise layer.error("[mcp] must be a table", ("mcp",), remedy="Declare servers as [[mcp.servers]] tables")
    for key in cast(dict[str, Any], mcp):
        if key != "servers":
            raise layer.error(
                f"{what} holds only [[mcp.servers]], not mcp.{key}", ("mcp", key), remedy="Remove the key"
            )


def _deep_merge(base: Any, top: Any) -> Any:
    """Tables merge key by key; anything else (arrays included) in ``top`` replaces ``base``."""
    if isinstance(base, dict) and isinstance(top, dict):
        merged = dict(cast(dict[str, Any], base))
        for key, value in cast(dict[str, Any], top).items():
            merged[key] = _deep_merge(merged[key], value) if key in merged else value
        return merged
    return top


def harness_settings(table: Any) -> Any:
    """The operator config's ``[harness]`` table as the ``Harness`` model reads it: without ``db``,
    which says where the record goes, not what a run may do (``truss.contract.harness_db``), so it
    is neither hashed nor validated with the rest. Anything but a table is returned as it is."""
    if not isinstance(table, dict):
        return table
    return {k: v for k, v in cast(dict[str, Any], table).items() if k != "db"}


def merge_layers(config: Layer | None, agent: Layer | None, contract: Layer, overlay: Layer | None) -> dict[str, Any]:
    if config is not None:
        for key in config.data:
            if key not in CONFIG_KEYS:
                raise config.error(
                    f"the operator config may not hold [{key}]",
                    (key,),
                    remedy=f"The operator config holds only {', '.join(CONFIG_KEYS)}; put the rest in a contract",
                )
    if agent is not None:
        for key in agent.data:
            if key != "agent":
                raise agent.error(
                    f"an agent file holds only an [agent] table, not [{key}]",
                    (key,),
                    remedy="Move this table into the contract",
                )
    for key in contract.data:
        if key in OPERATOR_ONLY:
            raise contract.error(
                f"[{key}] is accepted only in the operator config ($TRUSS_HOME/config.toml)",
                (key,),
                remedy="Remove it from the contract; the operator configures telemetry (docs/telemetry.md)",
            )
        if key == "harness":
            raise contract.error(
                "[harness] is accepted only in the operator config ($TRUSS_HOME/config.toml)",
                (key,),
                remedy="Remove it from the contract; the operator sets allow_commands and allow_hosts",
            )
        if key == "param_values":
            raise contract.error(
                "param_values is computed from the caller's params, not written in a contract",
                (key,),
                remedy="Declare params under [contract.params] and pass values with --param",
            )
    if overlay is not None:
        for key in overlay.data:
            if key != "mcp":
                raise overlay.error(
                    f"an --mcp-config overlay holds only [[mcp.servers]], not [{key}]",
                    (key,),
                    remedy="Put other settings in the contract or the agent file",
                )
        _only_servers(overlay, "an --mcp-config overlay")
    if config is not None:
        _only_servers(config, "the operator config")

    effective: dict[str, Any] = {}
    config_servers: dict[str, dict[str, Any]] = {}
    if config is not None:
        config_servers = {s["name"]: s for s in servers_of(config)}
        effective = {k: v for k, v in config.data.items() if k != "mcp" and k not in OPERATOR_ONLY}
        if "harness" in effective:
            effective["harness"] = harness_settings(effective["harness"])
    if agent is not None:
        effective = _deep_merge(effective, agent.data)
    effective = _deep_merge(effective, {k: v for k, v in contract.data.items() if k != "mcp"})

    servers: dict[str, dict[str, Any]] = {}
    for server in servers_of(contract):
        # The operator's sandbox table of a server is a ceiling the contract's table is checked
        # against (truss.contract.sandbox), not a default its keys override: it is not merged here.
        defined = {k: v for k, v in config_servers.get(server["name"], {}).items() if k != "sandbox"}
        servers[server["name"]] = _deep_merge(defined, server)
    if overlay is not None:
        for i, server in enumerate(servers_of(overlay)):
            name = server["name"]
            if name not in servers:
                raise overlay.error(
                    f"the overlay names server {name!r}, which the contract does not declare",
                    ("mcp", "servers", i, "name"),
                    remedy=f"An overlay only refines the contract's servers ({', '.join(servers) or 'none'}); "
                    "add the server to the contract first",
                )
            servers[name] = _deep_merge(servers[name], server)
    mcp_table = contract.data.get("mcp", {})
    mcp_rest = {k: v for k, v in cast(dict[str, Any], mcp_table).items() if k != "servers"}
    effective["mcp"] = {**mcp_rest, "servers": list(servers.values())}
    return effective


def _blame(layers: list[Layer], effective: dict[str, Any], path: KeyPath) -> Layer:
    """The layer that supplied the value at ``path`` of the effective data (the last one that has it)."""
    best: tuple[int, int, Layer] | None = None
    for rank, layer in enumerate(layers):
        depth = _depth_in(layer, effective, path)
        if best is None or depth >= best[0]:
            best = (depth, rank, layer)
    assert best is not None
    return best[2]


def _depth_in(layer: Layer, effective: dict[str, Any], path: KeyPath) -> int:
    """How many leading segments of the effective ``path`` exist in ``layer`` (server indices by name)."""
    mapped = _to_layer_path(layer, effective, path)
    cur: Any = layer.data
    depth = 0
    for seg in mapped:
        if isinstance(cur, dict) and isinstance(seg, str) and seg in cur:
            cur = cast(dict[str, Any], cur)[seg]
        elif isinstance(cur, list) and isinstance(seg, int) and 0 <= seg < len(cast(list[Any], cur)):
            cur = cast(list[Any], cur)[seg]
        else:
            break
        depth += 1
    return depth


def _to_layer_path(layer: Layer, effective: dict[str, Any], path: KeyPath) -> KeyPath:
    if len(path) >= 3 and path[0] == "mcp" and path[1] == "servers" and isinstance(path[2], int):
        servers = cast(list[dict[str, Any]], effective.get("mcp", {}).get("servers", []))
        if path[2] < len(servers):
            name = servers[path[2]].get("name")
            own: Any = cast(dict[str, Any], layer.data.get("mcp") or {}).get("servers") or []
            for j, server in enumerate(cast(list[Any], own)):
                if isinstance(server, dict) and cast(dict[str, Any], server).get("name") == name:
                    return ("mcp", "servers", j, *path[3:])
            return ("mcp", "servers", -1)
    return path


def error_in(layers: list[Layer], effective: dict[str, Any], path: KeyPath, message: str, **kw: Any) -> ContractError:
    layer = _blame(layers, effective, path)
    err = layer.error(message, _to_layer_path(layer, effective, path), **kw)
    # The path users read is the effective one (what `contract show` prints); the line is the file's.
    err.fields["path"] = format_path(path) or None
    return err


def field_keys(model: type[BaseModel]) -> set[str]:
    """The keys a model's table accepts, by their TOML names."""
    return {f.alias or n for n, f in model.model_fields.items()}


def allowed_remedy(keys: list[str]) -> str:
    return "Remove it or fix its spelling; the keys allowed here are: " + ", ".join(keys)


def short(value: Any) -> str:
    """``repr(value)``, cut to 60 characters for a message."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
