"""MCP Tasks (2025-11-25), the one implementation: call now, fetch later.

Which calls run as tasks: a mounted tool whose definition (as listed at connect) declares
``execution.taskSupport`` ``"required"`` or ``"optional"``, on a server whose capabilities (at
connect) include ``tasks.requests.tools.call``; the specification forbids task augmentation on any
other server, and a tool that declares neither value is called plainly. Running an ``optional``
tool as a task is what makes it durable: a run that stops resumes polling the same task instead of
finding the call in doubt.

- ``start``: the task-augmented ``tools/call`` (``task.ttl`` 24 h, so that a suspended run can still
  poll it after a long wait; a server may keep it for less). mcp 2.3's ``Client`` has no tasks API
  and its typed ``send_request`` validates a ``tools/call`` answer as a ``CallToolResult``, so this
  one request goes through the session's raw request path. The task id an untrusted server returns
  ends up in the ledger and in messages: one that is not 1-256 printable characters is refused
  (``ToolCallError``, ``cause="protocol_error"``) and never recorded.
- ``result``: polls ``tasks/get`` (the server's ``pollInterval`` within 50 ms .. 2 s, else doubling
  from 50 ms) until the task is ``completed`` or ``failed``, then returns ``tasks/result`` (the
  tool's result, which may be ``isError``; for a failed task it may be a JSON-RPC error). None when
  ``timeout_s`` passes first, or at the first look under ``no_wait`` (``--no-wait``), while the task
  still runs. A task that ends ``cancelled``, or asks for input Truss cannot give
  (``input_required``), is ``ToolCallError`` with ``cause`` ``task_cancelled`` /
  ``task_input_required``; an id the server does not know (it restarted, the task expired) is
  ``cause="task_unknown"``: its outcome is unknown, and the gate treats the call as in doubt.
  Status messages go to the progress callback (each new one once; a failing display is ignored).

What this module does not do: record anything, decide policy or re-send a call (the gate does).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any, cast

import anyio
from mcp import Client, types

from truss._errors import McpError, ToolCallError
from truss.mcp._errmap import to_call_error
from truss.mcp._results import result_of
from truss.tools import MountedTool, ProgressFn, ToolResult

__all__ = ["TASK_TTL_MS", "offers_tasks", "result", "runs_as_task", "start"]

TASK_TTL_MS = 24 * 3_600_000
_FIRST_POLL_S = 0.05
_MAX_POLL_S = 2.0
_GET_TIMEOUT_S = 30.0
_MAX_TASK_ID_CHARS = 256
_TASK_TOOLS = frozenset({"required", "optional"})


def offers_tasks(capabilities: Mapping[str, Any]) -> bool:
    """Whether a server's capabilities (wire form) allow task-augmented ``tools/call``."""
    value: Any = capabilities
    for key in ("tasks", "requests", "tools"):
        value = cast(dict[str, Any], value).get(key) if isinstance(value, dict) else None
    return isinstance(value, dict) and "call" in value


def runs_as_task(offered: bool, task_support: str | None) -> bool:
    """Whether a call of a tool declaring ``task_support`` runs as a task on a server that ``offered`` them."""
    return offered and task_support in _TASK_TOOLS


async def start(client: Client, tool: MountedTool, arguments: Mapping[str, Any], *, timeout_s: float) -> str:
    """Send the task-augmented call; the id of the task the server created."""
    params = {"name": tool.tool, "arguments": dict(arguments), "task": {"ttl": TASK_TTL_MS}}
    try:
        # The raw path (see the module docstring): the one private member Truss touches.
        dispatcher: Any = client.session._dispatcher  # pyright: ignore[reportPrivateUsage]
        raw: dict[str, Any] = await dispatcher.send_raw_request("tools/call", params, {"timeout": timeout_s})
        created = types.CreateTaskResult.model_validate(raw, by_name=False)
    except Exception as exc:
        raise to_call_error(exc, server=tool.server, tool=tool.tool, timeout_s=timeout_s) from None
    task_id = created.task.task_id
    if not 0 < len(task_id) <= _MAX_TASK_ID_CHARS or not task_id.isprintable():
        raise ToolCallError(
            f"MCP server {tool.server!r} answered tool {tool.tool!r} with an unusable task id "
            f"({len(task_id)} characters{'' if task_id.isprintable() else ', some of them control characters'})",
            remedy="Report it upstream; Truss records and shows task ids of 1-256 printable characters",
            server=tool.server,
            tool=tool.tool,
            cause="protocol_error",
        )
    return task_id


async def result(
    client: Client,
    tool: MountedTool,
    task_id: str,
    *,
    timeout_s: float,
    max_result_bytes: int,
    no_wait: bool = False,
    progress: ProgressFn | None = None,
) -> ToolResult | None:
    """Poll task ``task_id`` until it ends (its result), or None when it still runs (module docstring)."""
    wait = _FIRST_POLL_S
    said: str | None = None
    with anyio.move_on_after(timeout_s):
        while True:
            try:
                request = types.GetTaskRequest(params=types.GetTaskRequestParams(task_id=task_id))
                task = await client.session.send_request(
                    request, types.GetTaskResult, request_read_timeout_seconds=min(timeout_s, _GET_TIMEOUT_S)
                )
            except Exception as exc:
                raise _poll_error(exc, tool, task_id) from None
            if progress is not None and task.status_message and task.status_message != said:
                said = task.status_message
                with contextlib.suppress(Exception):  # progress is advisory
                    await progress(0.0, None, said)
            if task.status in ("completed", "failed"):
                break
            if task.status in ("cancelled", "input_required"):
                raise ToolCallError(
                    f"task {task_id!r} of tool {tool.tool!r} on MCP server {tool.server!r} ended as {task.status}",
                    remedy="Truss cannot answer a task's input requests; run the work without them, or resolve it"
                    if task.status == "input_required"
                    else "The task was cancelled on the server; start the work again if it is still wanted",
                    server=tool.server,
                    tool=tool.tool,
                    cause=f"task_{task.status}",
                    task=task_id,
                )
            if no_wait:  # --no-wait: one look, then the run suspends
                return None
            hint = task.poll_interval / 1000.0 if task.poll_interval else wait * 2
            wait = min(max(hint, _FIRST_POLL_S), _MAX_POLL_S)
            await anyio.sleep(wait)
        try:
            payload = types.GetTaskPayloadRequest(params=types.GetTaskPayloadRequestParams(task_id=task_id))
            answer = await client.session.send_request(payload, types.CallToolResult)
        except Exception as exc:
            raise _poll_error(exc, tool, task_id) from None
        return result_of(tool, answer, max_result_bytes)
    return None


def _poll_error(exc: BaseException, tool: MountedTool, task_id: str) -> McpError:
    error = to_call_error(exc, server=tool.server, tool=tool.tool)
    if error.fields.get("code") == types.INVALID_PARAMS:  # what the reference servers answer for an unknown id
        return ToolCallError(
            f"MCP server {tool.server!r} does not know task {task_id!r} of tool {tool.tool!r} (it may have "
            "restarted, or the task expired)",
            remedy="Its outcome is unknown: find out whether the work was done, then resolve the call",
            server=tool.server,
            tool=tool.tool,
            cause="task_unknown",
            task=task_id,
        )
    error.fields["task"] = task_id
    return error
