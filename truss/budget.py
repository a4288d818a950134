"""Budgets: pure accounting of what a run has spent and whether the next step still fits.

Every function here takes the current ``BudgetState``, the effective contract and, where time
matters, ``now_ms`` (Unix milliseconds, passed in: this module never reads a clock; the gate passes
``Gate.budget_now_ms``, which a wall clock set back or ahead does not move), and returns
a new state (``Charged``) or the limit that refused it (``Exceeded``). Nothing is mutated and
nothing is recorded: the gate holds the one state of a run under a lock, charges *before* it
calls a tool and swaps in the new state, so concurrent calls can never spend more than the
budget; recording ``mcp_tool_denied`` for an ``Exceeded`` is the gate's job. A call the policy
denies is never charged, because the gate only charges calls the policy allowed.

Limits (contract ``[budget]`` and ``[[mcp.servers]]``):

- ``deadline``: the run's wall-clock allowance from ``started_ms``. At ``started_ms + deadline``
  exactly, time is up: nothing more is charged.
- ``max_tool_calls`` (run), ``budget_calls`` of a server, ``budget_calls`` of a tool: each allowed
  call counts once against all three. When several are exhausted at once the broadest is
  reported (deadline, run, server, tool), because it tells the model the most about what else
  can still work.
- ``max_model_turns`` (and ``agent.max_turns``; the smaller wins): charged before each turn.
- ``max_tokens``: input + output tokens as the provider reports them, added after each turn.
  A new turn is refused once the total has reached the limit.
- ``max_result_bytes``: a size check, not a charge (``result_too_large``).

What does not fit this module: waiting, timeouts on real time, ledger entries. The effective
timeout of a call (``call_timeout_s``) is computed here; enforcing it is the MCP client's job.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

from truss.contract import Contract, Server, duration_ms
from truss.tools import namespaced, split_namespaced

__all__ = [
    "BudgetState",
    "Charged",
    "Exceeded",
    "LimitName",
    "add_usage",
    "call_timeout_s",
    "charge_call",
    "charge_turn",
    "configured_timeout_s",
    "deadline_ms",
    "remaining",
    "result_too_large",
    "time_left_s",
]

LimitName = Literal[
    "max_tool_calls",
    "server_budget_calls",
    "tool_budget_calls",
    "deadline",
    "max_model_turns",
    "max_tokens",
]


def _frozen(mapping: Mapping[str, int]) -> Mapping[str, int]:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True)
class BudgetState:
    """What a run has spent so far. Immutable: charging returns a new state.

    ``per_server`` counts calls by server name, ``per_tool`` by namespaced tool name.
    """

    tool_calls: int
    model_turns: int
    tokens: int
    per_server: Mapping[str, int] = field(default_factory=lambda: _frozen({}))
    per_tool: Mapping[str, int] = field(default_factory=lambda: _frozen({}))
    started_ms: int = 0

    @classmethod
    def start(cls, now_ms: int) -> BudgetState:
        """A run that starts at ``now_ms`` and has spent nothing."""
        return cls(0, 0, 0, _frozen({}), _frozen({}), now_ms)

    def to_json(self) -> dict[str, Any]:
        """A JSON form (for status output and for rebuilding the state on resume)."""
        return {
            "tool_calls": self.tool_calls,
            "model_turns": self.model_turns,
            "tokens": self.tokens,
            "per_server": dict(self.per_server),
            "per_tool": dict(self.per_tool),
            "started_ms": self.started_ms,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BudgetState:
        """The inverse of ``to_json`` (for a state kept outside the process)."""
        return cls(
            int(data["tool_calls"]),
            int(data["model_turns"]),
            int(data["tokens"]),
            _frozen({str(k): int(v) for k, v in dict(data["per_server"]).items()}),
            _frozen({str(k): int(v) for k, v in dict(data["per_tool"]).items()}),
            int(data["started_ms"]),
        )


@dataclass(frozen=True)
class Charged:
    """The step fits; ``state`` is the run's state with the step counted."""

    state: BudgetState


@dataclass(frozen=True)
class Exceeded:
    """The step does not fit. ``limit`` names the limit, ``detail`` says it with the numbers.

    ``state`` is set only by ``add_usage``: tokens already spent are counted even when they
    pass the limit, so the caller keeps the true total.
    """

    limit: LimitName
    detail: str
    state: BudgetState | None = None


def deadline_ms(contract: Contract, state: BudgetState) -> int:
    """The Unix millisecond at which the run's time is up."""
    return state.started_ms + duration_ms(contract.budget.deadline)


def time_left_s(contract: Contract, state: BudgetState, now_ms: int) -> float:
    """Seconds before the deadline (0.0 once it has passed)."""
    return max(0, deadline_ms(contract, state) - now_ms) / 1000.0


def _deadline_passed(contract: Contract, state: BudgetState, now_ms: int) -> Exceeded | None:
    end = deadline_ms(contract, state)
    if now_ms >= end:
        return Exceeded(
            "deadline",
            f"the run's deadline of {contract.budget.deadline} has passed ({now_ms - end} ms ago)",
        )
    return None


def _server_and_settings(contract: Contract, tool: str) -> tuple[Server | None, int | None, str | None]:
    """The tool's server, the tool's own budget_calls and call_timeout, when declared."""
    parts = split_namespaced(tool)
    if parts is None:
        return None, None, None
    server = contract.mcp.server(parts[0])
    if server is None:
        return None, None, None
    settings = server.tool_settings(parts[1])
    if settings is None:
        return server, None, None
    return server, settings.budget_calls, settings.call_timeout


def charge_call(state: BudgetState, contract: Contract, tool: str, now_ms: int) -> Charged | Exceeded:
    """Count one call of namespaced ``tool``, or say which limit refuses it.

    The Nth call of a limit N is charged; the N+1th is ``Exceeded``. A refused call is not
    counted anywhere.
    """
    passed = _deadline_passed(contract, state, now_ms)
    if passed is not None:
        return passed

    run_limit = contract.budget.max_tool_calls
    if state.tool_calls >= run_limit:
        return Exceeded("max_tool_calls", f"the run has made {state.tool_calls} of max_tool_calls {run_limit}")

    server, tool_limit, _ = _server_and_settings(contract, tool)
    server_name = server.name if server is not None else None
    if server is not None and server.budget_calls is not None:
        used = state.per_server.get(server.name, 0)
        if used >= server.budget_calls:
            return Exceeded(
                "server_budget_calls",
                f"server {server.name!r} has had {used} of its budget_calls {server.budget_calls}",
            )
    if tool_limit is not None:
        used = state.per_tool.get(tool, 0)
        if used >= tool_limit:
            return Exceeded("tool_budget_calls", f"{tool} has had {used} of its budget_calls {tool_limit}")

    per_server = dict(state.per_server)
    if server_name is not None:
        per_server[server_name] = per_server.get(server_name, 0) + 1
    per_tool = dict(state.per_tool)
    per_tool[tool] = per_tool.get(tool, 0) + 1
    # The constructor, not ``dataclasses.replace``: this runs for every call (replace costs more than the checks).
    return Charged(
        BudgetState(
            state.tool_calls + 1,
            state.model_turns,
            state.tokens,
            _frozen(per_server),
            _frozen(per_tool),
            state.started_ms,
        )
    )


def _turn_limit(contract: Contract) -> tuple[int, str]:
    if contract.agent.max_turns < contract.budget.max_model_turns:
        return contract.agent.max_turns, "agent.max_turns"
    return contract.budget.max_model_turns, "budget.max_model_turns"


def charge_turn(state: BudgetState, contract: Contract, now_ms: int) -> Charged | Exceeded:
    """Count one model turn before it is requested, or say which limit refuses it."""
    passed = _deadline_passed(contract, state, now_ms)
    if passed is not None:
        return passed
    limit, setting = _turn_limit(contract)
    if state.model_turns >= limit:
        return Exceeded("max_model_turns", f"the run has had {state.model_turns} model turns of {setting} {limit}")
    max_tokens = contract.budget.max_tokens
    if max_tokens is not None and state.tokens >= max_tokens:
        return Exceeded("max_tokens", f"the run has used {state.tokens} tokens of max_tokens {max_tokens}")
    # The constructor, not ``dataclasses.replace`` (as in ``charge_call``): this runs for every turn.
    return Charged(
        BudgetState(
            state.tool_calls, state.model_turns + 1, state.tokens, state.per_server, state.per_tool, state.started_ms
        )
    )


def add_usage(state: BudgetState, contract: Contract, input_tokens: int, output_tokens: int) -> Charged | Exceeded:
    """Add a turn's token usage (as the provider reported it) after the turn.

    Usage is a fact, so it is always counted: ``Exceeded.state`` carries the new total when it
    passes ``max_tokens``. Reaching the limit exactly still fits. Negative or non-integer counts
    from a provider count as 0.
    """
    spent = _count(input_tokens) + _count(output_tokens)
    new = BudgetState(
        state.tool_calls, state.model_turns, state.tokens + spent, state.per_server, state.per_tool, state.started_ms
    )
    max_tokens = contract.budget.max_tokens
    if max_tokens is not None and new.tokens > max_tokens:
        return Exceeded("max_tokens", f"the run has used {new.tokens} tokens of max_tokens {max_tokens}", new)
    return Charged(new)


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return 0
    return value


def call_timeout_s(contract: Contract, tool: str, state: BudgetState, now_ms: int) -> float:
    """The effective timeout of a call: the smallest of the run's, the server's and the tool's
    ``call_timeout`` and the time left before the deadline (0.0 once it has passed)."""
    return min(configured_timeout_s(contract, tool), time_left_s(contract, state, now_ms))


def configured_timeout_s(contract: Contract, tool: str) -> float:
    """The smallest of the run's, the server's and the tool's ``call_timeout``: what the contract
    says, before the deadline's time left (a gate computes it once per tool)."""
    candidates = [duration_ms(contract.budget.call_timeout)]
    server, _, tool_timeout = _server_and_settings(contract, tool)
    if server is not None and server.call_timeout is not None:
        candidates.append(duration_ms(server.call_timeout))
    if tool_timeout is not None:
        candidates.append(duration_ms(tool_timeout))
    return min(candidates) / 1000.0


def result_too_large(contract: Contract, size: int) -> bool:
    """True when a result of ``size`` bytes is over ``max_result_bytes`` (exactly the limit fits)."""
    return size > contract.budget.max_result_bytes


def remaining(contract: Contract, state: BudgetState, now_ms: int) -> dict[str, Any]:
    """What is left of the budget, as shown to the model (JSON, integers only).

    ``tool_calls``, ``model_turns``, ``seconds`` (whole seconds, rounded down), ``tokens`` (only
    when ``max_tokens`` is set), ``servers`` (servers with ``budget_calls``) and ``tools``
    (tools with ``budget_calls``, by namespaced name). Never negative.
    """
    turn_limit, _ = _turn_limit(contract)
    out: dict[str, Any] = {
        "tool_calls": max(0, contract.budget.max_tool_calls - state.tool_calls),
        "model_turns": max(0, turn_limit - state.model_turns),
        "seconds": math.floor(time_left_s(contract, state, now_ms)),
    }
    if contract.budget.max_tokens is not None:
        out["tokens"] = max(0, contract.budget.max_tokens - state.tokens)
    servers: dict[str, int] = {}
    tools: dict[str, int] = {}
    for server in contract.mcp.servers:
        if server.budget_calls is not None:
            servers[server.name] = max(0, server.budget_calls - state.per_server.get(server.name, 0))
        for settings in server.tools:
            if settings.budget_calls is not None:
                name = namespaced(server.name, settings.name)
                tools[name] = max(0, settings.budget_calls - state.per_tool.get(name, 0))
    if servers:
        out["servers"] = servers
    if tools:
        out["tools"] = tools
    return out
