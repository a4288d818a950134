"""A stdio MCP server whose tasks outlive it: MCP Tasks (2025-11-25) kept in a state file.

``build {key}`` must run as a task (``execution.taskSupport = "required"``). A task-augmented call
records ``build <key>`` in ``COUNT_FILE`` (fsync) and creates task ``task-<key>`` in ``TASK_FILE``.
``tasks/get`` logs ``get <id>`` in ``COUNT_FILE`` and answers ``working`` until the file named by
``TASK_DONE_FILE`` exists, then ``completed``; an id it never created is "Task not found" (-32602).
Because the tasks live in a file, a new server process (Truss resumed after a crash) finds the task
an earlier process created: the case the reference servers cannot show (theirs live in memory).

Knobs (environment), for the rules of Truss's one Tasks implementation:

- ``TASK_SUPPORT``: the tool's ``taskSupport`` (default ``required``); with ``optional`` a plain
  ``tools/call`` is answered at once (logged ``plain <key>``);
- ``NO_TASK_CAPABILITY=1``: the server does not advertise ``tasks.requests.tools.call``;
- ``TASK_END``: ``cancelled`` or ``input_required``: the status ``tasks/get`` reports once done;
- ``TASK_ID_FILE``: a JSON file whose ``task_id`` is the id the server hands out (attack data).

A task-augmented call also logs ``ttl <ms>``, the TTL the client asked for.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

TOOLS: list[dict[str, object]] = [
    {
        "name": "build",
        "description": "Build something, slowly, as a task.",
        "inputSchema": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
        "execution": {"taskSupport": os.environ.get("TASK_SUPPORT", "required")},
    }
]


def send(message: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def log(line: str) -> None:
    fd = os.open(os.environ["COUNT_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def tasks() -> dict[str, str]:
    path = Path(os.environ["TASK_FILE"])
    return json.loads(path.read_text()) if path.exists() else {}


def task(task_id: str, status: str) -> dict[str, object]:
    return {
        "taskId": task_id,
        "status": status,
        "createdAt": "2026-01-01T00:00:00Z",
        "lastUpdatedAt": "2026-01-01T00:00:00Z",
        "ttl": 3600000,
        "pollInterval": 50,
        "statusMessage": "building" if status == "working" else "built",
    }


def handle(method: str, params: dict[str, object]) -> dict[str, object] | tuple[int, str]:
    if method == "initialize":
        caps: dict[str, object] = {"tools": {}, "tasks": {"requests": {"tools": {"call": {}}}}}
        if os.environ.get("NO_TASK_CAPABILITY"):
            caps = {"tools": {}}
        return {"protocolVersion": "2025-11-25", "capabilities": caps, "serverInfo": {"name": "tasks", "version": "1"}}
    if method == "tools/list":
        return {"tools": TOOLS}
    if method == "tools/call":
        args = params.get("arguments") or {}
        key = str(args.get("key")) if isinstance(args, dict) else ""
        if "task" not in params:
            if os.environ.get("TASK_SUPPORT") == "optional":
                log(f"plain {key}")
                return {"content": [{"type": "text", "text": f"built {key}"}], "isError": False}
            return (-32600, "build must run as a task")
        log(f"build {key}")
        meta = params["task"]
        log(f"ttl {meta.get('ttl') if isinstance(meta, dict) else None}")
        task_id = f"task-{key}"
        if os.environ.get("TASK_ID_FILE"):
            task_id = str(json.loads(Path(os.environ["TASK_ID_FILE"]).read_text(encoding="utf-8"))["task_id"])
        known = tasks()
        known[task_id] = key
        Path(os.environ["TASK_FILE"]).write_text(json.dumps(known))
        return {"task": task(task_id, "working")}
    task_id = str(params.get("taskId"))
    key = tasks().get(task_id)
    if method in ("tasks/get", "tasks/result") and key is None:
        return (-32602, "Failed to retrieve task: Task not found")
    done = Path(os.environ["TASK_DONE_FILE"]).exists()
    if method == "tasks/get":
        log(f"get {task_id}")
        return task(task_id, os.environ.get("TASK_END", "completed") if done else "working")
    if method == "tasks/result":
        return {"content": [{"type": "text", "text": f"built {key}"}], "isError": False}
    if method == "ping":
        return {}
    return (-32601, "Method not found")


def main() -> None:
    for line in sys.stdin:
        try:
            message = json.loads(line)
        except ValueError:
            continue
        request_id = message.get("id")
        if request_id is None:
            continue
        answer = handle(str(message.get("method")), message.get("params") or {})
        if isinstance(answer, tuple):
            send({"jsonrpc": "2.0", "id": request_id, "error": {"code": answer[0], "message": answer[1]}})
        else:
            send({"jsonrpc": "2.0", "id": request_id, "result": answer})


if __name__ == "__main__":
    main()
