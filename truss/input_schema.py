"""The gate's check of a call's arguments against the tool's input schema (top level only).

``check_arguments`` says why arguments do not fit: a missing required property, or a given
property whose declared JSON type does not match. That is enough to send a model's type mistakes
back to it as an error result instead of to the server. Deeper validation is the server's job
(its errors come back as results too). Pure: values in, a reason or None out.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, cast

__all__ = ["check_arguments"]

_JSON_TYPES: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer()),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


def check_arguments(schema: Mapping[str, Any], arguments: Mapping[str, Any]) -> str | None:
    """Why ``arguments`` do not fit the tool's input schema at the top level, or None."""
    required: Any = schema.get("required") or []
    if isinstance(required, list):
        # The schema is the server's: an entry that is not a string names no argument (and an array
        # or object in it would not even hash), so it is skipped; the server validates the rest.
        missing = [n for n in cast(list[Any], required) if isinstance(n, str) and n not in arguments]
        if missing:
            return "missing required argument(s): " + ", ".join(missing)
    properties: Any = schema.get("properties")
    if not isinstance(properties, dict):
        return None
    for name, value in arguments.items():
        spec: Any = cast(dict[str, Any], properties).get(name)
        if not isinstance(spec, dict):
            continue
        declared: Any = cast(dict[str, Any], spec).get("type")
        kinds: list[Any] = cast(list[Any], declared) if isinstance(declared, list) else [declared]
        checks = [_JSON_TYPES[k] for k in kinds if isinstance(k, str) and k in _JSON_TYPES]
        if checks and not any(check(value) for check in checks):
            return f"argument {name!r} must be of type {' or '.join(str(k) for k in kinds)}"
    return None
