"""Where a key is: key paths, their printed form, and the line of each key in a TOML file's text.

Errors name the key path as ``contract show`` prints the effective contract
(``mcp.servers[1].allow_tools[0]``) and the line and column where the file that supplied the value
says it. ``key_lines`` finds those lines without a second TOML parser. Pure: text in, values out.
"""

from __future__ import annotations

import json
import re
import tomllib

__all__ = ["KeyPath", "format_path", "key_lines"]

KeyPath = tuple[str | int, ...]


def format_path(path: KeyPath) -> str:
    """``("mcp", "servers", 1, "allow_tools", 0)`` -> ``mcp.servers[1].allow_tools[0]``."""
    out = ""
    for seg in path:
        if isinstance(seg, int):
            out += f"[{seg}]"
        else:
            text = seg if re.fullmatch(r"[A-Za-z0-9_-]+", seg) else json.dumps(seg, ensure_ascii=True)
            out += ("." if out else "") + text
    return out


_BARE_KEY = r"[A-Za-z0-9_-]+"
_KEY_PART = rf"(?:{_BARE_KEY}|\"(?:[^\"\\]|\\.)*\"|'[^']*')"
_DOTTED_KEY = re.compile(rf"\s*({_KEY_PART}(?:\s*\.\s*{_KEY_PART})*)\s*")


def _split_key(text: str) -> list[str]:
    parts: list[str] = []
    for match in re.finditer(_KEY_PART, text):
        part = match.group(0)
        if part.startswith('"'):
            try:  # let tomllib decode the escapes, exactly as it did for the data
                part = next(iter(tomllib.loads(f"{part} = 0")))
            except tomllib.TOMLDecodeError:
                part = part[1:-1]
        elif part.startswith("'"):
            part = part[1:-1]
        parts.append(part)
    return parts


def key_lines(text: str) -> dict[KeyPath, tuple[int, int]]:
    """Map each table header and ``key =`` line to its (line, column), with array-of-table indices.

    A light scanner, not a parser: it runs only on text ``tomllib`` has accepted, tracks multi-line
    strings and arrays so their insides are not taken for keys, and leaves keys inside inline
    tables to the line of the key that holds them.
    """
    out: dict[KeyPath, tuple[int, int]] = {}
    counts: dict[KeyPath, int] = {}
    table: KeyPath = ()
    depth = 0
    in_string: str | None = None
    for number, line in enumerate(text.split("\n"), start=1):
        start = 0
        if in_string is None and depth == 0:
            stripped = line.lstrip()
            indent = len(line) - len(stripped)
            header = re.match(rf"(\[\[?)\s*({_KEY_PART}(?:\s*\.\s*{_KEY_PART})*)\s*\]\]?", stripped)
            if header is not None:
                parts = _split_key(header.group(2))
                resolved: list[str | int] = []
                for part in parts[:-1]:
                    resolved.append(part)
                    index = counts.get(tuple(resolved))
                    if index is not None:
                        resolved.append(index)
                resolved.append(parts[-1])
                if header.group(1) == "[[":
                    array = tuple(resolved)
                    counts[array] = counts.get(array, -1) + 1
                    out.setdefault(array, (number, indent + 1))
                    resolved.append(counts[array])
                out.setdefault(tuple(resolved), (number, indent + 1))
                table = tuple(resolved)
                continue
            key = _DOTTED_KEY.match(line)
            if key is not None and line[key.end() : key.end() + 1] == "=" and not stripped.startswith("#"):
                out.setdefault((*table, *_split_key(key.group(1))), (number, indent + 1))
                start = key.end() + 1
        depth, in_string = _scan_value(line, start, depth, in_string)
    return out


def _scan_value(line: str, i: int, depth: int, in_string: str | None) -> tuple[int, str | None]:
    """Advance bracket depth and multi-line string state over one line of a value."""
    n = len(line)
    while i < n:
        if in_string is not None:
            if in_string in ('"""', "'''"):
                end = line.find(in_string, i)
                if end < 0:
                    return depth, in_string
                i = end + 3
                in_string = None
                continue
            ch = line[i]
            if ch == "\\" and in_string == '"':
                i += 2
                continue
            if ch == in_string:
                in_string = None
            i += 1
            continue
        ch = line[i]
        if ch == "#":
            break
        if line.startswith('"""', i) or line.startswith("'''", i):
            in_string = line[i : i + 3]
            i += 3
            continue
        if ch in "\"'":
            in_string = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth = max(0, depth - 1)
        i += 1
    if in_string in ('"', "'"):
        in_string = None  # single-line strings cannot span lines
    return depth, in_string
