"""A wire-level stdio MCP server (no SDK) that plays one hostile answer file (``../data/servers/``).

Usage: ``answers.py FILE [MARK]``. The file says what the server says about itself and how it
answers each tool::

    {"serverInfo": {...}, "instructions": "...", "tools": [...],
     "answers": {"<tool>": ANSWER}}

``${SECRET}`` anywhere in the file becomes the value of ``HOSTILE_SECRET`` (the server's own
``secret_env``), so a file can describe a server that echoes its secret. An ANSWER is one of:

- ``{"result": {...}}``: that JSON-RPC result;
- ``{"error": {"code": n, "message": "..."}}``: that JSON-RPC error response;
- ``{"nested_structured": n}``: a result whose ``structuredContent`` nests ``n`` objects deep;
- ``{"huge_text_bytes": n, "id_last": bool}``: a one-line result holding a text of ``n`` bytes,
  written in 1 MiB pieces (the id first, as the Python SDK orders members, or last, as the
  TypeScript SDK does);
- ``{"raw": "..."}``: that line as it is, with ``${ID}`` replaced by the request's id (for numbers
  JSON's writers will not produce, such as ``1e400``).

With ``"echo_arguments_to_stderr": true`` beside any of them, the server first prints the call's
arguments on its stderr (a debug log that leaks what it was given). When MARK is given, the
server writes that file just before it answers a ``tools/call``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

SPEC: dict[str, Any] = json.loads(
    Path(sys.argv[1]).read_text(encoding="utf-8").replace("${SECRET}", os.environ.get("HOSTILE_SECRET", ""))
)
MARK = Path(sys.argv[2]) if len(sys.argv) > 2 else None
OUT = sys.stdout.buffer


def send(message: dict[str, Any]) -> None:
    OUT.write(json.dumps(message).encode() + b"\n")
    OUT.flush()


def huge(request_id: Any, size: int, id_last: bool) -> None:
    rid = json.dumps(request_id).encode()
    head = b'{"jsonrpc":"2.0","id":' + rid + b',"result":' if not id_last else b'{"result":'
    OUT.write(head + b'{"content":[{"type":"text","text":"')
    piece = b"x" * (1 << 20)
    left = size
    try:
        while left > 0:
            OUT.write(piece[: min(left, len(piece))])
            left -= len(piece)
        tail = b'"}],"isError":false}' + (b',"jsonrpc":"2.0","id":' + rid + b"}" if id_last else b"}")
        OUT.write(tail + b"\n")
        OUT.flush()
    except BrokenPipeError:  # the client stopped reading: it refused the answer
        os._exit(0)


def nested(depth: int) -> dict[str, Any]:
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


def answer(request_id: Any, params: dict[str, Any]) -> None:
    name = params.get("name")
    spec: dict[str, Any] = SPEC.get("answers", {}).get(name) or {"error": {"code": -32602, "message": "no tool"}}
    if spec.get("echo_arguments_to_stderr"):
        sys.stderr.write(f"debug: called {name} with {json.dumps(params.get('arguments'))}\n")
        sys.stderr.flush()
    if MARK is not None:
        MARK.write_text("called", encoding="utf-8")
    if "result" in spec:
        send({"jsonrpc": "2.0", "id": request_id, "result": spec["result"]})
    elif "error" in spec:
        send({"jsonrpc": "2.0", "id": request_id, "error": spec["error"]})
    elif "nested_structured" in spec:
        tree = nested(int(spec["nested_structured"]))
        send({"jsonrpc": "2.0", "id": request_id, "result": {"content": [], "structuredContent": tree}})
    elif "huge_text_bytes" in spec:
        huge(request_id, int(spec["huge_text_bytes"]), bool(spec.get("id_last")))
    else:
        OUT.write(str(spec["raw"]).replace("${ID}", json.dumps(request_id)).encode() + b"\n")
        OUT.flush()


def main() -> None:
    info = SPEC.get("serverInfo") or {"name": "answers", "version": "1.0"}
    for line in sys.stdin:
        message = json.loads(line)
        request_id = message.get("id")
        method = message.get("method")
        if request_id is None:
            continue
        if method == "initialize":
            value: dict[str, Any] = {"protocolVersion": "2025-11-25", "capabilities": {"tools": {}}, "serverInfo": info}
            if "instructions" in SPEC:
                value["instructions"] = SPEC["instructions"]
            send({"jsonrpc": "2.0", "id": request_id, "result": value})
        elif method == "tools/list":
            send({"jsonrpc": "2.0", "id": request_id, "result": {"tools": SPEC.get("tools", [])}})
        elif method == "tools/call":
            answer(request_id, message.get("params") or {})
        elif method == "ping":
            send({"jsonrpc": "2.0", "id": request_id, "result": {}})
        else:
            send({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32601, "message": "Method not found"}})


if __name__ == "__main__":
    main()
