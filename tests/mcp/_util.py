"""Helpers for the MCP tier tests: contracts around one or more servers, and process checks."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from truss.contract import Contract

SERVERS = Path(__file__).resolve().parent / "servers"
RAW = str(SERVERS / "raw.py")


def contract_of(*servers: dict[str, Any], budget: dict[str, Any] | None = None) -> Contract:
    """A minimal valid contract declaring ``servers``."""
    data: dict[str, Any] = {"contract": {"name": "t", "intent": "test"}, "mcp": {"servers": list(servers)}}
    if budget:
        data["budget"] = budget
    return Contract.model_validate(data)


def raw_server(name: str, mode: str, *, allow: list[str] | None = None, **extra: Any) -> dict[str, Any]:
    """A ``[[mcp.servers]]`` entry running ``servers/raw.py MODE``."""
    return {
        "name": name,
        "command": sys.executable,
        "args": [RAW, mode],
        "allow_tools": allow or ["echo"],
        "connect_timeout": "10s",
        **extra,
    }


def alive(pid: int) -> bool:
    """True when ``pid`` is a live process (zombies waiting to be reaped count as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            stat = handle.read()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def group_members(pgid: int) -> list[int]:
    """Live processes in process group ``pgid``."""
    found: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                stat = handle.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(entry))
    return found


def http_server(url: str, **extra: object) -> dict[str, object]:
    """A ``[[mcp.servers]]`` entry named ``web`` for the Streamable HTTP server at ``url``."""
    return {"name": "web", "transport": "http", "url": url, "allow_tools": ["echo"], "connect_timeout": "5s", **extra}
