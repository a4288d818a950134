"""Attack: a model answers one turn with thousands of tool calls (an 8 MiB answer holds 80,000).

The loop ran every one of them through the gate: each past the budget was a denial, written and
committed to the ledger one by one, so one answer of 16,000 calls took a minute of disk writes
(the deadline does not cut them short: a call past it is a denial too) and grew the ledger by two
entries a call, every turn. A turn that asks for more than ``MAX_TOOL_CALLS_PER_TURN`` calls is a ``bad_response``
of the provider now: the run ends in error with its verdict, nothing is called or denied, and the
ledger verifies.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.providers._support import Reply
from tests.security.test_unrecordable_json import _final, _run  # pyright: ignore[reportPrivateUsage]
from truss.ledger.keys import TrustedKeys
from truss.ledger.verification import verify_ledger
from truss.providers._http import MAX_TOOL_CALLS_PER_TURN


def _calls(provider: str, count: int) -> dict[str, Any]:
    """An answer of ``provider`` whose one turn asks for ``count`` calls of the echo tool."""
    if provider == "openai":
        calls = [
            {"id": f"call_{i}", "type": "function", "function": {"name": "mcp__hostile__echo", "arguments": "{}"}}
            for i in range(count)
        ]
        message = {"role": "assistant", "content": None, "tool_calls": calls}
        return {"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]}
    blocks: list[dict[str, Any]] = [
        {"type": "tool_use", "id": f"toolu_{i}", "name": "mcp__hostile__echo", "input": {}} for i in range(count)
    ]
    return {"type": "message", "role": "assistant", "content": blocks, "stop_reason": "tool_use", "usage": {}}


@pytest.mark.anyio
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_turn_of_more_tool_calls_than_the_bound_is_a_bad_response_and_nothing_is_called_or_denied(
    tmp_path: Path, provider: str
) -> None:
    reply = _calls(provider, MAX_TOOL_CALLS_PER_TURN + 1)
    outcome, fake, store, key = await _run(tmp_path, provider, Reply(body=reply), Reply(body=_final(provider)))
    assert (outcome.status, outcome.exit_code) == ("error", 4)
    assert fake.calls == []
    entries = list(store.read_session(outcome.session))
    assert {e.kind for e in entries}.isdisjoint({"mcp_tool_intent", "mcp_tool_denied", "mcp_tool_call"})
    [verdict] = [e for e in entries if e.kind == "verdict"]
    assert verdict.body["error"]["cause"] == "provider", verdict.body
    assert str(MAX_TOOL_CALLS_PER_TURN) in verdict.body["error"]["detail"]  # the bound is named
    assert verify_ledger(store, TrustedKeys([key.verifier]), session=outcome.session).ok


@pytest.mark.anyio
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_turn_of_exactly_the_bound_of_tool_calls_runs_through_the_gate_and_the_run_finishes(
    tmp_path: Path, provider: str
) -> None:
    reply = _calls(provider, MAX_TOOL_CALLS_PER_TURN)
    outcome, fake, store, key = await _run(tmp_path, provider, Reply(body=reply), Reply(body=_final(provider)))
    assert (outcome.status, outcome.exit_code) == ("pass", 0)
    entries = list(store.read_session(outcome.session))
    calls = [e for e in entries if e.kind == "mcp_tool_call"]
    denied = [e for e in entries if e.kind == "mcp_tool_denied"]
    assert len(fake.calls) == len(calls) > 0
    assert len(calls) + len(denied) == MAX_TOOL_CALLS_PER_TURN  # the budget's 100 called, the rest denied
    assert verify_ledger(store, TrustedKeys([key.verifier]), session=outcome.session).ok
