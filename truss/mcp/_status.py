"""What a connected server said about itself, as ``truss mcp list|probe`` and ``session_started`` show it.

``ServerStatus`` (protocol version, server info, capabilities, instructions, tools mounted or
filtered, and the launcher or auth flow the server was reached through), ``ToolStatus``, and
``tool_definition``: the wire-form members of a tool that its pin covers (DESIGN 3.3).
``scrubbed_status`` replaces every known secret value in what the server said about itself, so a
server that echoes its own token in its name or instructions gets it neither signed nor printed.
Values only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, cast

from mcp import types

__all__ = ["REDACTED", "ServerStatus", "ToolStatus", "scrub_value", "scrubbed_status", "tool_definition"]

REDACTED = "[redacted]"
_MIN_SECRET_LEN = 4  # as the gate's redactor: shorter values would mangle ordinary text


class ToolStatus(NamedTuple):
    """One advertised tool of a server as ``truss mcp list`` shows it. ``definition``: the members
    its pin covers (``tool_definition``; empty for a tool the SDK dropped from the listing)."""

    name: str
    mounted: bool
    pin: str
    annotations: Mapping[str, Any]
    definition: Mapping[str, Any] = {}


@dataclass(frozen=True)
class ServerStatus:
    """What a connected server said about itself, and which of its tools are mounted.

    ``filtered`` gives, for each advertised tool that is not mounted, why (``not_allowlisted``,
    ``invalid_name``, ``unpinnable``, ``invalid_x_mcp_header``). ``pid`` is the stdio server's
    process (and process group) id when known. ``launcher`` (stdio) and ``auth`` (HTTP) are the
    descriptions of the seams the server was reached through (``truss.mcp.launch``,
    ``truss.mcp.auth``), recorded in ``session_started``.
    """

    name: str
    transport: str
    protocol_version: str
    server_info: dict[str, Any] | None
    capabilities: dict[str, Any]
    instructions: str | None
    connect_ms: float
    tools: list[ToolStatus]
    filtered: dict[str, str] = field(default_factory=dict[str, str])
    pid: int | None = None
    stderr_log: str | None = None
    launcher: dict[str, Any] | None = None
    auth: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "transport": self.transport,
            "protocol_version": self.protocol_version,
            "server_info": self.server_info,
            "capabilities": self.capabilities,
            "instructions": self.instructions,
            "connect_ms": round(self.connect_ms, 1),
            "tools": [
                {
                    "name": t.name,
                    "mounted": t.mounted,
                    "pin": t.pin,
                    "annotations": dict(t.annotations),
                    "title": t.definition.get("title"),
                    "description": t.definition.get("description"),
                    "input_schema": t.definition.get("inputSchema"),
                    "output_schema": t.definition.get("outputSchema"),
                    **({"filtered": self.filtered[t.name]} if t.name in self.filtered else {}),
                }
                for t in self.tools
            ],
            **({"stderr_log": self.stderr_log} if self.stderr_log else {}),
            **({"launcher": self.launcher} if self.launcher is not None else {}),
            **({"auth": self.auth} if self.auth is not None else {}),
        }


def tool_definition(tool: types.Tool) -> dict[str, Any]:
    """The wire-form members of a tool that its pin covers (DESIGN 3.3)."""
    wire = tool.model_dump(by_alias=True, mode="json", exclude_none=True)
    keys = ("name", "title", "description", "inputSchema", "outputSchema", "annotations")
    return {k: wire[k] for k in keys if k in wire}


def scrub_value(value: Any, secrets: Sequence[str]) -> Any:
    """``value`` (JSON-shaped) with every one of ``secrets`` inside its strings, keys included, replaced
    by ``REDACTED``; ``secrets`` longest first, so one that contains another goes whole."""
    usable = [s for s in secrets if len(s) >= _MIN_SECRET_LEN]
    if not usable:
        return value
    return _scrub(value, usable)


def _scrub(value: Any, secrets: list[str]) -> Any:
    if isinstance(value, str):
        for secret in secrets:
            if secret in value:
                value = value.replace(secret, REDACTED)
        return value
    if isinstance(value, dict):
        return {_scrub(k, secrets): _scrub(v, secrets) for k, v in cast(dict[Any, Any], value).items()}
    if isinstance(value, list | tuple):
        return [_scrub(v, secrets) for v in cast(list[Any], value)]
    return value


def scrubbed_status(status: ServerStatus, secrets: Sequence[str]) -> ServerStatus:
    """``status`` with ``secrets`` scrubbed from everything the server sent (pins stay: they hash
    the definition as it was sent)."""
    if not any(len(s) >= _MIN_SECRET_LEN for s in secrets):
        return status
    return dataclasses.replace(
        status,
        server_info=scrub_value(status.server_info, secrets),
        capabilities=scrub_value(status.capabilities, secrets),
        instructions=scrub_value(status.instructions, secrets),
        tools=[
            ToolStatus(scrub_value(t.name, secrets), t.mounted, t.pin, scrub_value(dict(t.annotations), secrets))
            for t in status.tools
        ],
        filtered=scrub_value(status.filtered, secrets),
    )
