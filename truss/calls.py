"""The values that pass through the gate: a call the model proposed and how it came out.

``CallRequest`` is what the loop hands the gate; ``CallOutcome`` is what the gate hands back (and
what the loop turns into the tool message the model reads). Values only: no I/O, no SDK.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from truss.tools import ToolResult, error_result

__all__ = ["CallOutcome", "CallRequest", "Outcome", "waiting"]

Outcome = Literal["ok", "tool_error", "failed", "denied", "suspended"]


@dataclass(frozen=True)
class CallRequest:
    """A call the model proposed. ``call`` is ``c<turn>.<index>`` (deterministic, so resume can match);
    ``tool`` the namespaced name (the loop maps provider names back); ``arguments`` None when the
    model's JSON did not parse."""

    call: str
    tool: str
    arguments: Mapping[str, Any] | None
    turn: int
    raw_arguments: str | None = None
    model_call_id: str | None = None


@dataclass(frozen=True)
class CallOutcome:
    call: str
    tool: str
    outcome: Outcome
    result: ToolResult
    duration_ms: float = 0.0
    code: str | None = None  # denial code (not_mounted, rule, budget, approval_denied, ...) or failure cause
    reason: str | None = None
    replayed: bool = False
    limit: str | None = None  # the budget limit that was hit


def waiting(
    request: CallRequest, code: str, why: str, *, replayed: bool = False, text: str | None = None
) -> CallOutcome:
    """A call that waits (``code``: approval, signal, task): the run suspends once its turn is done."""
    return CallOutcome(request.call, request.tool, "suspended", error_result(text or why), code=code, reason=why,
                       replayed=replayed)  # fmt: skip
