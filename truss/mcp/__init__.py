"""The MCP tier: the only package that imports the ``mcp`` SDK (client side and serve-mcp)."""

from __future__ import annotations

__all__: list[str] = []
