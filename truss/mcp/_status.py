"""What a connected server said about itself, as ``truss mcp list|probe`` and ``session_started`` show it.

``ServerStatus`` (protocol version, server info, capabilities, instructions, tools mounted or
filtered, and the launcher or auth flow the server was reached through), ``ToolStatus``, and
``tool_definition``: the wire-form members of a tool that its pin covers (DESIGN 3.3). Values only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from mcp import types

__all__ = ["ServerStatus", "ToolStatus", "tool_definition"]


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
