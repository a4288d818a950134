"""Calls that finish later: MCP tasks the gate polls, and results that wait for a signal.

**Tasks.** A transport that can run a tool as an MCP task is a ``TaskTransport`` (``start_task``,
``task_result``; ``truss.mcp.client.Mounts`` is one, ``truss.testing.FakeTransport`` is not). The
gate sends such a call through ``start_task``; a task id comes back, and ``pending_task`` makes the
``mcp_tool_pending`` record the gate commits *before* it waits, so a run that stops (deadline,
``--no-wait``, Ctrl-C, a crash) resumes polling the same task. ``task_result`` polls it; the
answer names its task (``extra["task_id"]``), which the call's ``mcp_tool_call`` records.

**Signals.** A server may declare a tool async (``[[mcp.servers.async]]``): a result that says
"pending" at ``pending.pointer`` names, at ``signal``, what ``truss signal`` will deliver.
``signal_name`` reads that name (short and printable, or the result is taken as final), and
``pending_signal`` makes the ``mcp_tool_pending`` record that suspends the call until then.

What this module does not do: write the ledger, charge budgets or decide anything about a call
(the gate does all three); speak MCP (the transport does).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Protocol, cast, runtime_checkable

from truss._pointer import resolve_pointer
from truss.contract import Contract
from truss.ledger.entry import Record, StoredEntry
from truss.tools import MountedTool, ProgressFn, ToolResult

__all__ = ["TaskTransport", "pending_signal", "pending_task", "signal_name", "task_result", "task_transport"]

_MAX_SIGNAL_CHARS = 200


@runtime_checkable
class TaskTransport(Protocol):
    """A transport that runs some tools as MCP tasks (``truss.mcp.client.Mounts``; docs/mcp.md)."""

    async def start_task(self, tool: MountedTool, arguments: Mapping[str, Any], *, timeout_s: float) -> str | None:
        """The id of the task the server created for this call; None: the tool does not run as a task."""
        ...

    async def task_result(
        self, tool: MountedTool, task_id: str, *, timeout_s: float, progress: ProgressFn | None = None
    ) -> ToolResult | None:
        """The task's result once it ended; None while it still runs after ``timeout_s``."""
        ...


_RUNS_TASKS: dict[type, bool] = {}


def task_transport(transport: object) -> TaskTransport | None:
    """``transport`` when it can run tasks, else None (every call is then a plain call).

    Decided once per transport class, from the methods the class defines: this runs on every call,
    and a runtime protocol check costs more than the rest of a call's policy decision.
    """
    kind = type(transport)
    runs = _RUNS_TASKS.get(kind)
    if runs is None:
        runs = _RUNS_TASKS[kind] = all(callable(getattr(kind, name, None)) for name in ("start_task", "task_result"))
    return cast(TaskTransport, transport) if runs else None


def pending_task(intent: StoredEntry, task_id: str) -> Record:
    """The ``mcp_tool_pending`` record of a call the server runs as task ``task_id``."""
    pending: dict[str, Any] = {k: intent.body[k] for k in ("call", "turn", "tool", "args", "pin")}
    pending.update({"intent": intent.seq, "kind": "task", "task": task_id})
    return Record("mcp_tool_pending", pending)


async def task_result(
    tasks: TaskTransport, tool: MountedTool, task_id: str, timeout_s: float, progress: ProgressFn | None
) -> ToolResult | None:
    """Poll task ``task_id`` for up to ``timeout_s``; the result names its task, None: still running."""
    result = await tasks.task_result(tool, task_id, timeout_s=timeout_s, progress=progress)
    return ToolResult(result.wire, {**result.extra, "task_id": task_id}) if result is not None else None


def signal_name(contract: Contract, tool: MountedTool, result: ToolResult) -> str | None:
    """The signal a result waits for, when its server declares the tool async and the result is pending."""
    server = contract.mcp.server(tool.server)
    if server is None:
        return None
    for decl in server.async_:
        if decl.tool != tool.tool:
            continue
        document: Any = result.structured
        if document is None:
            try:
                document = json.loads(result.text)
            except ValueError:
                return None
        found, value = resolve_pointer(document, decl.pending.pointer)
        if not found or value != decl.pending.equals:
            return None
        found, name = resolve_pointer(document, decl.signal)
        if not found or isinstance(name, dict | list) or name is None:
            return None
        text = name if isinstance(name, str) else json.dumps(name)
        # An untrusted server names the signal: it is shown to the operator, so short and plain.
        return text if 0 < len(text) <= _MAX_SIGNAL_CHARS and text.isprintable() else None
    return None


def pending_signal(body: Mapping[str, Any], signal: str, result_bytes: bytes) -> Record:
    """The ``mcp_tool_pending`` record of a result that says "later": it waits for ``truss signal``."""
    pending: dict[str, Any] = {k: body[k] for k in ("call", "turn", "tool", "args", "pin", "intent", "result")}
    pending.update({"kind": "signal", "signal": signal})
    return Record("mcp_tool_pending", pending, {str(body["result"]): result_bytes})
