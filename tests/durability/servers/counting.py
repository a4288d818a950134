"""A stdio MCP server that records every invocation it receives, durably, before it answers.

Each ``tools/call`` appends one line ``<tool> <key>`` to the file named by ``COUNT_FILE`` and
fsyncs it before doing anything else, so a test can count exactly how often a call reached the
server, whatever happened to the client afterwards. When the request carries a progress token, the
server then reports progress once before answering: Truss's ``during_call`` fault point fires on
that report, i.e. at an instant when the server certainly has the request.

Tools: ``count {key}`` (answers ``counted <key>``), ``other {key}`` (the same, a second tool so a
contract can declare one safe to re-send and one not), ``deploy {name}`` (the signal pattern: answers
``{"status": "pending", "job": "job-<name>"}`` at once; the result arrives later by ``truss signal``).
Wire level, 2025-11-25 handshake: it starts in milliseconds. With ``START_FILE`` set, each
``initialize`` appends the server's pid to that file: a test can tell that a server was started,
and find its process afterwards.
"""

from __future__ import annotations

import json
import os
import sys

_KEY = {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}
TOOLS: list[dict[str, object]] = [
    {"name": "count", "description": "Count an invocation.", "inputSchema": _KEY},
    {"name": "other", "description": "Count an invocation, too.", "inputSchema": _KEY},
    {
        "name": "deploy",
        "description": "Start a deployment; its result arrives later.",
        "inputSchema": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
    },
]


def send(message: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def record(line: str, path: str | None = None) -> None:
    path = path or os.environ["COUNT_FILE"]
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def call(params: dict[str, object]) -> dict[str, object]:
    name = str(params.get("name"))
    args = params.get("arguments") or {}
    assert isinstance(args, dict)
    key = str(args.get("key", args.get("name", "")))
    record(f"{name} {key}")
    meta = params.get("_meta")
    token = meta.get("progressToken") if isinstance(meta, dict) else None
    if token is not None:
        send({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": token, "progress": 1}})
    if name == "deploy":
        job = {"status": "pending", "job": f"job-{key}"}
        return {"content": [{"type": "text", "text": json.dumps(job)}], "structuredContent": job, "isError": False}
    if name in ("count", "other"):
        return {"content": [{"type": "text", "text": f"counted {key}"}], "structuredContent": {"key": key}}
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
            if os.environ.get("START_FILE"):
                record(str(os.getpid()), os.environ["START_FILE"])
            value: dict[str, object] = {
                "protocolVersion": "2025-11-25",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "counting", "version": "1.0"},
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
