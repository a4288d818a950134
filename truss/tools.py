"""Values shared by the gate and the MCP tier, free of the ``mcp`` SDK.

A ``MountedTool`` is one allowlisted tool of one server as Truss sees it (namespaced name,
provider-safe name, definition, pin, annotations). A ``ToolResult`` is a tool's answer in wire
form with ``_meta`` removed. ``ToolTransport`` is what the gate calls; ``truss.mcp.client``
implements it over real servers and ``truss.testing`` with a plain handler.

Also here: the namespacing rules and the reversible mapping to provider-safe names.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from truss._json import as_mapping
from truss.ledger.canonical import canonical, sha256_ref

__all__ = [
    "MountedTool",
    "ProgressFn",
    "ToolResult",
    "ToolTransport",
    "error_result",
    "namespaced",
    "pin_of",
    "provider_name",
    "split_namespaced",
]

_PROVIDER_SAFE = re.compile(r"[^a-zA-Z0-9_-]")

ProgressFn = Callable[[float, float | None, str | None], Awaitable[None]]


def namespaced(server: str, tool: str) -> str:
    """``mcp:<server>:<tool>``, the name inside Truss and the ledger."""
    return f"mcp:{server}:{tool}"


def split_namespaced(name: str) -> tuple[str, str] | None:
    """``("git", "git_status")`` for ``mcp:git:git_status``; None when not namespaced."""
    if not name.startswith("mcp:"):
        return None
    server, sep, tool = name[4:].partition(":")
    if not sep or not server or not tool:
        return None
    return server, tool


def provider_name(server: str, tool: str) -> str:
    """A name model APIs accept (``^[a-zA-Z0-9_-]{1,64}$``): ``mcp__<server>__<tool>``.

    Characters outside the safe set become ``_``. When that loses information (or the name is
    too long), a short hash of the exact namespaced name is appended so two tools can never share
    a provider name; callers keep a dict from provider name back to the namespaced name.
    """
    base = f"mcp__{server}__{tool}"
    safe = _PROVIDER_SAFE.sub("_", base)
    # A server name with "__" or a trailing "_" makes the split point ambiguous
    # (server "a_" + tool "_b" and server "a" + tool "__b" both give mcp__a____b): hash those too.
    unambiguous = "__" not in server and not server.endswith("_")
    if safe == base and len(safe) <= 64 and unambiguous:
        return safe
    digest = hashlib.sha256(namespaced(server, tool).encode("utf-8")).hexdigest()[:10]
    return f"{safe[:53]}_{digest}"


def pin_of(definition: Mapping[str, Any]) -> str:
    """The definition hash of a tool (DESIGN 3.3).

    ``sha256(canonical({name, title, description, inputSchema, outputSchema, annotations}))``
    over the wire (camelCase) form; absent members are left out rather than set to null.
    """
    keys = ("name", "title", "description", "inputSchema", "outputSchema", "annotations")
    subset = {k: definition[k] for k in keys if definition.get(k) is not None}
    return sha256_ref(canonical(subset))


@dataclass(frozen=True)
class MountedTool:
    """An allowlisted tool of a connected server."""

    server: str
    tool: str
    definition: Mapping[str, Any]  # wire form: name, title, description, inputSchema, outputSchema, annotations
    pin: str

    @functools.cached_property
    def name(self) -> str:  # made once per tool: the gate, policy and budget ask for it on every call
        return namespaced(self.server, self.tool)

    @property
    def provider_name(self) -> str:
        return provider_name(self.server, self.tool)

    @property
    def annotations(self) -> Mapping[str, Any]:
        value = self.definition.get("annotations")
        return as_mapping(value) or {}

    @property
    def read_only(self) -> bool:
        """True only when the server declared ``readOnlyHint: true`` (a hint; it can only restrict)."""
        return self.annotations.get("readOnlyHint") is True

    @property
    def description(self) -> str:
        value = self.definition.get("description")
        return value if isinstance(value, str) else ""

    @property
    def input_schema(self) -> Mapping[str, Any]:
        value = self.definition.get("inputSchema")
        return as_mapping(value) or {"type": "object"}


@dataclass(frozen=True)
class ToolResult:
    """A tool's answer in wire form (``content``, ``structuredContent``, ``isError``), no ``_meta``."""

    wire: Mapping[str, Any]
    extra: Mapping[str, Any] = field(default_factory=dict[str, Any])  # e.g. {"task_id": ...}; never hashed

    @property
    def is_error(self) -> bool:
        return self.wire.get("isError") is True

    @property
    def structured(self) -> Any:
        return self.wire.get("structuredContent")

    @property
    def text(self) -> str:
        """The text blocks joined by newlines (what ``pointer = ""`` checks match)."""
        parts: list[str] = []
        content: Any = self.wire.get("content") or []
        for block in content:
            typed = as_mapping(block)
            if typed is not None:
                text: Any = typed.get("text") if typed.get("type") == "text" else None
                if isinstance(text, str):
                    parts.append(text)
        return "\n".join(parts)

    def canonical_bytes(self) -> bytes:
        return canonical(dict(self.wire))


def error_result(text: str) -> ToolResult:
    """An ``isError`` result carrying ``text``: what the model sees for a denial or a failure."""
    return ToolResult({"content": [{"type": "text", "text": text}], "isError": True})


class ToolTransport(Protocol):
    """What the gate calls to reach a server. Implementations never decide policy."""

    async def call(
        self,
        tool: MountedTool,
        arguments: Mapping[str, Any],
        *,
        timeout_s: float,
        progress: ProgressFn | None = None,
    ) -> ToolResult:
        """Call ``tool``; raise ``ToolCallError`` (or ``PinMismatchError``) for failures below the tool.

        A result larger than the limit the transport was configured with comes back as an
        ``error_result``, not an exception.
        """
        ...
