"""serve-mcp's native MCP Tasks: ``truss_run_contract`` as a task of the 2026-07-28 Tasks extension.

A caller whose ``tools/call`` declares the extension ``io.modelcontextprotocol/tasks`` in its
per-request capabilities, on a 2026-07-28 connection, gets a ``CreateTaskResult``
(``resultType: "task"``) at once instead of waiting for the verdict; it polls ``tasks/get`` and may
``tasks/cancel``. Every other caller keeps the synchronous answer or the ``async`` /
``truss_contract_status`` pattern (the extension forbids a task to a caller that did not ask).

The task id is the run's session id, so a task is as durable as the ledger: after a restart of
serve-mcp, ``tasks/get`` still answers from the store. Tasks are the caller's own: a task of
another principal answers exactly like an unknown one (a JSON-RPC invalid-params error).

How a run maps to a task (``task_view``):

- queued (no run slot free under ``--max-concurrent-runs``): ``working``, "queued ...";
- running: ``working``, its last progress line;
- suspended (approval, in doubt, a signal or an async tool, interrupted): ``working``, with what it
  waits on and the operator's command, and ``_meta["dev.truss/run"]`` carrying the run answer.
  The task is not ``input_required``: the input it waits for comes from the operator, not from
  the caller, and the extension's ``input_required`` means the client must answer;
- finished: ``completed`` with the ``truss_run_contract`` result (``isError`` for fail, error,
  interrupted and diverged, as the synchronous call answers), also for a refused start (a quota,
  a bad contract);
- cancelled before it started: ``cancelled``, with nothing recorded. Cancelling after the run
  started is acknowledged, and the run goes on to its verdict: the task says so in its status
  message and completes with the truth (the run is never abandoned half-way).

What it does not do: run contracts (``ServeApp`` starts them) or speak the 2025-11-25 task
augmentation (``params.task``): there the call is answered without a task.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from mcp import types
from pydantic import Field

__all__ = [
    "MISSING_CLIENT_CAPABILITY",
    "POLL_INTERVAL_MS",
    "RUN_META",
    "TASKS_EXTENSION",
    "ServeTask",
    "TaskIdParams",
    "TaskUpdateParams",
    "task_view",
    "wants_task",
]

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
MODERN = "2026-07-28"
POLL_INTERVAL_MS = 100
MISSING_CLIENT_CAPABILITY = -32021
RUN_META = "dev.truss/run"
"""The ``_meta`` key of a task's status holding the run answer (status, waiting, waiting_on) while it waits."""

TaskState = Literal["queued", "running", "finished", "cancelled"]


class TaskIdParams(types.RequestParams):
    """``tasks/get`` and ``tasks/cancel`` params: the task id."""

    task_id: str = Field(alias="taskId", min_length=1, max_length=128)


class TaskUpdateParams(TaskIdParams):
    """``tasks/update`` params: the task id and responses to input requests (a run's task has none)."""

    input_responses: dict[str, Any] = Field(alias="inputResponses", default_factory=dict[str, Any])


@dataclass
class ServeTask:
    """One task as serve-mcp holds it while the process lives (the ledger holds the rest)."""

    task_id: str
    principal: Any
    created_ms: int
    updated_ms: int
    state: TaskState = "queued"
    cancel_asked: bool = False
    resume_tried: str | None = None  # the session head the last resume from tasks/get saw


def wants_task(protocol_version: str, capabilities: Any) -> bool:
    """Whether this request may be answered with a task: 2026-07-28 and the extension declared on it."""
    if protocol_version != MODERN or capabilities is None:
        return False
    extensions = getattr(capabilities, "extensions", None)
    return isinstance(extensions, Mapping) and TASKS_EXTENSION in extensions


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"


def task_view(
    task_id: str,
    *,
    status: Literal["working", "completed", "cancelled"],
    created_ms: int,
    updated_ms: int,
    message: str | None,
    result: Mapping[str, Any] | None = None,
    run: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The wire ``Task`` (a ``DetailedTask`` for ``tasks/get``; the seed of a ``CreateTaskResult``)."""
    out: dict[str, Any] = {
        "taskId": task_id,
        "status": status,
        "createdAt": _iso(created_ms),
        "lastUpdatedAt": _iso(max(created_ms, updated_ms)),
        "ttlMs": None,  # the ledger keeps the run: the task never expires while the session is recorded
        "pollIntervalMs": POLL_INTERVAL_MS,
    }
    if message:
        out["statusMessage"] = message[:500]
    if result is not None:
        out["result"] = dict(result)
    if run is not None:
        out["_meta"] = {RUN_META: dict(run)}
    return out


def waiting_message(session: str, answer: Mapping[str, Any]) -> str:
    """What a suspended run waits on, in one line with the operator's command."""
    listed: list[Any] = list(answer.get("waiting") or [])
    waiting = [str(c) for c in listed]
    on = answer.get("waiting_on") or "approval"
    calls = ", ".join(waiting)
    commands = {
        "approval": f"the operator decides with 'truss approve {session} CALL' (or --deny)",
        "in_doubt": f"the operator settles it with 'truss resolve {session} CALL'",
        "signal": f"a signal is delivered with 'truss signal {session} NAME'",
        "task": "an asynchronous tool call is still running; the run goes on when it finishes",
        "interrupted": "the run was interrupted; it is resumed when the caller calls truss_run_contract "
        "again with this session id",
    }
    head = f"suspended, waiting for {str(on).replace('_', ' ')}"
    if calls:
        head += f" of call(s) {calls}"
    return f"{head}: {commands.get(str(on), 'see truss status')}"
