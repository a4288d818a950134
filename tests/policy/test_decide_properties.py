"""Properties of ``policy.decide`` over generated policies, mount sets and untrusted arguments."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from hypothesis import given, settings
from hypothesis import strategies as st

from truss.contract import Contract
from truss.policy import Allow, Ask, Deny, decide
from truss.tools import MountedTool

from ._support import contract_of, mounted_tool

SERVERS: list[dict[str, Any]] = [
    {"name": "fs", "command": "fs-server", "allow_tools": ["read", "write", "list"]},
    {"name": "git", "command": "git-server", "allow_tools": ["git_status", "git_log"]},
]
TOOLS = ["mcp:fs:read", "mcp:fs:write", "mcp:fs:list", "mcp:git:git_status", "mcp:git:git_log"]
ARG_NAMES = ["path", "n", "mode"]
CANARY = "CANARY-7f3e9a"

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=30)
    | st.sampled_from(["/srv/work/a.txt", "/srv/work/../etc", "a", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaac", "12"])
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)
pool = st.sampled_from(["a", "main", 1, 2.5, True, False, "/srv/work/a.txt"])

condition = st.fixed_dictionaries(
    {},
    optional={
        "equals": pool,
        "in": st.lists(pool, min_size=1, max_size=3),  # an empty list is refused at load
        "glob": st.sampled_from(["*", "/srv/*", "/srv/work/**", "a*", "*.txt", "[ab]*"]),
        "not_glob": st.sampled_from(["*", "/srv/work/**", "*.txt"]),
        "regex": st.sampled_from(["a.*", "(a+)+b", "[a-z]+", "main|dev", r"\d+", ".*a.*a.*b"]),
        "max_len": st.integers(min_value=0, max_value=10),
        "min": st.integers(min_value=-5, max_value=5) | st.floats(min_value=-5, max_value=5),
        "max": st.integers(min_value=-5, max_value=5),
    },
).filter(lambda c: bool(c) and _bounds_in_order(c))


def _bounds_in_order(condition: Mapping[str, Any]) -> bool:
    """A min above the max is refused at load, so such a condition never reaches ``decide``."""
    low, high = condition.get("min"), condition.get("max")
    return not (isinstance(low, int | float) and isinstance(high, int | float) and low > high)


rule = st.fixed_dictionaries(
    {
        "tool": st.sampled_from(["*", "mcp:fs:*", "mcp:fs:read", "mcp:git:*", "mcp:*:write*", "mcp:fs:[rw]*"]),
        "effect": st.sampled_from(["allow", "deny", "ask"]),
    },
    optional={"args": st.dictionaries(st.sampled_from(ARG_NAMES), condition, max_size=2)},
)

policy = st.fixed_dictionaries(
    {"default": st.sampled_from(["allow", "deny"]), "rules": st.lists(rule, max_size=5)},
    optional={"readonly_only": st.booleans()},
)

hints = st.none() | st.fixed_dictionaries({}, optional={"readOnlyHint": json_scalars, "destructiveHint": st.booleans()})


@st.composite
def mount_sets(draw: st.DrawFn) -> dict[str, MountedTool]:
    chosen = draw(st.lists(st.sampled_from(TOOLS), unique=True))
    tools: list[MountedTool] = []
    for name in chosen:
        _, server, tool = name.split(":")
        tools.append(mounted_tool(server, tool, draw(hints)))
    return {t.name: t for t in tools}


arguments = st.dictionaries(st.sampled_from([*ARG_NAMES, "other"]) | st.text(max_size=6), json_values, max_size=4)
tool_names = st.sampled_from([*TOOLS, "mcp:evil:read", "read", ""]) | st.text(max_size=20)


def _contract(p: dict[str, Any]) -> Contract:
    return contract_of(p, SERVERS)


@settings(max_examples=100, deadline=None)
@given(policy, mount_sets(), tool_names, arguments)
def test_a_tool_outside_the_mount_set_is_never_allowed(
    p: dict[str, Any], mounted: dict[str, MountedTool], tool: str, args: dict[str, Any]
) -> None:
    decision = decide(_contract(p), tool, args, mounted)
    if tool not in mounted:
        assert isinstance(decision, Deny)
        assert (decision.code, decision.rule) == ("not_mounted", None)
    if isinstance(decision, Allow | Ask):
        assert tool in mounted


@settings(max_examples=100, deadline=None)
@given(policy, tool_names, arguments)
def test_an_empty_mount_set_allows_nothing(p: dict[str, Any], tool: str, args: dict[str, Any]) -> None:
    decision = decide(_contract(p), tool, args, {})
    assert isinstance(decision, Deny)
    assert decision.code == "not_mounted"


@settings(max_examples=100, deadline=None)
@given(policy, mount_sets(), st.sampled_from(TOOLS), arguments)
def test_an_unconditional_ask_rule_in_front_never_turns_into_allow(
    p: dict[str, Any], mounted: dict[str, MountedTool], tool: str, args: dict[str, Any]
) -> None:
    asking = {**p, "rules": [{"tool": tool, "effect": "ask"}, *p["rules"]]}
    decision = decide(_contract(asking), tool, args, mounted)
    assert not isinstance(decision, Allow)
    if isinstance(decision, Ask):
        assert decision.rule == 0


@settings(max_examples=100, deadline=None)
@given(policy, mount_sets(), st.sampled_from(TOOLS), arguments, condition)
def test_an_ask_rule_testing_an_absent_argument_never_turns_into_allow(
    p: dict[str, Any], mounted: dict[str, MountedTool], tool: str, args: dict[str, Any], cond: dict[str, Any]
) -> None:
    asking = {**p, "rules": [{"tool": "*", "effect": "ask", "args": {"absent_arg": cond}}, *p["rules"]]}
    decision = decide(_contract(asking), tool, args, mounted)
    assert not isinstance(decision, Allow)


@settings(max_examples=100, deadline=None)
@given(policy, mount_sets(), st.sampled_from(TOOLS), arguments)
def test_readonly_only_never_allows_a_tool_without_a_true_read_only_hint(
    p: dict[str, Any], mounted: dict[str, MountedTool], tool: str, args: dict[str, Any]
) -> None:
    decision = decide(_contract({**p, "readonly_only": True}), tool, args, mounted)
    if isinstance(decision, Allow | Ask):
        assert mounted[tool].annotations.get("readOnlyHint") is True


@settings(max_examples=200, deadline=None)
@given(policy, mount_sets(), tool_names, json_values | arguments)
def test_arbitrary_json_arguments_never_raise_and_decide_the_same_twice(
    p: dict[str, Any], mounted: dict[str, MountedTool], tool: str, args: Any
) -> None:
    contract = _contract(p)
    first = decide(contract, tool, args, mounted)
    assert isinstance(first, Allow | Deny | Ask)
    assert decide(contract, tool, args, mounted) == first


@settings(max_examples=100, deadline=None)
@given(policy, mount_sets(), st.sampled_from(TOOLS), st.dictionaries(st.sampled_from(ARG_NAMES), json_values))
def test_a_reason_never_repeats_an_argument_value(
    p: dict[str, Any], mounted: dict[str, MountedTool], tool: str, args: dict[str, Any]
) -> None:
    planted = {name: f"{CANARY}/{value!r}" for name, value in args.items()}
    decision = decide(_contract(p), tool, planted, mounted)
    if isinstance(decision, Deny | Ask):
        assert CANARY not in decision.reason


def test_a_tool_name_that_is_not_a_string_is_denied_not_raised() -> None:
    contract = _contract({"default": "allow"})
    mounted = {"mcp:fs:read": mounted_tool("fs", "read")}
    for odd in (None, 7, ["mcp:fs:read"], b"mcp:fs:read"):
        decision = decide(contract, cast(Any, odd), {}, mounted)
        assert isinstance(decision, Deny)
        assert decision.code == "not_mounted"
