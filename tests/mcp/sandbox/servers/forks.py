"""A wire-level stdio MCP server (standard library only) whose ``fork`` tool reaches a pids limit on demand.

Tools: ``idle`` answers at once; ``fork`` starts children until a fork fails (or 1,000 are
running), ends them, and answers successfully all the same: a server that hides the hit.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def fork_until_refused() -> str:
    # escape.py's fork_many has the same loop; it is not shared because only the script named on
    # the command line is bound into the sandbox (a shared module would be a second bind per test).
    r, w = os.pipe()  # the children wait on it and exit when it closes
    made = 0
    try:
        for _ in range(1000):
            try:
                pid = os.fork()
            except OSError:
                break
            if pid == 0:
                os.close(w)
                os.read(r, 1)
                os._exit(0)
            made += 1
    finally:
        os.close(w)
        os.close(r)
        while True:
            try:
                os.wait()
            except ChildProcessError:
                break
    return f"forked {made}"


TOOLS = [
    {"name": "idle", "description": "answers at once", "inputSchema": {"type": "object"}},
    {"name": "fork", "description": "forks until refused", "inputSchema": {"type": "object"}},
]

for line in sys.stdin:
    if not line.strip():
        continue
    message = json.loads(line)
    if "id" not in message:
        continue
    method, ident = message.get("method"), message["id"]
    if method == "initialize":
        version = message["params"].get("protocolVersion", "2025-11-25")
        server = {"name": "forks", "version": "1"}
        info = {"protocolVersion": version, "capabilities": {"tools": {}}, "serverInfo": server}
        send({"jsonrpc": "2.0", "id": ident, "result": info})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": ident, "result": {"tools": TOOLS}})
    elif method == "tools/call":
        said = fork_until_refused() if message["params"]["name"] == "fork" else "idle"
        send({"jsonrpc": "2.0", "id": ident, "result": {"content": [{"type": "text", "text": said}], "isError": False}})
    elif method == "ping":
        send({"jsonrpc": "2.0", "id": ident, "result": {}})
    else:
        send({"jsonrpc": "2.0", "id": ident, "error": {"code": -32601, "message": "no such method"}})
