"""A small stdio MCP server for end-to-end runs, written against the wire (it starts in milliseconds).

Tools: ``echo {text}`` (read-only), ``slow {seconds}`` (answers after that long; read-only),
``write {path, text}`` (declares itself destructive; writes nothing, answers "written"),
``has_env {name}`` (whether a variable is set in the server's environment, never its value).
It speaks the 2025-11-25 handshake and refuses ``server/discover``, so an ``auto`` client falls back.
"""

from __future__ import annotations

import json
import os
import sys
import time

TOOLS: list[dict[str, object]] = [
    {
        "name": "echo",
        "description": "Echo the text back.",
        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
        "annotations": {"readOnlyHint": True},
    },
    {
        "name": "slow",
        "description": "Answer after some seconds.",
        "inputSchema": {"type": "object", "properties": {"seconds": {"type": "number"}}},
        "annotations": {"readOnlyHint": True},
    },
    {
        "name": "write",
        "description": "Pretend to write a file.",
        "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}, "text": {"type": "string"}}},
        "annotations": {"readOnlyHint": False, "destructiveHint": True},
    },
    {
        "name": "has_env",
        "description": "Whether an environment variable is set.",
        "inputSchema": {"type": "object", "properties": {"name": {"type": "string"}}},
        "annotations": {"readOnlyHint": True},
    },
]


def send(message: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def text(value: str, structured: object = None) -> dict[str, object]:
    out: dict[str, object] = {"content": [{"type": "text", "text": value}], "isError": False}
    if structured is not None:
        out["structuredContent"] = structured
    return out


def call(params: dict[str, object]) -> dict[str, object]:
    name = params.get("name")
    args = params.get("arguments") or {}
    assert isinstance(args, dict)
    if name == "echo":
        return text(str(args.get("text", "")), {"text": str(args.get("text", ""))})
    if name == "slow":
        time.sleep(float(args.get("seconds", 1)))
        return text("slept")
    if name == "write":
        return text("written", {"path": str(args.get("path", ""))})
    if name == "has_env":
        return text("yes" if os.environ.get(str(args.get("name", ""))) else "no")
    return {"content": [{"type": "text", "text": f"unknown tool {name}"}], "isError": True}


def main() -> None:
    for line in sys.stdin:
        try:
            message = json.loads(line)
        except ValueError:
            continue
        method, request_id = message.get("method"), message.get("id")
        if request_id is None:
            continue
        if method == "initialize":
            value: dict[str, object] = {
                "protocolVersion": "2025-11-25",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "e2e-tools", "version": "1.0"},
            }
        elif method == "tools/list":
            value = {"tools": TOOLS}
        elif method == "tools/call":
            value = call(message.get("params") or {})
        elif method == "ping":
            value = {}
        else:
            send({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32601, "message": "Method not found"}})
            continue
        send({"jsonrpc": "2.0", "id": request_id, "result": value})


if __name__ == "__main__":
    main()
