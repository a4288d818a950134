"""Pydantic's validation errors as one located ``ContractError``, in words a contract's author reads.

The models raise pydantic errors with a location inside the *effective* data; this module picks
the error that says the most, turns its location into a key path of the effective contract, says
what was expected ("expected a string, found an integer 30"), lists the allowed keys for an
unknown one, and blames the layer that supplied the value so that the error names its file and
line. Pure.
"""

from __future__ import annotations

from typing import Any, cast, get_args, get_origin

from pydantic import BaseModel, ValidationError

from truss._errors import ContractError
from truss.contract.fields import KeyValueError, toml_type
from truss.contract.layers import Layer, allowed_remedy, error_in, field_keys, short
from truss.contract.locating import KeyPath
from truss.contract.models import Contract

__all__ = ["CONTRACT_KEYS", "from_validation"]

CONTRACT_KEYS = ("contract", "agent", "budget", "policy", "mcp", "done", "ledger")
"""The tables a contract file may hold."""

_DURATION_KEYS = frozenset({
    "deadline", "call_timeout", "connect_timeout", "request_timeout", "memo", "timeout", "schedule_delay",
    "shutdown_timeout",
})  # fmt: skip

_TYPE_WORDS = {
    "string_type": "a string",
    "int_type": "an integer",
    "int_from_float": "a whole number",
    "float_type": "a number",
    "bool_type": "a boolean (true or false)",
    "list_type": "an array",
    "dict_type": "a table",
    "model_type": "a table",
    "model_attributes_type": "a table",
}


def _loc_to_path(data: Any, loc: tuple[str | int, ...], error_type: str) -> KeyPath:
    """Keep the loc segments that are real keys or indices of ``data`` (drop union member labels)."""
    path: list[str | int] = []
    cur: Any = data
    for i, seg in enumerate(loc):
        if isinstance(cur, dict) and isinstance(seg, str) and seg in cur:
            path.append(seg)
            cur = cast(dict[str, Any], cur)[seg]
        elif isinstance(cur, list) and isinstance(seg, int) and 0 <= seg < len(cast(list[Any], cur)):
            path.append(seg)
            cur = cast(list[Any], cur)[seg]
        elif i == len(loc) - 1 and error_type == "missing" and isinstance(seg, str):
            path.append(seg)
    return tuple(path)


def _model_at(path: KeyPath, root: type[BaseModel] = Contract) -> type[BaseModel] | None:
    """The model class whose table sits at ``path`` of a ``root`` (for listing the allowed keys)."""
    model: type[BaseModel] = root
    annotation: Any = root
    for seg in path:
        if isinstance(seg, int):
            annotation = _unwrap(annotation, list)
            continue
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            model = annotation
            field = next((f for n, f in model.model_fields.items() if (f.alias or n) == seg), None)
            if field is None:
                return None
            annotation = field.annotation
        else:
            annotation = _unwrap(annotation, dict)
        while get_origin(annotation) is not None and get_origin(annotation) not in (list, dict):
            inner = [a for a in get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
            annotation = inner[0] if inner else get_args(annotation)[0]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _unwrap(annotation: Any, container: type) -> Any:
    args = get_args(annotation)
    if get_origin(annotation) is container and args:
        return args[-1]
    return annotation


def from_validation(
    exc: ValidationError, layers: list[Layer], effective: dict[str, Any], *, root: type[BaseModel] = Contract
) -> ContractError:
    """The first of pydantic's errors (the deepest) as one located ``ContractError``; pydantic's text never shows.

    ``root`` is the model ``effective`` was validated against (a contract, or another table of the
    operator config such as ``[telemetry]``).
    """
    errors = exc.errors(include_url=False)
    # Of a union's failed branches, the one that got deepest into the value says the most.
    paths = [_loc_to_path(effective, tuple(e["loc"]), e["type"]) for e in errors]
    pick = max(range(len(errors)), key=lambda i: (len(paths[i]), -i))
    first, path = errors[pick], paths[pick]
    kind = first["type"]
    key = str(path[-1]) if path and isinstance(path[-1], str) else None
    value = first.get("input")
    ctx: dict[str, Any] = dict(first.get("ctx") or {})
    remedy: str | None = None
    if kind == "extra_forbidden":
        message = f"unknown key {key!r}"
        model = _model_at(path[:-1], root)
        top = CONTRACT_KEYS if root is Contract else tuple(field_keys(root))
        allowed = top if len(path) == 1 else sorted(field_keys(model)) if model else None
        remedy = allowed_remedy(sorted(allowed)) if allowed else "Remove it or fix its spelling"
    elif kind == "missing":
        message = f"missing required key {key!r}"
        remedy = f"Add {key} to this table (see docs/contracts.md)"
    elif kind in _TYPE_WORDS:
        message = f"expected {_TYPE_WORDS[kind]}, found {toml_type(value)} {short(value)}"
        if key in _DURATION_KEYS:
            remedy = 'Durations are strings with a unit: "500ms", "30s", "5m", "2h", "1d"'
        elif key is not None and key.endswith("_bytes"):
            remedy = "Sizes are whole numbers of bytes, e.g. 1048576"
        else:
            remedy = f"Write {_TYPE_WORDS[kind]} here"
    elif kind == "literal_error":
        message = f"{short(value)} is not allowed here"
        remedy = f"Use one of {ctx.get('expected', 'the documented values')}"
    elif kind == "value_error":
        error = ctx.get("error")
        message = str(error or first["msg"])
        remedy = error.remedy if isinstance(error, KeyValueError) else "See docs/contracts.md for this key"
        if isinstance(error, KeyValueError) and error.at:
            path = (*path, *error.at)  # the offending value, so the error names the layer that wrote it
    elif kind in ("greater_than_equal", "greater_than"):
        message = f"{short(value)} is too small (must be at least {ctx.get('ge', ctx.get('gt'))})"
    elif kind in ("less_than_equal", "less_than"):
        message = f"{short(value)} is too large (must be at most {ctx.get('le', ctx.get('lt'))})"
    elif kind in ("string_too_short", "string_too_long"):
        message = f"the string has the wrong length ({first['msg'].lower()})"
    else:
        message = str(first["msg"])
    if remedy is None:
        remedy = "See docs/contracts.md for what this key takes"
    others = [q for q in paths if q[: len(path)] != path and path[: len(q)] != q]
    if others:
        remedy = (remedy + "; " if remedy else "") + f"{len(others)} more problem(s) may follow once this is fixed"
    return error_in(layers, effective, path, message, remedy=remedy)
