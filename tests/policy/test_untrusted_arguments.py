"""Arguments built to hurt the gate: huge strings, deep nesting, patterns that backtrack."""

from __future__ import annotations

from typing import Any

import pytest

from truss.policy import MAX_MATCH_CHARS, Allow, Deny, decide, json_equal, regex_profile

from ._support import contract_of, mount_all

SERVERS: list[dict[str, Any]] = [{"name": "t", "command": "t-server", "allow_tools": ["echo"]}]


def _decide(rules: list[dict[str, Any]], arguments: Any, default: str = "allow") -> Any:
    contract = contract_of({"default": default, "rules": rules}, SERVERS)
    return decide(contract, "mcp:t:echo", arguments, mount_all(contract))


@pytest.mark.parametrize("effect", ["allow", "deny", "ask"])
def test_an_argument_longer_than_the_match_limit_is_denied_whatever_the_rule_effect(effect: str) -> None:
    huge = "a" * (MAX_MATCH_CHARS + 1)
    decision = _decide([{"tool": "*", "effect": effect, "args": {"s": {"glob": "a*"}}}], {"s": huge})
    assert isinstance(decision, Deny)
    assert (decision.code, decision.rule) == ("bad_arguments", 0)


def test_an_argument_exactly_at_the_match_limit_is_matched() -> None:
    at_limit = "a" * MAX_MATCH_CHARS
    assert _decide([{"tool": "*", "effect": "allow", "args": {"s": {"glob": "a*"}}}], {"s": at_limit}, "deny") == Allow(
        0
    )


def test_a_pattern_with_three_free_repetitions_is_only_run_on_short_arguments() -> None:
    pattern = ".*a.*a.*b"
    limit = regex_profile(pattern).max_chars
    assert limit < 1000
    rules = [{"tool": "*", "effect": "allow", "args": {"s": {"regex": pattern}}}]
    assert _decide(rules, {"s": "a" * (limit - 1) + "b"}, "deny") == Allow(0)
    decision = _decide(rules, {"s": "a" * (limit + 1)}, "deny")
    assert isinstance(decision, Deny)
    assert (decision.code, decision.rule) == ("bad_arguments", 0)


def test_a_long_argument_only_compared_for_equality_is_not_refused() -> None:
    huge = "a" * (MAX_MATCH_CHARS * 4)
    rules = [{"tool": "*", "effect": "deny", "args": {"s": {"equals": "x", "max_len": 10}}}]
    assert _decide(rules, {"s": huge}) == Allow(None)


def test_deeply_nested_arguments_compare_unequal_instead_of_overflowing_the_stack() -> None:
    deep: Any = "x"
    for _ in range(100_000):
        deep = [deep]
    rules = [{"tool": "*", "effect": "allow", "args": {"v": {"equals": [["x"]], "in": [1, 2]}}}]
    decision = _decide(rules, {"v": deep}, "deny")
    assert isinstance(decision, Deny)
    assert decision.code == "default"


@pytest.mark.parametrize(
    ("pattern", "nested"),
    [
        ("(a+)+b", True),
        ("(a|aa)*", True),
        ("(?:x{1,3})*", True),
        ("((ab)*c)*", True),
        ("(?:[a-z]+/)*[a-z]+", True),
        ("(?>[a-z]+/)*[a-z]+", False),
        ("(?:[a-z]+/)*+[a-z]+", False),
        ("(?:x{3})*", False),
        ("[(]+x*", False),
        (r"\(a+\)+", False),
        ("git (status|log)( --oneline)?", False),
        ("a{}+", False),
    ],
)
def test_regex_profile_flags_nested_repetition(pattern: str, nested: bool) -> None:
    assert regex_profile(pattern).nested is nested


@pytest.mark.parametrize(
    ("pattern", "quantifiers"),
    [
        ("abc", 0),
        ("a*", 1),
        (r"\d+\.\d+", 2),
        (".*a.*a.*b", 3),
        ("a{2,}b{,}", 2),
        ("a{2,5}", 0),
        ("a*+b++", 0),
        (r"(.*)\1", 2),
        ("(?P<x>a*)(?P=x)", 2),
    ],
)
def test_regex_profile_counts_repetitions_that_can_backtrack(pattern: str, quantifiers: int) -> None:
    assert regex_profile(pattern).quantifiers == quantifiers


@pytest.mark.parametrize(
    ("a", "b", "equal"),
    [
        (1, 1.0, True),
        (True, 1, False),
        (False, 0, False),
        (None, None, True),
        (None, False, False),
        ("1", 1, False),
        ([1, [2]], [1.0, [2]], True),
        ([1, 2], [2, 1], False),
        ({"a": 1}, {"a": 1, "b": None}, False),
        ({"a": [True]}, {"a": [True]}, True),
    ],
)
def test_json_equal_follows_json_not_python(a: Any, b: Any, equal: bool) -> None:
    assert json_equal(a, b) is equal
    assert json_equal(b, a) is equal


def test_json_equal_gives_up_on_two_equally_deep_values_instead_of_overflowing_the_stack() -> None:
    left: Any = 0
    right: Any = 0
    for _ in range(5_000):
        left, right = [left], [right]
    assert json_equal(left, right) is False


def test_a_mount_set_entry_filed_under_another_tools_name_is_not_mounted() -> None:
    contract = contract_of(
        {"default": "allow"}, [{"name": "t", "command": "t-server", "allow_tools": ["echo", "delete"]}]
    )
    forged = {"mcp:t:echo": mount_all(contract)["mcp:t:delete"]}
    decision = decide(contract, "mcp:t:echo", {}, forged)
    assert isinstance(decision, Deny)
    assert decision.code == "not_mounted"


def test_a_long_argument_does_not_deny_through_a_rule_whose_other_condition_fails() -> None:
    huge = "a" * (MAX_MATCH_CHARS + 1)
    rules = [{"tool": "*", "effect": "allow", "args": {"s": {"glob": "a*"}, "mode": {"equals": "fast"}}}]
    assert _decide(rules, {"s": huge, "mode": "slow"}) == Allow(None)
    decision = _decide(rules, {"s": huge, "mode": "fast"})
    assert isinstance(decision, Deny)
    assert (decision.code, decision.rule) == ("bad_arguments", 0)
