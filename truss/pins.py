"""Tool definitions by pin, and what changed between two of them.

A pin is the hash of a tool's definition (DESIGN 3.3), so a pin alone cannot say what changed
when a server's tool no longer matches it. ``DefinitionStore`` keeps every definition Truss has
seen, content-addressed under the Truss home (``HOME/pins/<hex>.json``, the RFC 8785 bytes whose
SHA-256 is the pin): written at each connect (``truss.mcp.connect(..., definitions=...)``) and read
back only after the bytes hash to the pin asked for, so a file someone edited is ignored, never
believed. ``changes(old, new)`` is the pure part: a readable list of what differs in the name,
title, description, schemas and annotations. Definitions are server-provided text: every value it
prints is cut short and has control characters replaced.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from truss.ledger.canonical import CanonicalError, canonical, sha256_ref

__all__ = ["DefinitionStore", "PinWriteError", "changes", "set_pins", "summary"]

_PIN_RE = re.compile(r"^sha256:([0-9a-f]{64})\Z")
_MAX_FILE_BYTES = 1 << 20
_MEMBERS = ("name", "title", "description", "inputSchema", "outputSchema", "annotations")
_MAX_LINES = 40
_VALUE_CHARS = 160


class DefinitionStore:
    """Tool definitions by pin in one directory (created on first write, mode 0700)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _path(self, pin: str) -> Path | None:
        match = _PIN_RE.match(pin)
        return self.directory / f"{match.group(1)}.json" if match else None

    def put(self, definition: Mapping[str, Any]) -> str | None:
        """Keep ``definition``; returns its pin (None when it has no canonical form). Never raises for I/O."""
        subset = {k: definition[k] for k in _MEMBERS if definition.get(k) is not None}
        try:
            data = canonical(subset)
        except (CanonicalError, RecursionError):
            return None
        pin = sha256_ref(data)
        path = self._path(pin)
        if path is None or path.exists() or len(data) > _MAX_FILE_BYTES:
            return pin
        with contextlib.suppress(OSError):  # a cache: failing to keep a definition breaks nothing
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)
        return pin

    def get(self, pin: str) -> dict[str, Any] | None:
        """The definition whose pin is ``pin``, or None when none is kept (or the file does not hash to it)."""
        path = self._path(pin)
        if path is None:
            return None
        try:
            if path.stat().st_size > _MAX_FILE_BYTES:
                return None
            data = path.read_bytes()
        except OSError:
            return None
        if sha256_ref(data) != pin:
            return None
        value: Any = json.loads(data)
        return cast(dict[str, Any], value) if isinstance(value, dict) else None


def _short(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
    text = "".join(c if c.isprintable() else "?" for c in " ".join(text.split()))
    return text if len(text) <= _VALUE_CHARS else text[: _VALUE_CHARS - 1] + "…"


def _flatten(value: Any, path: str, out: dict[str, Any]) -> None:
    """JSON pointer -> leaf value (objects and arrays are walked; an empty one is a leaf)."""
    if isinstance(value, Mapping) and value:
        for key, inner in cast(Mapping[str, Any], value).items():
            _flatten(inner, f"{path}/{str(key).replace('~', '~0').replace('/', '~1')}", out)
    elif isinstance(value, list) and value:
        for i, inner in enumerate(cast(list[Any], value)):
            _flatten(inner, f"{path}/{i}", out)
    else:
        out[path or "/"] = value


def changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """What differs from ``old`` to ``new``: one line per changed member or schema path.

    ``~ description: "old" -> "new"``, ``+ inputSchema/properties/x/type: "string"`` (added),
    ``- annotations/readOnlyHint: true`` (removed). At most 40 lines; values cut at 160 characters.
    """
    lines: list[str] = []
    for member in _MEMBERS:
        before, after = old.get(member), new.get(member)
        if before == after:
            continue
        if member in ("name", "title", "description") or not (
            isinstance(before, Mapping | type(None)) and isinstance(after, Mapping | type(None))
        ):
            if before is None:
                lines.append(f"+ {member}: {_short(after)}")
            elif after is None:
                lines.append(f"- {member}: {_short(before)}")
            else:
                lines.append(f"~ {member}: {_short(before)} -> {_short(after)}")
            continue
        flat_old: dict[str, Any] = {}
        flat_new: dict[str, Any] = {}
        _flatten(before, "", flat_old)
        _flatten(after, "", flat_new)
        for path in sorted(set(flat_old) | set(flat_new)):
            where = _short(member + (path if path != "/" else ""))
            if path not in flat_new:
                lines.append(f"- {where}: {_short(flat_old[path])}")
            elif path not in flat_old:
                lines.append(f"+ {where}: {_short(flat_new[path])}")
            elif flat_old[path] != flat_new[path]:
                lines.append(f"~ {where}: {_short(flat_old[path])} -> {_short(flat_new[path])}")
    if len(lines) > _MAX_LINES:
        lines = [*lines[: _MAX_LINES - 1], f"(and {len(lines) - _MAX_LINES + 1} more changes)"]
    return lines


def summary(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    """The members that differ, e.g. ``description, inputSchema`` (for a one-line message)."""
    return ", ".join(m for m in _MEMBERS if old.get(m) != new.get(m)) or "nothing in the pinned members"


# -- writing pins into a contract's text ------------------------------------------------------------

_PIN_LINE = re.compile(r"^(\s*pin\s*=\s*)(\"[^\"]*\"|'[^']*')(.*)$", re.DOTALL)


def _named(table: Any) -> Any:
    return cast(dict[str, Any], table).get("name") if isinstance(table, dict) else None


class PinWriteError(ValueError):
    """The contract's text cannot be edited in place (the caller turns it into a located error)."""


def set_pins(text: str, server: str, pins: Mapping[str, str]) -> str:
    """``text`` with ``pin = "..."`` of each tool in ``pins`` set in server ``server``'s tool entries.

    An edit of the text, not a re-serialization: comments, order and formatting stay. A tool entry
    that has a ``pin`` gets its value replaced on that line; one without gets a ``pin`` line after
    its ``[[mcp.servers.tools]]`` header; a tool without an entry gets a new entry at the end of the
    server's block. The result is parsed again and must equal the old contract with just these pins
    set, else ``PinWriteError`` (as for layouts it does not edit: inline ``tools = [...]`` arrays or
    a server not written as ``[[mcp.servers]]``).
    """
    import copy
    import tomllib

    from truss.contract.locating import key_lines

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PinWriteError(f"the file is not TOML: {exc}") from None
    servers: Any = cast(dict[str, Any], data.get("mcp") or {}).get("servers")
    index = next((i for i, s in enumerate(cast(list[Any], servers or [])) if _named(s) == server), None)
    if not isinstance(servers, list) or index is None:
        raise PinWriteError(f"the file declares no [[mcp.servers]] named {server!r} (it comes from another layer)")
    lines = text.split("\n")
    located = key_lines(text)
    base = ("mcp", "servers", index)

    def header_line(path: tuple[str | int, ...]) -> int | None:
        where = located.get(path)
        if where is None or not lines[where[0] - 1].lstrip().startswith("[["):
            return None
        return where[0]

    start = header_line(base)
    if start is None:
        raise PinWriteError(f"server {server!r} is not written as a [[mcp.servers]] table")
    entry = cast(dict[str, Any], cast(list[Any], servers)[index])
    tools: list[Any] = list(entry.get("tools") or [])
    if tools and header_line((*base, "tools", 0)) is None:
        raise PinWriteError(f"server {server!r} writes its tools as an inline array; edit its pins by hand")
    edits: list[tuple[int, int, list[str]]] = []  # (first line index, lines replaced, new lines)
    appended: list[str] = []
    expected = copy.deepcopy(data)
    expected_tools: list[Any] = cast(dict[str, Any], expected["mcp"]["servers"][index]).setdefault("tools", [])
    for tool, pin in pins.items():
        j = next((k for k, t in enumerate(tools) if _named(t) == tool), None)
        if j is None:
            appended += ["", "[[mcp.servers.tools]]", f"name = {json.dumps(tool)}", f"pin = {json.dumps(pin)}"]
            expected_tools.append({"name": tool, "pin": pin})
            continue
        cast(dict[str, Any], expected_tools[j])["pin"] = pin
        pin_at = located.get((*base, "tools", j, "pin"))
        if pin_at is not None:
            match = _PIN_LINE.match(lines[pin_at[0] - 1])
            if match is None:
                raise PinWriteError(f"the pin of tool {tool!r} (line {pin_at[0]}) is not a one-line string")
            edits.append((pin_at[0] - 1, 1, [match.group(1) + json.dumps(pin) + match.group(3)]))
        else:
            head = header_line((*base, "tools", j))
            if head is None:
                raise PinWriteError(f"tool {tool!r} of server {server!r} is not a [[mcp.servers.tools]] table")
            edits.append((head, 0, [f"pin = {json.dumps(pin)}"]))
    if appended:
        later = [
            where[0]
            for path, where in located.items()
            if where[0] > start and lines[where[0] - 1].lstrip().startswith("[") and tuple(path[:3]) != base
        ]
        end = min(later) - 1 if later else len(lines)
        while end > start and (not lines[end - 1].strip() or lines[end - 1].lstrip().startswith("#")):
            end -= 1
        edits.append((end, 0, appended))
    for first, count, new in sorted(edits, key=lambda e: e[0], reverse=True):
        lines[first : first + count] = new
    result = "\n".join(lines)
    try:
        again = tomllib.loads(result)
    except tomllib.TOMLDecodeError as exc:
        raise PinWriteError(f"the edited text would not parse ({exc}); edit the pins by hand") from None
    if again != expected:
        raise PinWriteError("the edited text would change more than the pins; edit them by hand")
    return result
