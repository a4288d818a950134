"""MCP Tasks (2025-11-25) for tools that declare ``execution.taskSupport``: call now, fetch later.

mcp 2.3's ``Client`` has no tasks API, and its typed ``send_request`` validates a ``tools/call``
answer as a ``CallToolResult`` (a ``CreateTaskResult`` is not one), so the task-augmented call goes
through the session's raw request path; ``tasks/get`` and ``tasks/result`` use the typed models of
``mcp_types``. ``connect_with_tasks`` wraps ``truss.mcp.client.connect`` and yields ``TaskMounts``:
the same ``Mounts`` plus the two methods the gate looks for on its transport:

- ``start_task(tool, arguments, timeout_s=)``: None when the tool does not run as a task (then the
  gate calls it as usual); else the task id the server created. The gate records it in
  ``mcp_tool_pending`` before it waits, so a run that stops (deadline, Ctrl-C, a crash) can resume
  polling the *same* task;
- ``task_result(tool, task_id, timeout_s=, progress=)``: polls ``tasks/get`` with backoff (the
  server's ``pollInterval`` when it gives one, within bounds) and returns the ``tasks/result``
  answer, an ``isError`` result for a failed or cancelled task, or None when ``timeout_s`` passed
  first, or with ``no_wait`` at the first look, while the task still runs. A task the server
  does not know (it restarted, the task expired) raises ``ToolCallError`` with
  ``cause="task_unknown"``: its outcome is unknown, and the gate treats the call as in doubt.

Which tools run as tasks is read once per server from a fresh ``tools/list``, only for servers that
advertise ``capabilities.tasks.requests.tools.call``. What this module does not do: record anything,
decide policy, or re-send a call.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from contextlib import asynccontextmanager
from typing import Any, cast

import anyio
from mcp_types import _types as task_types

from truss._errors import McpError, ToolCallError
from truss.mcp._errmap import to_call_error
from truss.mcp.client import Mounts, connect
from truss.tools import MountedTool, ProgressFn, ToolResult, error_result

__all__ = ["TaskMounts", "connect_with_tasks"]

TASK_TTL_MS = 24 * 3_600_000  # asked for; the server may keep a task for less
_FIRST_POLL_S = 0.05
_MAX_POLL_S = 2.0
_TERMINAL = frozenset({"completed", "failed", "cancelled"})
_MAX_TASK_ID_CHARS = 256
_NOT_FOUND = -32602  # what the TypeScript SDK answers for an unknown task id


class TaskMounts:
    """``Mounts`` with task-augmented calls (see the module docstring); everything else delegates."""

    def __init__(self, mounts: Mounts, *, no_wait: bool = False) -> None:
        self._mounts = mounts
        self._no_wait = no_wait
        self._task_tools: dict[str, frozenset[str]] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._mounts, name)

    @property
    def tools(self) -> dict[str, MountedTool]:
        return self._mounts.tools

    @property
    def servers(self) -> Mapping[str, Any]:
        return self._mounts.servers

    def pins(self) -> dict[str, str]:
        return self._mounts.pins()

    async def call(
        self, tool: MountedTool, arguments: Mapping[str, Any], *, timeout_s: float, progress: ProgressFn | None = None
    ) -> ToolResult:
        return await self._mounts.call(tool, arguments, timeout_s=timeout_s, progress=progress)

    def _client(self, server: str) -> Any:
        live: Any = self._mounts._lives.get(server)  # pyright: ignore[reportPrivateUsage] - same package
        client: Any = getattr(live, "client", None)
        if client is None or getattr(live, "dead", None) is not None:
            raise ToolCallError(
                f"MCP server {server!r} is no longer connected",
                remedy="The server exited or its transport failed; its stderr log says why",
                server=server,
                cause="connection_closed",
            )
        return client

    async def _runs_as_task(self, tool: MountedTool) -> bool:
        known = self._task_tools.get(tool.server)
        if known is None:
            status: Any = self._mounts.servers.get(tool.server)
            names: set[str] = set()
            if "call" in _member(getattr(status, "capabilities", None), "tasks", "requests", "tools"):
                client = self._client(tool.server)
                cursor: str | None = None
                for _ in range(1000):
                    page: Any = await client.list_tools(cursor=cursor)
                    for listed in page.tools:
                        execution: Any = getattr(listed, "execution", None)
                        if getattr(execution, "task_support", None) in ("optional", "required"):
                            names.add(str(listed.name))
                    cursor = page.next_cursor
                    if cursor is None:
                        break
            known = self._task_tools[tool.server] = frozenset(names)
        return tool.tool in known

    async def start_task(self, tool: MountedTool, arguments: Mapping[str, Any], *, timeout_s: float) -> str | None:
        """Send a task-augmented ``tools/call``; the task id, or None when the tool is not a task tool."""
        try:
            if not await self._runs_as_task(tool):
                return None
            live: Any = self._mounts._lives.get(tool.server)  # pyright: ignore[reportPrivateUsage] - same package
            if live is not None and tool.tool in live.changed:  # the definition changed since it was mounted
                raise live.pin_error(tool.tool)
            client = self._client(tool.server)
            params = {"name": tool.tool, "arguments": dict(arguments), "task": {"ttl": TASK_TTL_MS}}
            dispatcher: Any = client.session._dispatcher  # the raw path: see the module docstring
            raw: Any = await dispatcher.send_raw_request("tools/call", params, {"timeout": timeout_s})
            created = task_types.CreateTaskResult.model_validate(raw, by_name=False)
        except McpError:
            raise
        except Exception as exc:
            raise to_call_error(exc, server=tool.server, tool=tool.tool, timeout_s=timeout_s) from None
        task_id = created.task.task_id
        if not 0 < len(task_id) <= _MAX_TASK_ID_CHARS or not task_id.isprintable():
            # An untrusted server's id ends up in the ledger and in messages: keep it short and plain.
            raise ToolCallError(
                f"MCP server {tool.server!r} answered tool {tool.tool!r} with an unusable task id",
                remedy="Report it upstream; Truss records and shows task ids of 1-256 printable characters",
                server=tool.server,
                tool=tool.tool,
                cause="protocol_error",
            )
        return task_id

    async def task_result(
        self, tool: MountedTool, task_id: str, *, timeout_s: float, progress: ProgressFn | None = None
    ) -> ToolResult | None:
        """The task's result, or None when ``timeout_s`` passes while it still runs."""
        client = self._client(tool.server)
        wait = _FIRST_POLL_S
        said: str | None = None
        with anyio.move_on_after(timeout_s):
            while True:
                try:
                    request = task_types.GetTaskRequest(params=task_types.GetTaskRequestParams(task_id=task_id))
                    task: Any = await client.session.send_request(request, task_types.GetTaskResult)
                except Exception as exc:
                    raise self._poll_error(exc, tool, task_id) from None
                if progress is not None and task.status_message and task.status_message != said:
                    said = str(task.status_message)
                    await progress(0, None, said)
                if task.status in _TERMINAL:
                    break
                if self._no_wait:  # --no-wait: one look, then the run suspends
                    return None
                hint = task.poll_interval / 1000.0 if task.poll_interval else wait * 2
                wait = min(max(hint, _FIRST_POLL_S), _MAX_POLL_S)
                await anyio.sleep(wait)
            if task.status != "completed":
                why = f": {task.status_message}" if task.status_message else ""
                return error_result(f"task {task_id} of tool {tool.tool!r} ended {task.status}{why}")
            try:
                payload = task_types.GetTaskPayloadRequest(
                    params=task_types.GetTaskPayloadRequestParams(task_id=task_id)
                )
                result: Any = await client.session.send_request(payload, task_types.CallToolResult)
            except Exception as exc:
                raise self._poll_error(exc, tool, task_id) from None
            return self._mounts._result(tool, result)  # pyright: ignore[reportPrivateUsage] - same package
        return None

    @staticmethod
    def _poll_error(exc: BaseException, tool: MountedTool, task_id: str) -> McpError:
        error = to_call_error(exc, server=tool.server, tool=tool.tool)
        if error.fields.get("code") == _NOT_FOUND:
            return ToolCallError(
                f"MCP server {tool.server!r} does not know task {task_id} of tool {tool.tool!r} (it may have "
                "restarted, or the task expired)",
                remedy="Its outcome is unknown: find out whether the work was done, then resolve the call",
                server=tool.server,
                tool=tool.tool,
                cause="task_unknown",
                task=task_id,
            )
        return error


def _member(value: Any, *path: str) -> dict[str, Any]:
    """``value[path[0]][path[1]]...`` when each step is an object, else an empty dict."""
    for key in path:
        value = cast(dict[str, Any], value).get(key) if isinstance(value, dict) else None
    return cast(dict[str, Any], value) if isinstance(value, dict) else {}


@asynccontextmanager
async def connect_with_tasks(contract: Any, *, no_wait: bool = False, **kwargs: Any) -> AsyncGenerator[TaskMounts]:
    """``truss.mcp.client.connect`` yielding ``TaskMounts``; ``no_wait``: a task that is not finished at
    the first look suspends the run (``truss run/resume --no-wait``) instead of being waited for."""
    async with connect(contract, **kwargs) as mounts:
        yield TaskMounts(mounts, no_wait=no_wait)
