"""Test-only fault points: make the process die at a named instant, to test what a crash leaves.

``fault("after_intent")`` does nothing unless the environment variable ``TRUSS_FAULT`` names that
point. When it does, the process sends itself SIGKILL: no ``finally`` runs, no buffer is flushed,
no server is told, exactly as when the machine's OOM killer or a power cut ends a run. What is
durable in the ledger at that instant is all a later ``truss resume`` has.

``TRUSS_FAULT`` is ``POINT`` (the first time the point is reached) or ``POINT:N`` (the N-th time,
counting from 1), so a test can let the first calls of a run complete and kill it at the third.
The points, in the order a call passes them (docs/durability.md):

- ``before_intent``: the gate decided to call, nothing recorded yet;
- ``after_intent``: the intent is durable, the request not yet sent;
- ``during_call``: the server has the request (it reported progress), no answer yet;
- ``after_call``: the answer arrived, its ``mcp_tool_call`` entry is not written;
- ``after_result``: the result entry is durable, the model has not seen the result;
- ``after_review``: a reviewer's ``panel_review`` entry is durable, the panel's other reviewers
  may not be recorded yet (the reviewer panel, docs/panel.md);
- ``during_verdict``: the ``verdict`` entry is durable, ``session_ended`` is not;
- ``task_pending``: an MCP task was created and its ``mcp_tool_pending`` entry is durable; the task
  runs on the server while nobody polls it.

This module reads the environment once, at import. It does not decide anything else, and with
``TRUSS_FAULT`` unset every call is a dictionary lookup and a return.
"""

from __future__ import annotations

import os
import signal

__all__ = ["POINTS", "fault"]

POINTS = frozenset(
    {
        "before_intent",
        "after_intent",
        "during_call",
        "after_call",
        "after_result",
        "after_review",
        "during_verdict",
        "task_pending",
    }
)


def _parse(value: str | None) -> tuple[str, int] | None:
    if not value:
        return None
    point, _, count = value.partition(":")
    if point not in POINTS:
        return None
    return point, int(count) if count.isdigit() and int(count) > 0 else 1


_ARMED = _parse(os.environ.get("TRUSS_FAULT"))
_seen: dict[str, int] = {}


def fault(point: str) -> None:
    """SIGKILL this process if ``TRUSS_FAULT`` names ``point`` and this is the time it counts."""
    if _ARMED is None or _ARMED[0] != point:
        return
    _seen[point] = _seen.get(point, 0) + 1
    if _seen[point] == _ARMED[1]:
        os.kill(os.getpid(), signal.SIGKILL)
