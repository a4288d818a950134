"""How Truss answers a server's elicitation request: by the operator's policy, never by asking anyone.

During a tool call a server may ask its client for input: an ``elicitation/create`` request on the
2025-11-25 handshake era, or an ``input_required`` result carrying one on 2026-07-28. Truss runs
unattended, so ``answer`` decides the reply from the server's ``[mcp.servers.elicitation]`` table
(trusted: the operator wrote it) and the request (untrusted: the server wrote it):

1. a URL-mode request is declined (``url_mode``): Truss never opens, follows or hands on a URL a
   server gives;
2. ``action = "decline"`` or ``"cancel"`` is answered as it is (``policy``);
3. ``action = "accept"``: the requested schema must be the flat object of primitive properties the
   MCP specification allows (else ``unsupported_schema``); the content is, per property, the
   contract's value from ``content``, else the property's own ``default`` (SEP-1034), else
   nothing; every value must fit its property (type, enum, bounds; else ``invalid_value``) and
   every required property must have one (else ``missing_required``). Only then is it ``accept``
   (``accepted``). Content keys the request does not ask for are never sent.

A request that cannot be recorded (no RFC 8785 form) is declined too (``unrecordable``): whatever
Truss answers, it records (``Elicited``, in the call's ``mcp_tool_call`` entry; docs/ledger-format.md).
A server gets back its own defaults or the operator's values, nothing else: no grant, no secret, no
model output ever reaches an elicitation answer.

Pure: values in, an ``Answer`` out. The MCP tier (``truss.mcp``) calls it and collects ``Elicited``
records per call in a ``CallElicitations``; the gate records them.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from truss.contract import Elicitation
from truss.ledger.canonical import CanonicalError, canonical

__all__ = ["MAX_PER_CALL", "Answer", "CallElicitations", "Elicited", "answer", "declined", "request_document"]

Action = Literal["accept", "decline", "cancel"]

MAX_PER_CALL = 32
"""Elicitations answered and recorded per call; later ones in the same call are declined (``too_many``)."""
_MAX_PROPERTIES = 256
_MAX_CONTENT_BYTES = 64 * 1024
_PRIMITIVES = ("string", "number", "integer", "boolean")


@dataclass(frozen=True)
class Answer:
    """The reply to one elicitation request, and why: ``reason`` is a code, ``detail`` a sentence."""

    action: Action
    content: dict[str, Any] | None
    reason: str
    detail: str = ""


def declined(reason: str, detail: str) -> Answer:
    return Answer("decline", None, reason, detail[:300])


@dataclass(frozen=True)
class Elicited:
    """One elicitation request a server made during a call, and the answer Truss gave it.

    ``calls_in_flight`` is how many of the server's calls were waiting when the request came on a
    path that does not say which call it belongs to (the 2025-11-25 server-to-client request): each
    of them records it, so a record never goes missing, and a number above 1 tells an auditor so.
    """

    mode: str  # "form" | "url"
    message: str
    requested_schema: Mapping[str, Any] | None
    url_sha256: str | None
    answer: Answer
    calls_in_flight: int = 1


@dataclass
class CallElicitations:
    """The elicitations answered during one call, at most ``MAX_PER_CALL`` of them."""

    records: list[Elicited] = field(default_factory=list[Elicited])
    unrecorded: int = 0

    def full(self) -> bool:
        return len(self.records) >= MAX_PER_CALL

    def add(self, record: Elicited) -> None:
        if self.full():
            self.unrecorded += 1
        else:
            self.records.append(record)


def url_sha256(url: str) -> str:
    """What is recorded of a URL-mode request's URL: its hash (the URL may carry a one-time token)."""
    return "sha256:" + hashlib.sha256(url.encode("utf-8", "replace")).hexdigest()


def request_document(record: Elicited) -> dict[str, Any]:
    """The recorded form of the request (a blob of the call's entry)."""
    if record.mode == "url":
        return {"mode": "url", "message": record.message, "url": record.url_sha256}
    return {"mode": record.mode, "message": record.message, "requestedSchema": record.requested_schema}


def answer(policy: Elicitation, *, mode: str, message: str, requested_schema: Any) -> Answer:
    """The reply to one request, by ``policy`` (see the module docstring for the order of the rules)."""
    if mode != "form":
        return declined("url_mode", "Truss never opens a URL a server asks it to")
    try:
        canonical({"message": message, "requestedSchema": requested_schema})
    except (CanonicalError, RecursionError, TypeError):
        return declined("unrecordable", "the request has no canonical JSON form, so it could not be recorded")
    if policy.action != "accept":
        return Answer(policy.action, None, "policy", f"the contract answers {policy.action}")
    properties = _properties(requested_schema)
    if isinstance(properties, str):
        return declined("unsupported_schema", properties)
    content: dict[str, Any] = {}
    for name, prop in properties.items():
        if name in policy.content:
            value: Any = policy.content[name]
        elif "default" in prop:
            value = prop["default"]
        else:
            continue
        problem = _misfit(prop, value)
        if problem is not None:
            return declined("invalid_value", f"property {name[:64]!r}: {problem}")
        content[name] = value
    schema = cast(dict[str, Any], requested_schema)
    required: Any = schema.get("required", [])
    if not isinstance(required, list):
        return declined("unsupported_schema", "required is not an array")
    for name in cast(list[Any], required):
        if not isinstance(name, str) or name not in properties:
            return declined("unsupported_schema", f"required names {str(name)[:64]!r}, which is not a property")
        if name not in content:
            return declined("missing_required", f"required property {name[:64]!r} has no default and no contract value")
    if len(canonical(content)) > _MAX_CONTENT_BYTES:
        return declined("too_large", f"the content would be over {_MAX_CONTENT_BYTES} bytes")
    return Answer("accept", content, "accepted", f"{len(content)} of {len(properties)} properties answered")


def _properties(schema: Any) -> dict[str, dict[str, Any]] | str:
    """The requested schema's properties, or why it is not the flat object the specification allows."""
    if not isinstance(schema, dict):
        return "the requested schema is not an object"
    typed = cast(dict[str, Any], schema)
    if typed.get("type") != "object":
        return "the requested schema's type is not 'object'"
    properties: Any = typed.get("properties", {})
    if not isinstance(properties, dict):
        return "the requested schema's properties are not an object"
    props = cast(dict[str, Any], properties)
    if len(props) > _MAX_PROPERTIES:
        return f"the requested schema has over {_MAX_PROPERTIES} properties"
    out: dict[str, dict[str, Any]] = {}
    for name, prop in props.items():
        if not isinstance(prop, dict):
            return f"property {name[:64]!r} is not a schema object"
        spec = cast(dict[str, Any], prop)
        kind = spec.get("type")
        if kind not in (*_PRIMITIVES, "array"):
            return f"property {name[:64]!r} has type {str(kind)[:32]!r}, not a primitive"
        out[name] = spec
    return out


def _choices(spec: Mapping[str, Any]) -> list[Any] | None:
    """The values an enum property allows (``enum``, or ``oneOf``/``anyOf`` of ``const``), or None."""
    enum: Any = spec.get("enum")
    if isinstance(enum, list):
        return cast(list[Any], enum)
    for key in ("oneOf", "anyOf"):
        options: Any = spec.get(key)
        if isinstance(options, list):
            items = cast(list[Any], options)
            return [cast(dict[str, Any], o).get("const") for o in items if isinstance(o, dict)]
    return None


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _outside(value: float, low: Any, high: Any) -> bool:
    """True when ``value`` is below a numeric ``low`` or above a numeric ``high`` (other bounds are ignored)."""
    return (_number(low) and value < low) or (_number(high) and value > high)


def _misfit(spec: Mapping[str, Any], value: Any) -> str | None:
    """Why ``value`` does not fit the property ``spec``, or None."""
    kind = spec.get("type")
    if kind == "string":
        if not isinstance(value, str):
            return "not a string"
        choices = _choices(spec)
        if choices is not None and value not in choices:
            return "not one of the allowed values"
        if _outside(len(value), spec.get("minLength"), spec.get("maxLength")):
            return "its length is out of bounds"
        return None
    if kind in ("number", "integer"):
        if not _number(value) or (kind == "integer" and not float(value).is_integer()):
            return f"not {'an integer' if kind == 'integer' else 'a number'}"
        if _outside(value, spec.get("minimum"), spec.get("maximum")):
            return "out of bounds"
        return None
    if kind == "boolean":
        return None if isinstance(value, bool) else "not a boolean"
    # "array": a multi-select of strings
    if not isinstance(value, list) or not all(isinstance(v, str) for v in cast(list[Any], value)):
        return "not an array of strings"
    items: Any = spec.get("items", {})
    choices = _choices(cast(dict[str, Any], items)) if isinstance(items, dict) else None
    if choices is not None and any(v not in choices for v in cast(list[Any], value)):
        return "holds a value that is not allowed"
    if _outside(len(cast(list[Any], value)), spec.get("minItems"), spec.get("maxItems")):
        return "its number of items is out of bounds"
    return None
