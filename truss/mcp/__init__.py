"""The MCP tier: the only package that imports the ``mcp`` SDK (client side and serve-mcp).

The client tier's public names are loaded on first use, so that importing ``truss.mcp`` (or one
of its SDK-free helpers) does not pay for importing the SDK (about 0.6 s).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from truss.mcp.client import Mounts, ServerStatus, ToolStatus, connect

__all__ = ["Mounts", "ServerStatus", "ToolStatus", "connect"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from truss.mcp import client

        return getattr(client, name)
    raise AttributeError(f"module 'truss.mcp' has no attribute {name!r}")
