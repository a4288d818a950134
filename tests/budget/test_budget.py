"""Budget accounting: every limit at its boundary, which limit is reported, what the model sees."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from truss.budget import (
    BudgetState,
    Charged,
    Exceeded,
    add_usage,
    call_timeout_s,
    charge_call,
    charge_turn,
    deadline_ms,
    remaining,
    result_too_large,
    time_left_s,
)
from truss.contract import Contract

T0 = 1_700_000_000_000
GIT: dict[str, Any] = {"name": "git", "command": "git-server", "allow_tools": ["status", "log", "diff"]}
FS: dict[str, Any] = {"name": "fs", "command": "fs-server", "allow_tools": ["read"]}


def contract(
    budget: dict[str, Any] | None = None, servers: list[dict[str, Any]] | None = None, **agent: Any
) -> Contract:
    return Contract.model_validate(
        {
            "contract": {"name": "b", "intent": "test"},
            "budget": budget or {},
            "agent": agent,
            "mcp": {"servers": servers if servers is not None else [GIT, FS]},
        }
    )


def charge_n(c: Contract, tool: str, n: int, state: BudgetState | None = None, now: int = T0) -> BudgetState:
    state = state or BudgetState.start(T0)
    for _ in range(n):
        result = charge_call(state, c, tool, now)
        assert isinstance(result, Charged), result
        state = result.state
    return state


def exceeded(result: Charged | Exceeded) -> str:
    assert isinstance(result, Exceeded), result
    return result.limit


@pytest.mark.parametrize("limit", [0, 1, 3])
def test_the_nth_call_fits_max_tool_calls_and_the_next_is_exceeded(limit: int) -> None:
    c = contract({"max_tool_calls": limit})
    state = charge_n(c, "mcp:git:status", limit)
    assert state.tool_calls == limit
    assert exceeded(charge_call(state, c, "mcp:fs:read", T0)) == "max_tool_calls"


def test_a_server_budget_counts_every_tool_of_that_server() -> None:
    c = contract(servers=[{**GIT, "budget_calls": 3}, FS])
    state = charge_n(c, "mcp:git:status", 2)
    state = charge_n(c, "mcp:git:log", 1, state)
    assert exceeded(charge_call(state, c, "mcp:git:diff", T0)) == "server_budget_calls"
    assert isinstance(charge_call(state, c, "mcp:fs:read", T0), Charged)


def test_a_tool_budget_stops_that_tool_only() -> None:
    c = contract(servers=[{**GIT, "tools": [{"name": "log", "budget_calls": 2}]}, FS])
    state = charge_n(c, "mcp:git:log", 2)
    assert exceeded(charge_call(state, c, "mcp:git:log", T0)) == "tool_budget_calls"
    assert isinstance(charge_call(state, c, "mcp:git:status", T0), Charged)


def test_a_zero_tool_budget_refuses_the_first_call() -> None:
    c = contract(servers=[{**GIT, "budget_calls": 0}, FS])
    assert exceeded(charge_call(BudgetState.start(T0), c, "mcp:git:status", T0)) == "server_budget_calls"


def test_when_limits_run_out_together_the_broadest_is_reported() -> None:
    c = contract(
        {"max_tool_calls": 2, "deadline": "10s"},
        servers=[{**GIT, "budget_calls": 2, "tools": [{"name": "log", "budget_calls": 2}]}, FS],
    )
    state = charge_n(c, "mcp:git:log", 2)
    assert exceeded(charge_call(state, c, "mcp:git:log", T0)) == "max_tool_calls"
    assert exceeded(charge_call(state, c, "mcp:git:log", T0 + 10_000)) == "deadline"

    roomy = contract(
        {"max_tool_calls": 10},
        servers=[{**GIT, "budget_calls": 2, "tools": [{"name": "log", "budget_calls": 2}]}, FS],
    )
    state = charge_n(roomy, "mcp:git:log", 2)
    assert exceeded(charge_call(state, roomy, "mcp:git:log", T0)) == "server_budget_calls"


def test_a_refused_call_is_counted_nowhere() -> None:
    c = contract({"max_tool_calls": 5}, servers=[{**GIT, "tools": [{"name": "log", "budget_calls": 1}]}, FS])
    state = charge_n(c, "mcp:git:log", 1)
    assert exceeded(charge_call(state, c, "mcp:git:log", T0)) == "tool_budget_calls"
    assert (state.tool_calls, dict(state.per_server), dict(state.per_tool)) == (1, {"git": 1}, {"mcp:git:log": 1})
    state = charge_n(c, "mcp:git:status", 4, state)
    assert exceeded(charge_call(state, c, "mcp:fs:read", T0)) == "max_tool_calls"


def test_the_deadline_is_up_at_its_exact_millisecond() -> None:
    c = contract({"deadline": "10s"})
    state = BudgetState.start(T0)
    assert deadline_ms(c, state) == T0 + 10_000
    assert isinstance(charge_call(state, c, "mcp:git:status", T0 + 9_999), Charged)
    assert exceeded(charge_call(state, c, "mcp:git:status", T0 + 10_000)) == "deadline"
    assert isinstance(charge_turn(state, c, T0 + 9_999), Charged)
    assert exceeded(charge_turn(state, c, T0 + 10_000)) == "deadline"
    assert time_left_s(c, state, T0 + 9_999) == pytest.approx(0.001)
    assert time_left_s(c, state, T0 + 10_000) == 0.0
    assert time_left_s(c, state, T0 + 99_000) == 0.0


@pytest.mark.parametrize(("budget_turns", "agent_turns", "expected"), [(3, 20, 3), (20, 2, 2), (1, 1, 1)])
def test_the_nth_model_turn_fits_and_the_next_is_exceeded(budget_turns: int, agent_turns: int, expected: int) -> None:
    c = contract({"max_model_turns": budget_turns}, max_turns=agent_turns)
    state = BudgetState.start(T0)
    for _ in range(expected):
        result = charge_turn(state, c, T0)
        assert isinstance(result, Charged)
        state = result.state
    assert exceeded(charge_turn(state, c, T0)) == "max_model_turns"


def test_tokens_may_reach_max_tokens_exactly_and_passing_it_is_counted_and_exceeded() -> None:
    c = contract({"max_tokens": 100})
    result = add_usage(BudgetState.start(T0), c, 60, 40)
    assert isinstance(result, Charged)
    assert result.state.tokens == 100
    over = add_usage(result.state, c, 1, 0)
    assert isinstance(over, Exceeded)
    assert over.limit == "max_tokens"
    assert over.state is not None
    assert over.state.tokens == 101


def test_a_turn_is_refused_once_the_tokens_are_spent() -> None:
    c = contract({"max_tokens": 100})
    almost = add_usage(BudgetState.start(T0), c, 99, 0)
    assert isinstance(almost, Charged)
    assert isinstance(charge_turn(almost.state, c, T0), Charged)
    spent = add_usage(almost.state, c, 0, 1)
    assert isinstance(spent, Charged)
    assert exceeded(charge_turn(spent.state, c, T0)) == "max_tokens"


def test_without_max_tokens_usage_is_counted_but_never_exceeded() -> None:
    c = contract()
    result = add_usage(BudgetState.start(T0), c, 10**9, 10**9)
    assert isinstance(result, Charged)
    assert result.state.tokens == 2 * 10**9


@pytest.mark.parametrize("odd", [-5, True, 1.5, "7", None])
def test_usage_a_provider_misreports_counts_as_zero(odd: Any) -> None:
    result = add_usage(BudgetState.start(T0), contract({"max_tokens": 10}), odd, 3)
    assert isinstance(result, Charged)
    assert result.state.tokens == 3


def test_the_call_timeout_is_the_smallest_setting_and_never_outlives_the_deadline() -> None:
    c = contract(
        {"call_timeout": "60s", "deadline": "10m"},
        servers=[{**GIT, "call_timeout": "20s", "tools": [{"name": "log", "call_timeout": "5s"}]}, FS],
    )
    state = BudgetState.start(T0)
    assert call_timeout_s(c, "mcp:fs:read", state, T0) == 60.0
    assert call_timeout_s(c, "mcp:git:status", state, T0) == 20.0
    assert call_timeout_s(c, "mcp:git:log", state, T0) == 5.0
    assert call_timeout_s(c, "mcp:git:status", state, T0 + 600_000 - 1_500) == 1.5
    assert call_timeout_s(c, "mcp:git:status", state, T0 + 600_000) == 0.0


def test_a_server_can_not_raise_the_call_timeout() -> None:
    c = contract({"call_timeout": "10s"}, servers=[{**GIT, "call_timeout": "5m"}, FS])
    assert call_timeout_s(c, "mcp:git:status", BudgetState.start(T0), T0) == 10.0


def test_a_result_of_exactly_max_result_bytes_fits() -> None:
    c = contract({"max_result_bytes": 1000})
    assert not result_too_large(c, 1000)
    assert result_too_large(c, 1001)


def test_remaining_shows_what_is_left_of_every_limit_in_whole_numbers() -> None:
    c = contract(
        {"max_tool_calls": 5, "max_model_turns": 4, "max_tokens": 1000, "deadline": "1m"},
        servers=[{**GIT, "budget_calls": 3, "tools": [{"name": "log", "budget_calls": 1}]}, FS],
    )
    state = charge_n(c, "mcp:git:log", 1)
    turn = charge_turn(state, c, T0)
    assert isinstance(turn, Charged)
    used = add_usage(turn.state, c, 300, 100)
    assert isinstance(used, Charged)
    assert remaining(c, used.state, T0 + 20_500) == {
        "tool_calls": 4,
        "model_turns": 3,
        "seconds": 39,
        "tokens": 600,
        "servers": {"git": 2},
        "tools": {"mcp:git:log": 0},
    }


def test_remaining_leaves_out_limits_that_are_not_set_and_never_goes_negative() -> None:
    c = contract({"max_tool_calls": 1, "deadline": "1s"})
    state = charge_n(c, "mcp:fs:read", 1)
    assert remaining(c, state, T0 + 5_000) == {"tool_calls": 0, "model_turns": 20, "seconds": 0}


def test_a_state_survives_its_json_form() -> None:
    c = contract(servers=[{**GIT, "budget_calls": 3}, FS])
    state = charge_n(c, "mcp:git:log", 2)
    assert BudgetState.from_json(state.to_json()) == state


tools = st.sampled_from(["mcp:git:status", "mcp:git:log", "mcp:git:diff", "mcp:fs:read"])


@settings(max_examples=100, deadline=None)
@given(
    st.lists(tools, max_size=40),
    st.integers(min_value=0, max_value=12),
    st.integers(min_value=0, max_value=8),
    st.integers(min_value=0, max_value=4),
)
def test_no_sequence_of_calls_spends_more_than_any_limit(
    calls: list[str], run_limit: int, server_limit: int, tool_limit: int
) -> None:
    c = contract(
        {"max_tool_calls": run_limit},
        servers=[{**GIT, "budget_calls": server_limit, "tools": [{"name": "log", "budget_calls": tool_limit}]}, FS],
    )
    state = BudgetState.start(T0)
    charged = 0
    for tool in calls:
        result = charge_call(state, c, tool, T0)
        if isinstance(result, Charged):
            state = result.state
            charged += 1
    assert state.tool_calls == charged <= run_limit
    assert state.per_server.get("git", 0) <= server_limit
    assert state.per_tool.get("mcp:git:log", 0) <= tool_limit
    assert sum(state.per_tool.values()) == charged


@pytest.mark.anyio
async def test_twenty_concurrent_charges_under_one_lock_spend_exactly_a_budget_of_ten() -> None:
    c = contract({"max_tool_calls": 10})
    box = [BudgetState.start(T0)]
    lock = anyio.Lock()
    outcomes: list[str] = []

    async def one_call() -> None:
        async with lock:
            result = charge_call(box[0], c, "mcp:git:status", T0)
            if isinstance(result, Charged):
                box[0] = result.state
        outcomes.append("charged" if isinstance(result, Charged) else result.limit)
        await anyio.lowlevel.checkpoint()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            for _ in range(20):
                tg.start_soon(one_call)
    assert outcomes.count("charged") == 10
    assert outcomes.count("max_tool_calls") == 10
    assert box[0].tool_calls == 10
