"""Narrowing untrusted JSON (or TOML) values to the shapes code expects, with types that say so.

A value parsed from JSON is ``Any``; ``isinstance(value, dict)`` tells a type checker only that it
is a dict of unknown keys and values. These helpers check the shape at run time and return it
typed (object keys of parsed JSON and TOML are always strings), or ``None`` for another shape,
so callers read untrusted data without casts or type-checker suppressions. They copy nothing.
``loads`` is ``json.loads`` for bytes, a little faster for the usual UTF-8 object or array.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, cast

__all__ = ["as_dict", "as_list", "as_loose_mapping", "as_mapping", "loads", "str_list"]

_DECODE = json.JSONDecoder().decode


def loads(data: bytes) -> Any:
    """``json.loads(data)``, without its encoding detection for what it would find to be UTF-8: a JSON
    object or array whose second byte is not NUL (no byte-order mark, no UTF-16 or UTF-32) is decoded
    as ``json.loads`` decodes it (UTF-8, surrogates passed through); anything else goes to it. Every
    entry a verified read parses and every payload a replay reads is one."""
    if data[:1] in (b"{", b"[") and data[1:2] != b"\x00":
        return _DECODE(data.decode("utf-8", "surrogatepass"))
    return json.loads(data)


def as_mapping(value: object) -> Mapping[str, Any] | None:
    """``value`` as a mapping when it is one (a parsed JSON object), else ``None``."""
    return cast("Mapping[str, Any]", value) if isinstance(value, Mapping) else None


def as_loose_mapping(value: object) -> Mapping[object, Any] | None:
    """``value`` as a mapping whose keys are not known to be strings (a caller's own object)."""
    return cast("Mapping[object, Any]", value) if isinstance(value, Mapping) else None


def as_dict(value: object) -> dict[str, Any] | None:
    """``value`` when it is a ``dict`` (a parsed JSON object), else ``None``."""
    return cast("dict[str, Any]", value) if isinstance(value, dict) else None


def as_list(value: object) -> list[Any] | None:
    """``value`` when it is a ``list`` (a parsed JSON array), else ``None``."""
    return cast("list[Any]", value) if isinstance(value, list) else None


def str_list(value: object) -> list[str] | None:
    """``value`` when it is a list of strings only, else ``None``."""
    items = as_list(value)
    if items is None or not all(isinstance(item, str) for item in items):
        return None
    return cast("list[str]", items)
