"""Helpers for the policy tests: contracts and mount sets from plain values."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from truss.contract import Contract
from truss.tools import MountedTool


def mounted_tool(server: str, tool: str, annotations: Mapping[str, Any] | None = None) -> MountedTool:
    definition: dict[str, Any] = {"name": tool, "inputSchema": {"type": "object"}}
    if annotations is not None:
        definition["annotations"] = dict(annotations)
    # The pin plays no part in policy; a fixed one keeps odd generated annotations hashable.
    return MountedTool(server, tool, definition, "sha256:" + "0" * 64)


def mount_all(contract: Contract) -> dict[str, MountedTool]:
    """Every allowlisted tool of every server, without annotations (``*`` lists nothing)."""
    tools = [mounted_tool(s.name, t) for s in contract.mcp.servers for t in s.allow_tools if t != "*"]
    return {t.name: t for t in tools}


def contract_of(policy: Mapping[str, Any], servers: Sequence[Mapping[str, Any]] | None = None) -> Contract:
    data: dict[str, Any] = {
        "contract": {"name": "t", "intent": "test"},
        "policy": dict(policy),
        "mcp": {"servers": list(servers or [])},
    }
    return Contract.model_validate(data)
